#include "kv/select/pq_selector.h"

#include <algorithm>
#include <cmath>
#include <future>

#include "backend/cpu/vec_ops.h"
#include "kv/select/pq_codebook.h"
#include "util/thread_pool.h"

namespace slimkv {

// Cost-model coefficients of kmeans_iteration_cap, fitted on this machine (2 cores, shared) by
// `bench_pq_decode --model models/slimkv-llama-15m --fit`, bundled model, m=2, b=6.
constexpr double kCostAlpha1 = 2.468e-02, kCostBeta1 = 1.644e-10;
constexpr double kCostAlpha2 = -1.041e-02, kCostBeta2 = 8.470e-05, kCostGamma2 = 6.101e-08;

std::string PqOptions::describe() const {
  return str_cat("pq:m=", m, ",b=", bits, ",", window.describe(), ",rerank=", rerank, ",iters=",
                 max_iters ? std::to_string(max_iters) : std::string("auto"), ",segment=", segment_tokens,
                 ",cache=", cache_tokens, ",policy=", policy, overlap ? "" : ",overlap=off",
                 rows == "auto" ? "" : ",rows=" + rows);
}

uint64_t pq_segment_seed(uint64_t seed, int layer, int head, int segment) {
  return seed ^ (uint64_t(layer + 1) << 40) ^ (uint64_t(head + 1) << 20) ^
         (uint64_t(segment + 1) * 0x9e3779b97f4a7c15ull) ^ 0x5851f42d4c957f2dull;
}

namespace {

// The tokens [s · segment, (s + 1) · segment) of one (layer, KV head) and the codebook trained on them.
struct PqSegment {
  PqCodebook codebook{0, 1, 1};
  int trained_on = 0;          // the segment's first tokens the codebook was trained on; 0: not trained yet
  int coded_with = -1;         // the segment whose codebook `codes` index (a segment not trained yet borrows)
  std::vector<uint8_t> codes;  // [tokens coded so far, m]
  // The segment's keys [sealed so far, k_dim], FP32 as sealed, kept only until it is clustered full:
  // then its codes are final and the keys are dropped (re-ranking reads them from the blocks).
  std::vector<float> keys;
};

// Train segment `segment` of KV head `head` on its first `tokens` tokens.
struct TrainingJob {
  int head = 0, segment = 0, tokens = 0;
};

struct TrainedSegment {
  TrainingJob job;
  PqCodebook codebook{0, 1, 1};
  std::vector<uint8_t> codes;  // of the tokens it was trained on
};

struct PqLayer {
  std::vector<std::vector<PqSegment>> heads;  // [KV head][segment]
  std::future<std::vector<TrainedSegment>> training;
};

class PqSelector final : public TopkSelector {
 public:
  PqSelector(const PqOptions& options, int num_layers, int num_kv_heads, int k_dim, int block_tokens, uint64_t seed)
      : TopkSelector(options.window, options.rerank, num_kv_heads, k_dim),
        options_(options),
        seed_(seed),
        block_tokens_(block_tokens),
        layers_(size_t(num_layers)),
        sealed_tokens_(size_t(num_layers) * size_t(num_kv_heads)) {
    for (PqLayer& layer : layers_) layer.heads.resize(size_t(num_kv_heads));
  }
  ~PqSelector() override { clear(); }

  void on_seal(int layer, int head, const float* k) override {
    std::vector<PqSegment>& segments = layers_[size_t(layer)].heads[size_t(head)];
    int& sealed = sealed_tokens_[size_t(layer) * size_t(num_kv_heads()) + size_t(head)];
    for (int t = 0; t < block_tokens_; ++t, ++sealed) {  // a block may straddle two segments
      const size_t s = size_t(sealed / options_.segment_tokens);
      if (segments.size() <= s) segments.resize(s + 1);
      segments[s].keys.insert(segments[s].keys.end(), k + size_t(t) * k_dim(), k + size_t(t + 1) * k_dim());
    }
  }

  void on_prefill(int layer_index) override {
    PqLayer& layer = layers_[size_t(layer_index)];
    if (!options_.overlap) return;
    // A chunked prompt: the previous chunk's clustering has had this chunk's forward pass to finish.
    if (layer.training.valid()) adopt(layer, layer.training.get());
    std::vector<TrainingJob> jobs = due_training(layer_index);
    if (jobs.empty()) return;
    // Snapshot the keys: appends to this layer go on while the job runs.
    std::vector<std::vector<float>> keys;
    for (const TrainingJob& job : jobs) {
      const float* first = segment_keys(layer_index, job);
      keys.emplace_back(first, first + size_t(job.tokens) * size_t(k_dim()));
    }
    layer.training =
        std::async(std::launch::async, [this, layer_index, jobs = std::move(jobs), keys = std::move(keys)] {
          std::vector<TrainedSegment> trained;
          for (size_t j = 0; j < jobs.size(); ++j) trained.push_back(train(layer_index, jobs[j], keys[j].data()));
          return trained;
        });
  }

