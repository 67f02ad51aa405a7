// PQCache as a system on this machine (issue 8):
//   --scaling: decode time per step of one attention layer (bundled model's shape: 4 query heads, 2 KV
//              heads, head_dim 128) as the context grows 2K -> 64K, dense vs pq (select + attend);
//   --cache:   block cache hit rate and bytes moved per decode step by cache size, bundled model;
//   --tt2t:    time to second token (prefill + first decode) with k-means overlapped or not;
//   --locality: how much of each layer's top-k the step before, or the layer before, kept (what a
//              cache of recent selections serves, and what a prefetch of the next layer's tokens could);
//   --fit:     the cost model of iters=auto (PQCache Eq. 1-3): k-means time vs s·T, one layer's
//              prefill time vs s, least-squares coefficients to paste into kv/select/pq_selector.cc.
//   bench_pq_decode --model DIR [--scaling [--specs "dense;pq:topk=0.2"] [--contexts 16384,65536]
//                   [--steps 31] [--split]] [--cache [--cache-topk 0.2]] [--locality [--locality-spec S]]
//                   [--tt2t] [--fit]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>

#include <CLI/CLI.hpp>

#include "kv/select/pq_codebook.h"
#include "kv/store_attention.h"
#include "model/llama.h"
#include "slimkv/engine.h"
#include "slimkv/tokenizer.h"

