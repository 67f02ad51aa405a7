#include "kv/select/pq_selector.h"

#include <algorithm>
#include <cmath>
#include <future>

#include "backend/cpu/vec_ops.h"
#include "kv/select/pq_codebook.h"
#include "util/thread_pool.h"

namespace slimkv {

// Cost-model coefficients of kmeans_iteration_cap, fitted on this machine (2 cores, shared) by
// `bench_pq_decode --model models/slimkv-llama-14m --fit`, bundled model, m=2, b=6.
constexpr double kCostAlpha1 = 2.468e-02, kCostBeta1 = 1.644e-10;
constexpr double kCostAlpha2 = -1.041e-02, kCostBeta2 = 8.470e-05, kCostGamma2 = 6.101e-08;

std::string PqOptions::describe() const {
  return str_cat("pq:m=", m, ",b=", bits, ",", window.describe(), ",iters=",
                 max_iters ? std::to_string(max_iters) : std::string("auto"), ",cache=", cache_tokens,
                 ",policy=", policy, overlap ? "" : ",overlap=off");
}

namespace {

uint64_t mix(uint64_t seed, int layer, int head) {
  return seed ^ (uint64_t(layer + 1) << 40) ^ (uint64_t(head + 1) << 20) ^ 0x5851f42d4c957f2dull;
}

// One (layer, KV head): the codebook and the codes of its first sealed tokens.
struct PqHead {
  PqCodebook codebook{0, 1, 1};
  std::vector<uint8_t> codes;
};

// What one clustering run produces for a head: the codebook and the codes of the tokens it saw.
struct TrainedHead {
  PqCodebook codebook{0, 1, 1};
  std::vector<uint8_t> codes;
};

struct PqLayer {
  std::vector<PqHead> heads;
  int trained_on = 0;  // sealed tokens the current codebooks were trained on
  std::future<std::vector<TrainedHead>> training;
  int training_on = 0;
};

class PqSelector final : public TopkSelector {
 public:
  PqSelector(const PqOptions& options, int num_layers, int num_kv_heads, int k_dim, int block_tokens, uint64_t seed)
      : TopkSelector(options.window, num_layers, num_kv_heads, k_dim, block_tokens),
        options_(options),
        seed_(seed),
        layers_(size_t(num_layers)) {
    for (PqLayer& layer : layers_) layer.heads.resize(size_t(num_kv_heads));
  }
  ~PqSelector() override { clear(); }

  void on_prefill(int layer_index) override {
    PqLayer& layer = layers_[size_t(layer_index)];
    if (!options_.overlap) return;
    // A chunked prompt: the previous chunk's clustering has had this chunk's forward pass to finish.
    if (layer.training.valid()) adopt(layer, layer.training.get(), layer.training_on);
    if (!wants_training(layer_index)) return;
    // Snapshot the keys: appends to this layer go on while the job runs.
    const int n = sealed_tokens(layer_index);
    std::vector<std::vector<float>> keys;
    for (int g = 0; g < num_kv_heads(); ++g) keys.push_back(this->keys(layer_index, g));
    layer.training_on = n;
    layer.training = std::async(std::launch::async, [this, layer_index, n, keys = std::move(keys)] {
      std::vector<TrainedHead> trained;
      for (int g = 0; g < int(keys.size()); ++g) trained.push_back(train(layer_index, g, keys[size_t(g)].data(), n));
      return trained;
    });
  }

  void clear() override {
    TopkSelector::clear();
    for (PqLayer& layer : layers_) {
      if (layer.training.valid()) layer.training.wait();
      layer = PqLayer{};
      layer.heads.resize(size_t(num_kv_heads()));
    }
  }

 protected:
  bool prepare(int layer_index, int scored_tokens, ThreadPool& pool) override {
    PqLayer& layer = layers_[size_t(layer_index)];
    if (layer.training.valid()) adopt(layer, layer.training.get(), layer.training_on);
    if (wants_training(layer_index)) {  // no prefill to overlap with (tokens came one by one): cluster now
      const int n = sealed_tokens(layer_index);
      std::vector<TrainedHead> trained(layer.heads.size());
      pool.run(int64_t(trained.size()), [&](int64_t g, int) {
        trained[size_t(g)] = train(layer_index, int(g), keys(layer_index, int(g)).data(), n);
      });
      adopt(layer, std::move(trained), n);
    }
    if (layer.trained_on == 0) return false;
    for (int g = 0; g < num_kv_heads(); ++g) {  // tokens sealed since: codes of their nearest centroids
      PqHead& head = layer.heads[size_t(g)];
      const int coded = int(head.codes.size()) / options_.m;
      if (coded >= scored_tokens) continue;
      head.codes.resize(size_t(scored_tokens) * options_.m);
      head.codebook.encode(keys(layer_index, g).data() + size_t(coded) * k_dim(), scored_tokens - coded,
                           head.codes.data() + size_t(coded) * options_.m);
    }
    return true;
  }