  // The index and keys as they are once every segment's clustering has landed, per (layer, KV head): a
  // codebook of 2^b centroids per sub-space, FP16 (pq_codebook.h), per segment begun, m one-byte codes per
  // token, and the FP32 keys of the last segment while it fills (a full segment's keys go when its codes
  // are final).
  size_t memory_bytes() const override {
    size_t bytes = 0;
    for (size_t l = 0; l < layers_.size(); ++l) {
      const size_t tokens = size_t(sealed_tokens(int(l))), segment_tokens = size_t(options_.segment_tokens);
      const size_t segments = (tokens + segment_tokens - 1) / segment_tokens;
      bytes += size_t(num_kv_heads()) * (segments * (size_t(1) << options_.bits) * size_t(k_dim()) * sizeof(uint16_t) +
                                         tokens * size_t(options_.m) +
                                         tokens % segment_tokens * size_t(k_dim()) * sizeof(float));
    }
    return bytes;
  }

  void clear() override {
    std::fill(sealed_tokens_.begin(), sealed_tokens_.end(), 0);
    for (PqLayer& layer : layers_) {
      if (layer.training.valid()) layer.training.wait();
      layer = PqLayer{};
      layer.heads.resize(size_t(num_kv_heads()));
    }
  }

 protected:
  bool prepare(int layer_index, int scored_tokens, ThreadPool& pool) override {
    PqLayer& layer = layers_[size_t(layer_index)];
    if (layer.training.valid()) adopt(layer, layer.training.get());
    // No prefill to overlap with (tokens came one by one), or segments filled since: cluster now.
    const std::vector<TrainingJob> jobs = due_training(layer_index);
    if (!jobs.empty()) {
      std::vector<TrainedSegment> trained(jobs.size());
      pool.run(int64_t(jobs.size()), [&](int64_t j, int) {
        trained[size_t(j)] = train(layer_index, jobs[size_t(j)], segment_keys(layer_index, jobs[size_t(j)]));
      });
      adopt(layer, std::move(trained));
    }
    if (layer.heads[0].empty() || layer.heads[0][0].trained_on == 0) return false;
    const int segment_tokens = options_.segment_tokens;
    for (int g = 0; g < num_kv_heads(); ++g) {  // tokens sealed since: codes of their nearest centroids
      std::vector<PqSegment>& segments = layer.heads[size_t(g)];
      const int needed = (scored_tokens + segment_tokens - 1) / segment_tokens;
      if (int(segments.size()) < needed) segments.resize(size_t(needed));
      int owner = 0;  // the latest trained segment so far: lends its codebook to the untrained ones after it
      for (int s = 0; s < needed; ++s) {
        PqSegment& segment = segments[size_t(s)];
        if (segment.trained_on > 0) owner = s;
        if (segment.coded_with != owner) {
          segment.codes.clear();
          segment.coded_with = owner;
        }
        const int coded = int(segment.codes.size()) / options_.m;
        const int wanted = std::min(segment_tokens, scored_tokens - s * segment_tokens);
        if (coded >= wanted) continue;
        segment.codes.resize(size_t(wanted) * size_t(options_.m));
        const float* k = segment.keys.data() + size_t(coded) * size_t(k_dim());
        segments[size_t(owner)].codebook.encode(k, wanted - coded, segment.codes.data() + size_t(coded) * options_.m);
      }
    }
    return true;
  }

  void score(int layer, int head_index, const float* q, int first, int last, float* scores) const override {
    const std::vector<PqSegment>& segments = layers_[size_t(layer)].heads[size_t(head_index)];
    const int segment_tokens = options_.segment_tokens;
    thread_local std::vector<float> table;
    table.resize(size_t(options_.m) << options_.bits);
    for (int s = first / segment_tokens; s * segment_tokens < last; ++s) {
      const PqSegment& segment = segments[size_t(s)];
      const int begin = std::max(first, s * segment_tokens), end = std::min(last, (s + 1) * segment_tokens);
      const PqCodebook& codebook = segments[size_t(segment.coded_with)].codebook;
      codebook.score_table(q, table.data());
      codebook.score_codes(table.data(), segment.codes.data() + size_t(begin - s * segment_tokens) * options_.m,
                                   end - begin, scores + (begin - first));
    }
  }

