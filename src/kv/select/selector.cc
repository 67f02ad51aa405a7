#include "kv/select/selector.h"

#include "kv/select/pq_selector.h"
#include "kv/stage_options.h"
#include "kv/tier/offload_tier.h"

namespace slimkv {
namespace {

class AllSelector final : public Selector {
 public:
  void on_seal(int, int, const float*) override {}
  bool reads_sealed_keys() const override { return false; }
  void select(int, const float*, int, int, int, const SealedKeys&, ThreadPool&,
              std::vector<HeadSelection>& selection) override {
    for (HeadSelection& head : selection) head = {true, {}};
  }
  void clear() override {}
};

class AllSelectorFactory final : public SelectorFactory {
 public:
  std::string describe() const override { return "all"; }
  std::unique_ptr<Selector> make(int, int, int, int, uint64_t) const override {
    return std::make_unique<AllSelector>();
  }
};

}  // namespace

std::shared_ptr<const SelectorFactory> make_all_selector_factory() { return std::make_shared<AllSelectorFactory>(); }

bool is_selector_stage(const std::string& name) { return name == "all" || name == "pq" || name == "oracle"; }

std::shared_ptr<const SelectorFactory> make_selector_factory(const std::string& name, StageOptions& options,
                                                             OffloadConfig& cache) {
  if (name == "pq") {
    PqOptions pq;
    pq.m = options.integer("m", pq.m, {1, 2, 4, 8, 16, 32});
    pq.bits = options.integer("b", pq.bits, {}, 1, 8);
    pq.window = read_topk_window(options);
    pq.rerank = options.number("rerank", pq.rerank, 1.0, 100.0);
    const std::string iters = options.text("iters", "auto");
    pq.max_iters = iters == "auto" ? 0 : options.integer("iters", 0, {}, 1, 1000);
    pq.segment_tokens = options.integer("segment", pq.segment_tokens, {}, 1 << pq.bits);
    pq.cache_tokens = options.integer("cache", pq.cache_tokens, {});
    pq.policy = options.choice("policy", pq.policy, {"lru", "lfu"});
    pq.overlap = options.choice("overlap", "on", {"on", "off"}) == "on";
    pq.rows = options.choice("rows", pq.rows, {"auto", "on", "off"});
    cache.cache_tokens = pq.cache_tokens;
    cache.policy = pq.policy == "lfu" ? CachePolicy::kLfu : CachePolicy::kLru;
    return make_pq_selector_factory(pq);
  }
  if (name == "oracle") return make_oracle_selector_factory(read_topk_window(options));
  return make_all_selector_factory();
}

}  // namespace slimkv