namespace {

using namespace slimkv;
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::unique_ptr<Engine> load(const std::string& model_dir, const std::string& spec) {
  EngineConfig config;
  config.model_dir = model_dir;
  config.kv_spec = spec;
  config.threads = 2;
  auto engine = Engine::load(config);
  if (!engine) {
    std::fprintf(stderr, "bench_pq_decode: %s\n", engine.status().message().c_str());
    std::exit(1);
  }
  return std::move(*engine);
}

std::vector<int32_t> heldout(const Engine& engine, const std::string& model_dir, int tokens) {
  std::ifstream in(model_dir + "/heldout.txt");
  std::stringstream text;
  text << in.rdbuf();
  std::vector<int32_t> ids = engine.tokenizer()->encode(text.str());
  ids.resize(std::min(ids.size(), size_t(tokens)));
  return ids;
}

int32_t argmax(const std::vector<float>& logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

double median(std::vector<double> values) {  // robust to other work on a shared machine
  std::nth_element(values.begin(), values.begin() + ptrdiff_t(values.size() / 2), values.end());
  return values[values.size() / 2];
}

// Medians of one layer's decode steps, ms: the whole step (append + select + attend) and its parts.
struct StepTimes {
  double step = 0, select = 0, attend = 0;
};

// One layer, random K/V: the median of `steps` decode steps after a first one (which waits for clustering).
StepTimes decode_step_ms(const std::string& spec, int context, int steps) {
  constexpr int kHeads = 4, kKvHeads = 2, d = 128;
  auto pipeline = make_kv_pipeline(spec);
  if (!pipeline) std::exit(1);
  KvStore store({1, kKvHeads, d, d, context + steps + 1}, *pipeline);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> k(size_t(4096) * kKvHeads * d), v(k.size()), q(size_t(kHeads) * d), out(q.size());
  for (int first = 0; first < context; first += 4096) {  // a prefill, in chunks
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    store.append(0, k.data(), v.data(), std::min(4096, context - first));
  }
  ThreadPool pool(2);
  const AttentionParams params{kHeads, 1.0f / std::sqrt(float(d)), &pool};
  std::vector<double> step_ms, select_ms, attend_ms;
  auto step = [&](int position) {
    for (float& x : q) x = normal(rng);
    const auto start = Clock::now();
    store.append(0, k.data(), v.data(), 1);
    const auto selecting = Clock::now();
    const std::vector<HeadSelection>& selection = store.select(0, q.data(), 1, kHeads, pool);
    const auto attending = Clock::now();
    attend(store, 0, q.data(), 1, position, params, out.data(), &selection);
    step_ms.push_back(ms_since(start));
    select_ms.push_back(std::chrono::duration<double, std::milli>(attending - selecting).count());
    attend_ms.push_back(ms_since(attending));
  };
  step(context);
  step_ms.clear(), select_ms.clear(), attend_ms.clear();
  for (int i = 1; i <= steps; ++i) step(context + i);
  return {median(step_ms), median(select_ms), median(attend_ms)};
}

// split: also each spec's select and attend medians, on a line after each context's.
void scaling(const std::vector<std::string>& specs, const std::vector<int>& contexts, int steps, bool split) {
  std::printf("decode step, one layer (4 q / 2 KV heads, d=128), ms; ratio to the first spec\n%-8s", "context");
  for (const std::string& spec : specs) std::printf(" %34s", spec.c_str());
  std::printf("\n");
  for (int context : contexts) {
    std::printf("%-8d", context);
    double first = 0;
    std::vector<StepTimes> times;
    for (const std::string& spec : specs) {
      times.push_back(decode_step_ms(spec, context, steps));
      if (first == 0) first = times.back().step;
      std::printf(" %25.3f (%5.2fx)", times.back().step, times.back().step / first);
    }
    std::printf("\n");
    if (split) {
      std::printf("%-8s", "  sel/att");
      for (const StepTimes& t : times) {
        char parts[64];
        std::snprintf(parts, sizeof(parts), "%.3f / %.3f", t.select, t.attend);
        std::printf(" %34s", parts);
      }
      std::printf("\n");
    }
    std::fflush(stdout);
  }
}

// The bytes of the sealed tokens the last decode step selected (K and V as the codec stores them, every
// layer and KV head): what a token-granular transfer would move with no cache, where the tier moves
// whole blocks (PQCache fetches tokens).
double selected_sealed_bytes(const KvStore& kv) {
  const KvMemory memory = kv.memory();
  const int layers = kv.shape().num_layers, heads = kv.shape().num_kv_heads;
  if (memory.sealed_tokens == 0) return 0.0;
  // sealed_bytes_per_token covers every layer and KV head
  const double bytes_per_token = memory.sealed_bytes_per_token() / double(layers * heads);
  size_t tokens = 0;
  for (int layer = 0; layer < layers; ++layer) {
    const int sealed = kv.num_sealed_blocks(layer) * kv.block_tokens();
    for (int g = 0; g < heads; ++g) {
      const HeadSelection& selection = kv.last_selection(layer, g);
      if (selection.all) tokens += size_t(sealed);
      for (size_t i = 0; !selection.all && i < selection.tokens.size() && selection.tokens[i] < sealed; ++i) ++tokens;
    }
  }
  return double(tokens) * bytes_per_token;
}

void cache(const std::string& model_dir, double topk) {
  constexpr int kPrompt = 3968, kDecode = 32;
  std::printf("block cache, pq:topk=%g@offload, %d-token prompt then %d decode steps (bundled model)\n", topk,
              kPrompt, kDecode);
  std::printf("%-12s %-6s %10s %18s %26s\n", "cache tokens", "policy", "hit rate", "KiB moved / step",
              "KiB selected tokens / step");
  for (const char* policy : {"lru", "lfu"}) {
    for (int cache_tokens : {256, 512, 1024, 2048, 4096}) {
      auto engine =
          load(model_dir, str_cat("pq:topk=", topk, ",cache=", cache_tokens, ",policy=", policy, "@offload"));
      auto session = engine->new_session();
      auto logits = session->prefill(heldout(*engine, model_dir, kPrompt));
      const TierStats before = session->kv().tier_stats();
      double selected_bytes = 0.0;
      for (int i = 0; i < kDecode && logits; ++i) {
        logits = session->decode(argmax(*logits));
        selected_bytes += selected_sealed_bytes(session->kv());
      }
      const TierStats after = session->kv().tier_stats();
      const double hits = double(after.hits - before.hits), misses = double(after.misses - before.misses);
      std::printf("%-12d %-6s %10.3f %18.1f %26.1f\n", cache_tokens, policy, hits / (hits + misses),
                  double(after.bytes_moved - before.bytes_moved) / 1024.0 / kDecode, selected_bytes / 1024.0 / kDecode);
    }
  }
}

// The ranked tokens a head's last selection kept (its top-k: those in [ranked_first, ranked_last)).
std::vector<int> ranked_tokens(const HeadSelection& selection) {
  std::vector<int> kept;
  for (int t : selection.tokens) {
    if (t >= selection.ranked_first && t < selection.ranked_last) kept.push_back(t);
  }
  return kept;
}

size_t common(const std::vector<int>& a, const std::vector<int>& b) {  // both ascending
  std::vector<int> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  return both.size();
}

// What a prefetch of the next layer's likely tokens could find (issue 25): of each (layer >= 1, KV head)'s
// top-k at a decode step, the share that the same layer and head kept at the step before (what a cache
// of recent selections, PQCache's, serves), that the layer before kept (the same head, or any of its
// heads: what a prefetch of layer l's tokens for layer l + 1 would fetch), and that the layer before
// kept but the step before did not (what such a prefetch adds to the cache), against the tokens it
// would fetch for that (the layer before's, not kept at the step before).
void locality(const std::string& model_dir, const std::string& spec) {
  constexpr int kPrompt = 3968, kDecode = 32;
  auto engine = load(model_dir, spec);
  auto session = engine->new_session();
  auto logits = session->prefill(heldout(*engine, model_dir, kPrompt));
  const KvStore& kv = session->kv();
  const int layers = kv.shape().num_layers, heads = kv.shape().num_kv_heads;
  using TopK = std::vector<std::vector<std::vector<int>>>;  // [layer][head]: a step's top-k
  TopK before;
  double ranked = 0, same_step_before = 0, same_head_below = 0, any_head_below = 0, below_not_before = 0, fetched = 0;
  for (int step = 0; step < kDecode && logits; ++step) {
    logits = session->decode(argmax(*logits));
    TopK now(static_cast<size_t>(layers), std::vector<std::vector<int>>(static_cast<size_t>(heads)));
    for (int l = 0; l < layers; ++l) {
      for (int g = 0; g < heads; ++g) now[size_t(l)][size_t(g)] = ranked_tokens(kv.last_selection(l, g));
    }
    for (int l = 1; l < layers && !before.empty(); ++l) {
      std::vector<int> below_any;  // the layer before's heads' top-k, together
      for (int g = 0; g < heads; ++g) {
        const std::vector<int>& below = now[size_t(l - 1)][size_t(g)];
        below_any.insert(below_any.end(), below.begin(), below.end());
      }
      std::sort(below_any.begin(), below_any.end());
      below_any.erase(std::unique(below_any.begin(), below_any.end()), below_any.end());
      for (int g = 0; g < heads; ++g) {
        const std::vector<int>& kept = now[size_t(l)][size_t(g)];
        const std::vector<int>& previous = before[size_t(l)][size_t(g)];
        const std::vector<int>& below = now[size_t(l - 1)][size_t(g)];
        ranked += double(kept.size());
        same_step_before += double(common(kept, previous));
        same_head_below += double(common(kept, below));
        any_head_below += double(common(kept, below_any));
        std::vector<int> new_below;
        std::set_difference(below_any.begin(), below_any.end(), previous.begin(), previous.end(), std::back_inserter(new_below));
        below_not_before += double(common(kept, new_below));
        fetched += double(new_below.size());
      }
    }
    before = std::move(now);
  }
  std::printf("%s, %d-token prompt, %d decode steps (bundled model): of each layer's top-k (layers >= 1)\n", spec.c_str(),
              kPrompt, kDecode);
  std::printf("  kept at the step before (same layer, head): %.3f\n", same_step_before / ranked);
  std::printf("  kept by the layer before, same head:        %.3f\n", same_head_below / ranked);
  std::printf("  kept by the layer before, any head:         %.3f\n", any_head_below / ranked);
  std::printf("  kept by the layer before (any head), not at the step before: %.3f, of %.2f fetched per top-k token\n",
              below_not_before / ranked, fetched / ranked);
}

void tt2t(const std::string& model_dir) {
  std::printf("time to second token (prefill + 1 decode), ms, best of 3 (bundled model)\n");
  std::printf("%-8s %14s %18s %18s\n", "prompt", "dense", "pq overlap=on", "pq overlap=off");
  for (int prompt : {1024, 2048, 4000}) {
    std::printf("%-8d", prompt);
    for (const char* spec : {"dense", "pq:topk=0.2", "pq:topk=0.2,overlap=off"}) {
      auto engine = load(model_dir, spec);
      const std::vector<int32_t> ids = heldout(*engine, model_dir, prompt);
      double best = 1e30;
      for (int repeat = 0; repeat < 3; ++repeat) {
        auto session = engine->new_session();
        const auto start = Clock::now();
        auto logits = session->prefill(ids);
        logits = session->decode(argmax(*logits));
        best = std::min(best, ms_since(start));
      }
      std::printf(" %17.1f", best);
    }
    std::printf("\n");
  }
}

// Least squares: the coefficients c minimizing Σ (y - Σ c_j x_j)², by the normal equations.
std::vector<double> least_squares(const std::vector<std::vector<double>>& x, const std::vector<double>& y) {
  const size_t n = x[0].size();
  std::vector<std::vector<double>> a(n, std::vector<double>(n + 1, 0.0));
  for (size_t r = 0; r < x.size(); ++r) {
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) a[i][j] += x[r][i] * x[r][j];
      a[i][n] += x[r][i] * y[r];
    }
  }
  for (size_t i = 0; i < n; ++i) {  // Gauss-Jordan
    for (size_t j = 0; j < n; ++j) {
      if (j == i) continue;
      const double f = a[j][i] / a[i][i];
      for (size_t c = i; c <= n; ++c) a[j][c] -= f * a[i][c];
    }
  }
  std::vector<double> c(n);
  for (size_t i = 0; i < n; ++i) c[i] = a[i][n] / a[i][i];
  return c;
}

