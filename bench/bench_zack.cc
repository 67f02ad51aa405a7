// ZACK attention benchmark (ZACK §5.3, §6): attention on reduced head dims over the paged store.
//   bench_zack [--threads N] [--context T] [--prefill P]
// 1. Decode attention time against the kept rank: every KV head keeps the same rank (k and v), dense
//    FP32 and hack 4-bit, Llama-3-8B shape (32 query / 8 KV heads, head_dim 128). Work and bytes read
//    are proportional to the rank, so 50% rank should approach 2x.
// 2. Heads of unequal rank, longest task first (the pool hands out tasks by decreasing work) against
//    in (tile, head) order, decode and prefill. Ranks rise with the head index, the worst case for
//    in-order: the largest tasks come last and leave the other threads idle.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "benchmark_runner.h"
#include "kv/store_attention.h"

namespace slimkv {
namespace {

constexpr int kNumHeads = 32, kNumKvHeads = 8, kHeadDim = 128;

// A one-layer store of `tokens` random tokens whose KV head g keeps ranks[g] dims of keys and values.
std::unique_ptr<KvStore> random_store(const std::vector<int>& ranks, int tokens, const std::string& spec,
                                      std::mt19937& rng) {
  KvShape shape(1, kNumKvHeads, kHeadDim, kHeadDim, tokens);
  shape.head_k_dims = ranks;
  shape.head_v_dims = ranks;
  auto pipeline = make_kv_pipeline(spec);
  if (!pipeline) {
    std::fprintf(stderr, "%s\n", pipeline.status().message().c_str());
    std::exit(1);
  }
  auto store = std::make_unique<KvStore>(shape, *pipeline);
  const int row = shape.layer_k_dims(0);
  std::normal_distribution<float> normal;
  std::vector<float> k(size_t(tokens) * row), v(k.size());
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  store->append(0, k.data(), v.data(), tokens);
  return store;
}

// ms of attention for n query tokens at the end of the store (n = 1: decode).
double attention_ms(const KvStore& store, int n, bool longest_first, ThreadPool& pool, const std::string& name,
                    std::mt19937& rng) {
  const int tokens = store.num_tokens(0), group = kNumHeads / kNumKvHeads;
  std::normal_distribution<float> normal;
  std::vector<float> q(size_t(n) * group * store.shape().layer_k_dims(0));
  for (float& x : q) x = normal(rng);
  std::vector<float> out(size_t(n) * group * store.shape().layer_v_dims(0));
  const AttentionParams params{kNumHeads, 1.0f / std::sqrt(float(kHeadDim)), &pool, longest_first};
  return measure_ms(name, [&] { attend(store, 0, q.data(), n, tokens - n, params, out.data()); });
}

void bench_rank(int context, ThreadPool& pool) {
  std::printf("\n== decode attention against kept rank: %d/%d heads, head_dim %d, context %d, %d threads ==\n",
              kNumHeads, kNumKvHeads, kHeadDim, context, pool.threads());
  const std::vector<std::string> specs = {"dense", "hack:bits=4"};
  std::printf("%6s", "rank");
  for (const std::string& spec : specs) std::printf(" %16s %9s", (spec + " ms").c_str(), "speedup");
  std::printf("\n");
  std::mt19937 rng(42);
  std::vector<double> full(specs.size());
  for (const int rank : {128, 96, 64, 32, 16}) {
    std::printf("%6d", rank);
    for (size_t i = 0; i < specs.size(); ++i) {
      auto store = random_store(std::vector<int>(kNumKvHeads, rank), context, specs[i], rng);
      const double ms = attention_ms(*store, 1, true, pool, "rank/" + specs[i], rng);
      if (rank == kHeadDim) full[i] = ms;
      std::printf(" %16.3f %8.2fx", ms, full[i] / ms);
    }
    std::printf("\n");
  }
}

void bench_schedule(int context, int prefill_tokens, ThreadPool& pool) {
  std::vector<int> ranks;  // 16, 32, ..., 128: rising with the head index
  for (int g = 0; g < kNumKvHeads; ++g) ranks.push_back(kHeadDim * (g + 1) / kNumKvHeads);
  std::printf("\n== heads of unequal rank (16..128 rising with the head), %d threads: in order vs longest first ==\n",
              pool.threads());
  std::printf("%-28s %12s %14s %9s\n", "case", "in order ms", "longest 1st ms", "ratio");
  std::mt19937 rng(7);
  struct Case {
    std::string name;
    int tokens, queries;
  };
  for (const Case& c : {Case{"decode, context " + std::to_string(context), context, 1},
                        Case{"prefill, " + std::to_string(prefill_tokens) + " tokens", prefill_tokens, prefill_tokens}}) {
    auto store = random_store(ranks, c.tokens, "dense", rng);
    const double in_order = attention_ms(*store, c.queries, false, pool, "in-order/" + c.name, rng);
    const double balanced = attention_ms(*store, c.queries, true, pool, "longest-first/" + c.name, rng);
    std::printf("%-28s %12.3f %14.3f %8.2fx\n", c.name.c_str(), in_order, balanced, in_order / balanced);
  }
}

}  // namespace
}  // namespace slimkv

int main(int argc, char** argv) {
  CLI::App app{"ZACK attention: time against kept rank, and the balanced schedule"};
  int threads = 2, context = 16384, prefill_tokens = 2048;
  app.add_option("--threads", threads, "threads")->capture_default_str();
  app.add_option("--context", context, "KV length for decode")->capture_default_str();
  app.add_option("--prefill", prefill_tokens, "prompt length for prefill")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  slimkv::ThreadPool pool(threads);
  slimkv::bench_rank(context, pool);
  slimkv::bench_schedule(context, prefill_tokens, pool);
  return 0;
}