  void score(int layer, int head_index, const float* q, int first, int last, float* scores) const override {
    const PqHead& head = layers_[size_t(layer)].heads[size_t(head_index)];
    thread_local std::vector<float> table;
    table.resize(size_t(options_.m) << options_.bits);
    head.codebook.score_table(q, table.data());
    head.codebook.score_codes(table.data(), head.codes.data() + size_t(first) * options_.m, last - first, scores);
  }

 private:
  bool wants_training(int layer) const {
    const int n = sealed_tokens(layer);
    const int min_tokens = 4 << options_.bits;  // a few points per centroid
    return n >= min_tokens && n >= 2 * layers_[size_t(layer)].trained_on;
  }

  TrainedHead train(int layer, int head, const float* keys, int n) const {
    TrainedHead trained{PqCodebook(k_dim(), options_.m, options_.bits), {}};
    const int iters = options_.max_iters ? options_.max_iters
                                         : kmeans_iteration_cap(n, num_kv_heads(), options_.m, options_.bits,
                                                                k_dim() / options_.m);
    trained.codebook.train(keys, n, iters, mix(seed_, layer, head));
    trained.codes.resize(size_t(n) * options_.m);
    trained.codebook.encode(keys, n, trained.codes.data());
    return trained;
  }

  static void adopt(PqLayer& layer, std::vector<TrainedHead> trained, int n) {
    for (size_t g = 0; g < trained.size(); ++g) {
      layer.heads[g].codebook = std::move(trained[g].codebook);
      layer.heads[g].codes = std::move(trained[g].codes);
    }
    layer.trained_on = n;
  }

  PqOptions options_;
  uint64_t seed_;
  std::vector<PqLayer> layers_;
};

// The upper bound: exact scores q·k of every middle token from the FP32 keys.
class OracleSelector final : public TopkSelector {
 public:
  using TopkSelector::TopkSelector;

 protected:
  bool prepare(int, int, ThreadPool&) override { return true; }
  void score(int layer, int head, const float* q, int first, int last, float* scores) const override {
    const float* k = keys(layer, head).data();
    for (int t = first; t < last; ++t) scores[t - first] = dot(q, k + size_t(t) * k_dim(), size_t(k_dim()));
  }
};

class PqSelectorFactory final : public SelectorFactory {
 public:
  explicit PqSelectorFactory(const PqOptions& options) : options_(options) {}
  std::string describe() const override { return options_.describe(); }
  Status check_shape(int k_dim) const override {
    if (k_dim % options_.m == 0) return Status::ok();
    return error("pq: m=", options_.m, " sub-spaces do not divide the ", k_dim, " key dims");
  }
  std::unique_ptr<Selector> make(int num_layers, int num_kv_heads, int k_dim, int block_tokens,
                                 uint64_t seed) const override {
    return std::make_unique<PqSelector>(options_, num_layers, num_kv_heads, k_dim, block_tokens, seed);
  }

 private:
  PqOptions options_;
};

class OracleSelectorFactory final : public SelectorFactory {
 public:
  explicit OracleSelectorFactory(const TopkWindow& window) : window_(window) {}
  std::string describe() const override { return "oracle:" + window_.describe(); }
  std::unique_ptr<Selector> make(int num_layers, int num_kv_heads, int k_dim, int block_tokens,
                                 uint64_t) const override {
    return std::make_unique<OracleSelector>(window_, num_layers, num_kv_heads, k_dim, block_tokens);
  }

 private:
  TopkWindow window_;
};

}  // namespace

int kmeans_iteration_cap(int tokens, int num_kv_heads, int m, int bits, int sub_dim) {
  // Eq. 1: clustering one layer, T iterations = α1 + β1 · s·T·(h_kv · m · 2^b · d_m)   [seconds]
  // Eq. 2: one layer's prefill forward      = α2 + β2 · s + γ2 · s²
  // Eq. 3: T_max = (γ2 s² + β2 s + α2 − α1) / (β1 s · h_kv m 2^b d_m)
  constexpr double alpha1 = kCostAlpha1, beta1 = kCostBeta1;
  constexpr double alpha2 = kCostAlpha2, beta2 = kCostBeta2, gamma2 = kCostGamma2;
  const double s = tokens;
  const double work = s * double(num_kv_heads) * m * double(1 << bits) * sub_dim;
  const double t_max = (gamma2 * s * s + beta2 * s + alpha2 - alpha1) / (beta1 * work);
  return std::clamp(int(t_max), 2, 32);
}

std::shared_ptr<const SelectorFactory> make_pq_selector_factory(const PqOptions& options) {
  return std::make_shared<PqSelectorFactory>(options);
}

std::shared_ptr<const SelectorFactory> make_oracle_selector_factory(const TopkWindow& window) {
  return std::make_shared<OracleSelectorFactory>(window);
}

}  // namespace slimkv