void fit(const std::string& model_dir) {
  auto engine = load(model_dir, "dense");
  const KvShape shape = engine->model().kv_shape();
  constexpr int m = 2, bits = 6;
  // Eq. 2: one layer's prefill forward (the whole model's, divided by its layers) vs s.
  std::vector<std::vector<double>> x2;
  std::vector<double> y2;
  for (int s : {256, 512, 1024, 2048, 3072, 4000}) {
    const std::vector<int32_t> ids = heldout(*engine, model_dir, s);
    double best = 1e30;
    for (int repeat = 0; repeat < 3; ++repeat) {
      auto session = engine->new_session();
      const auto start = Clock::now();
      if (!session->prefill(ids)) std::exit(1);
      best = std::min(best, ms_since(start) / 1000.0 / shape.num_layers);
    }
    x2.push_back({1.0, double(s), double(s) * s});
    y2.push_back(best);
  }
  // Eq. 1: clustering one layer (every KV head and sub-space, one thread) vs s·T·(h_kv m 2^b d_m).
  std::vector<std::vector<double>> x1;
  std::vector<double> y1;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (int s : {512, 1024, 2048, 4000}) {
    std::vector<float> keys(size_t(s) * shape.k_dim);
    for (float& k : keys) k = normal(rng);
    for (int iters : {2, 6}) {  // random keys do not converge early
      const auto start = Clock::now();
      for (int g = 0; g < shape.num_kv_heads; ++g) PqCodebook(shape.k_dim, m, bits).train(keys.data(), s, iters, 1);
      const double work = double(s) * iters * shape.num_kv_heads * m * (1 << bits) * (shape.k_dim / m);
      x1.push_back({1.0, work});
      y1.push_back(ms_since(start) / 1000.0);
    }
  }
  const std::vector<double> c1 = least_squares(x1, y1), c2 = least_squares(x2, y2);
  std::printf("Eq. 1 (k-means, one layer): alpha1 = %.3e s, beta1 = %.3e s per unit of s·T·h_kv·m·2^b·d_m\n",
              c1[0], c1[1]);
  std::printf("Eq. 2 (prefill, one layer): alpha2 = %.3e s, beta2 = %.3e s/token, gamma2 = %.3e s/token^2\n", c2[0],
              c2[1], c2[2]);
  std::printf("constexpr double kCostAlpha1 = %.3e, kCostBeta1 = %.3e;\n", c1[0], c1[1]);
  std::printf("constexpr double kCostAlpha2 = %.3e, kCostBeta2 = %.3e, kCostGamma2 = %.3e;\n", c2[0], c2[1], c2[2]);
  for (int s : {512, 1024, 2048, 4000}) {
    const double work = double(s) * shape.num_kv_heads * m * (1 << bits) * (shape.k_dim / m);
    std::printf("  s = %4d: T_max = %.1f\n", s,
                (c2[2] * s * s + c2[1] * s + c2[0] - c1[0]) / (c1[1] * work));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"PQCache decode scaling, block cache, overlap and cost model"};
  std::string model_dir;
  bool run_scaling = false, run_cache = false, run_locality = false, run_tt2t = false, run_fit = false;
  std::string locality_spec = "pq:topk=0.05";
  double cache_topk = 0.2;
  std::vector<std::string> specs = {"dense", "pq:topk=0.2,iters=8", "pq:topk=0.2,iters=8,rerank=1",
                                    "pq:topk=1024,iters=8", "pq:topk=1024,iters=8,segment=1024"};
  std::vector<int> contexts = {2048, 4096, 8192, 16384, 32768, 65536};
  int steps = 31;
  bool split = false;
  app.add_option("--model", model_dir, "model directory")->required();
  app.add_flag("--scaling", run_scaling, "decode time per step, 2K -> 64K tokens");
  app.add_option("--specs", specs, "the KV specs of --scaling (the first is the ratios' base)")
      ->delimiter(';')
      ->capture_default_str();
  app.add_option("--contexts", contexts, "the context lengths of --scaling")->delimiter(',')->capture_default_str();
  app.add_option("--steps", steps, "decode steps timed per spec and context (the median is shown)")
      ->capture_default_str();
  app.add_flag("--split", split, "--scaling: each spec's select and attend medians too (ms)");
  app.add_flag("--cache", run_cache, "block cache hit rate by size");
  app.add_option("--cache-topk", cache_topk, "the pq topk of --cache")->capture_default_str();
  app.add_flag("--locality", run_locality, "the share of each layer's top-k kept by the step or the layer before");
  app.add_option("--locality-spec", locality_spec, "the pq spec of --locality")->capture_default_str();
  app.add_flag("--tt2t", run_tt2t, "time to second token with and without overlap");
  app.add_flag("--fit", run_fit, "fit the iters=auto cost model");
  CLI11_PARSE(app, argc, argv);
  if (run_fit) fit(model_dir);
  if (run_scaling) scaling(specs, contexts, steps, split);
  if (run_cache) cache(model_dir, cache_topk);
  if (run_locality) locality(model_dir, locality_spec);
  if (run_tt2t) tt2t(model_dir);
  return 0;
}