 private:
  // Each segment is clustered on its own tokens, so a codebook only sees keys of nearby positions: RoPE
  // turns the low-frequency dims of the keys slowly with position, and a codebook trained on the first
  // half of a 4K context codes the second half badly (recall 0.43 against 0.67 when trained on all).
  // A segment is trained once it holds a point per centroid, again each time its tokens double, and a
  // last time when it is full; a segment not trained yet borrows the latest trained codebook. (Training
  // early matters on the decode path: the newest tokens past the local window are the most attended of
  // the middle ones, and a borrowed codebook codes them worst.)
  std::vector<TrainingJob> due_training(int layer) const {
    const int n = sealed_tokens(layer), segment_tokens = options_.segment_tokens;
    const int min_tokens = 1 << options_.bits;  // k-means needs a point per centroid
    const std::vector<PqSegment>& segments = layers_[size_t(layer)].heads[0];
    std::vector<TrainingJob> jobs;
    for (int s = 0; s * segment_tokens < n; ++s) {
      const int tokens = std::min(segment_tokens, n - s * segment_tokens);
      const int trained = s < int(segments.size()) ? segments[size_t(s)].trained_on : 0;
      const bool due = tokens == segment_tokens ? trained < tokens : tokens >= 2 * trained;
      if (tokens < min_tokens || !due) continue;
      for (int g = 0; g < num_kv_heads(); ++g) jobs.push_back({g, s, tokens});
    }
    return jobs;
  }

  int sealed_tokens(int layer) const { return sealed_tokens_[size_t(layer) * size_t(num_kv_heads())]; }

  const float* segment_keys(int layer, const TrainingJob& job) const {
    return layers_[size_t(layer)].heads[size_t(job.head)][size_t(job.segment)].keys.data();
  }

  TrainedSegment train(int layer, const TrainingJob& job, const float* keys) const {
    TrainedSegment trained{job, PqCodebook(k_dim(), options_.m, options_.bits), {}};
    const int iters = options_.max_iters ? options_.max_iters
                                         : kmeans_iteration_cap(job.tokens, num_kv_heads(), options_.m, options_.bits,
                                                                k_dim() / options_.m);
    trained.codebook.train(keys, job.tokens, iters, pq_segment_seed(seed_, layer, job.head, job.segment));
    trained.codes.resize(size_t(job.tokens) * options_.m);
    trained.codebook.encode(keys, job.tokens, trained.codes.data());
    return trained;
  }

  void adopt(PqLayer& layer, std::vector<TrainedSegment> trained) const {
    for (TrainedSegment& result : trained) {
      std::vector<PqSegment>& segments = layer.heads[size_t(result.job.head)];
      if (int(segments.size()) <= result.job.segment) segments.resize(size_t(result.job.segment) + 1);
      for (PqSegment& other : segments) {  // codes that index the replaced codebook are recomputed
        if (other.coded_with == result.job.segment) other.coded_with = -1;
      }
      PqSegment& segment = segments[size_t(result.job.segment)];
      segment.codebook = std::move(result.codebook);
      segment.codes = std::move(result.codes);
      segment.trained_on = result.job.tokens;
      segment.coded_with = result.job.segment;
      if (segment.trained_on == options_.segment_tokens) segment.keys = {};  // its codes are final
    }
  }

  PqOptions options_;
  uint64_t seed_;
  int block_tokens_;
  std::vector<PqLayer> layers_;
  std::vector<int> sealed_tokens_;  // [layer · num_kv_heads + head]
};

// The upper bound: exact scores q·k of every middle token from a copy of the FP32 keys (before a
// codec rounds them).
class OracleSelector final : public TopkSelector {
 public:
  OracleSelector(const TopkWindow& window, int num_layers, int num_kv_heads, int k_dim, int block_tokens)
      : TopkSelector(window, 1.0, num_kv_heads, k_dim),
        block_tokens_(block_tokens),
        keys_(size_t(num_layers) * size_t(num_kv_heads)) {}

  void on_seal(int layer, int head, const float* k) override {
    std::vector<float>& keys = keys_[size_t(layer) * size_t(num_kv_heads()) + size_t(head)];
    keys.insert(keys.end(), k, k + size_t(block_tokens_) * size_t(k_dim()));
  }
  void clear() override {
    for (std::vector<float>& keys : keys_) keys.clear();
  }
  size_t memory_bytes() const override {
    size_t bytes = 0;
    for (const std::vector<float>& keys : keys_) bytes += keys.size() * sizeof(float);
    return bytes;
  }

 protected:
  bool prepare(int, int, ThreadPool&) override { return true; }
  void score(int layer, int head, const float* q, int first, int last, float* scores) const override {
    const float* k = keys_[size_t(layer) * size_t(num_kv_heads()) + size_t(head)].data();
    for (int t = first; t < last; ++t) scores[t - first] = dot(q, k + size_t(t) * k_dim(), size_t(k_dim()));
  }

 private:
  int block_tokens_;
  std::vector<std::vector<float>> keys_;  // [layer · num_kv_heads + head]: [sealed tokens, k_dim]
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
  const PqOptions* pq_options() const override { return &options_; }

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
