// ZACK attention on the GPU (attention/cuda/zack_attention.h over kv/cuda/zack_kv_cache.h) against
// dense FP16 paged attention (attention/cuda/paged_attention.h): one new query per sequence (decode), or
// with --queries N a chunk of N new queries per sequence, the last N of its context (prefill: both on
// their tensor-core prefill kernels), a batch of equal contexts, one layer of the given shape (default
// Llama-3-8B's: 32 q / 8 KV heads, d 128).
//
// Ranks: per KV head, K and V ranks drawn around the mean that each KV compression gives (1 − stored dims
// / full dims), log-normally spread (sigma --spread) and clipped to 8..d, then nudged so the layer's total
// matches the compression exactly. They are synthetic: a Llama-3-8B calibration needs its weights, which
// this machine lacks, and random weights have flat spectra (every head the same rank). --skewed adds a row
// whose heads alternate between rank d and rank 8 (K and V): the balancing's worst case.
// Each zack row runs both schedules: balanced (ZACK §5.3: each head's share of a sequence's wave of tasks
// by its cost, longest first, dynamic) and uniform (the same share for every head, static order); with
// --queries > 1 the prefill kernel's splits: balanced (each head's share of a sequence's wave of CTAs by
// its cost) and uniform (the same splits for every head). Either way each sequence is cut as it would be
// alone (attention/split_rule.h), so a batch of B runs about B waves of tasks. --codec hack|quant adds zack followed by that codec
// (--codec-bits; the ranks rounded up to multiples of 4, as align=4 does: gpu_zack_quantized_kv.cc's
// decode attention, CudaPagedAttention::run_quantized over heads of their own dims) beside the codec at
// the full head dim.
//
//   bench_zack_attention_cuda --batch 8 --contexts 4096,16384,65536 --compressions 0.3,0.5,0.7 --skewed
//   bench_zack_attention_cuda --batch 8 --contexts 4096,16384,65536 --compressions 0.5 --codec hack --codec-bits 4
//   bench_zack_attention_cuda --batch 1 --queries 512 --contexts 4096,16384,65536 --compressions 0.3,0.5,0.7
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "attention/cuda/paged_attention.h"
#include "attention/cuda/zack_attention.h"
#include "backend/cuda/random_fill.h"
#include "bench_errors.h"
#include "gpu_timing.h"
#include "kv/cuda/zack_kv_cache.h"
#include "random_kv.h"

namespace slimkv::cuda {
namespace {

struct Options {
  int batch = 8, heads = 32, kv_heads = 8, head_dim = 128;
  int queries = 1;  // new queries per sequence: 1 decode, more a prefill chunk
  std::vector<int> contexts = {4096, 8192, 16384, 32768, 65536};
  std::vector<double> compressions = {0.3, 0.5, 0.7};
  double spread = 0.5;
  bool skewed = false;
  int repetitions = 20;
  int tasks_per_cta = 1;
  unsigned seed = 26;
  std::string codec;  // hack or quant after zack (empty: none)
  int codec_bits = 2;
};

struct Ranks {
  std::string name;
  std::vector<int> k, v;
};

Ranks ranks_for(const Options& o, double compression, std::mt19937& rng) {
  const int d = o.head_dim, min_rank = std::min(8, d);
  const double mean = (1.0 - compression) * d;
  std::lognormal_distribution<double> spread(0.0, o.spread);
  Ranks r{str_cat("zack ", compression), {}, {}};
  for (int g = 0; g < o.kv_heads; ++g) {
    r.k.push_back(std::clamp(int(std::lround(mean * spread(rng))), min_rank, d));
    r.v.push_back(std::clamp(int(std::lround(mean * spread(rng))), min_rank, d));
  }
  // Nudge one dim at a time until the total is the compression's.
  const int want = int(std::lround(2.0 * o.kv_heads * mean));
  for (int guard = 0; guard < 4 * o.kv_heads * d; ++guard) {
    int total = 0;
    for (int g = 0; g < o.kv_heads; ++g) total += r.k[size_t(g)] + r.v[size_t(g)];
    if (total == want) break;
    std::vector<int>& side = guard % 2 ? r.k : r.v;
    int& rank = side[size_t(rng() % side.size())];
    rank = std::clamp(rank + (total < want ? 1 : -1), min_rank, d);
  }
  return r;
}

double compression_of(const Options& o, const Ranks& r) {
  int total = 0;
  for (int g = 0; g < o.kv_heads; ++g) total += r.k[size_t(g)] + r.v[size_t(g)];
  return 1.0 - double(total) / (2.0 * o.kv_heads * o.head_dim);
}

// The step every variant runs: o.queries new queries of each sequence, the last of its `context` tokens.
PagedAttentionBatch step_batch(const Options& o, const std::vector<int>& ids, int context) {
  return {ids, std::vector<int>(size_t(o.batch), context), std::vector<int>(size_t(o.batch), o.queries)};
}

// ms per step of paged attention over `kv` (step_batch at `context`): `run` is the kernel's call, given
// the attention, the queries, the scale and the output.
template <typename Run>
Expected<double> step_ms(const Options& o, const RandomKv& kv, int context, Run run) {
  const int max_queries = o.batch * o.queries;
  SLIMKV_ASSIGN_OR_RETURN(auto attention,
                          CudaPagedAttention::create({o.heads, o.kv_heads, o.head_dim, o.batch, max_queries}));
  const size_t q_elements = size_t(max_queries) * o.heads * o.head_dim;
  SLIMKV_ASSIGN_OR_RETURN(auto q, DeviceArray<uint16_t>::allocate(q_elements, "queries"));
  SLIMKV_ASSIGN_OR_RETURN(auto out, DeviceArray<uint16_t>::allocate(q_elements, "outputs"));
  SLIMKV_RETURN_IF_ERROR(fill_random_fp16(q.data(), q_elements, 99, 1.0f));
  SLIMKV_RETURN_IF_ERROR(attention->plan(step_batch(o, kv.ids, context)));
  const float scale = 1.0f / std::sqrt(float(o.head_dim));
  return median_launch_ms([&] { return run(*attention, q.data(), scale, out.data()); }, o.repetitions, 10, 5);
}

// ms per step of dense FP16 paged attention.
Expected<double> dense_ms(const Options& o, int context) {
  SLIMKV_ASSIGN_OR_RETURN(const RandomKv kv, random_kv({o.batch, context, 1, o.kv_heads, o.head_dim, "dense", 2}));
  return step_ms(o, kv, context, [&](CudaPagedAttention& attention, const uint16_t* q, float scale, uint16_t* out) {
    return attention.run(kv.view(), q, scale, out);
  });
}

// ms per step of `o.codec` over random K/V, each head at `dims` (empty: the full head dim).
Expected<double> quantized_ms(const Options& o, int context, const HeadDims& dims) {
  SLIMKV_ASSIGN_OR_RETURN(const RandomKv kv,
                          random_kv({o.batch, context, 1, o.kv_heads, o.head_dim, o.codec, o.codec_bits, {}, dims}));
  return step_ms(o, kv, context, [&](CudaPagedAttention& attention, const uint16_t* q, float scale, uint16_t* out) {
    return attention.run_quantized(kv.view(), kv.quantized->sealed_view(0), q, scale, out);
  });
}

// The ranks as the codec stores them: rounded up to multiples of 4 (align=4).
HeadDims codec_dims(const Options& o, const Ranks& r) {
  HeadDims dims;
  for (int g = 0; g < o.kv_heads; ++g) {
    dims.k_dims.push_back(std::min(o.head_dim, (r.k[size_t(g)] + 3) / 4 * 4));
    dims.v_dims.push_back(std::min(o.head_dim, (r.v[size_t(g)] + 3) / 4 * 4));
  }
  return dims;
}

struct ZackTimes {
  double balanced_ms, uniform_ms;
};

// ms per step of ZACK attention at these ranks, both schedules.
Expected<ZackTimes> zack_ms(const Options& o, int context, const Ranks& r) {
  constexpr int kChunkTokens = 4096;
  const int d = o.head_dim, blocks_per_sequence = (context + kCudaBlockTokens - 1) / kCudaBlockTokens;
  ZackKvShape shape;
  shape.num_layers = 1, shape.num_heads = o.heads, shape.num_kv_heads = o.kv_heads, shape.head_dim = d;
  shape.num_blocks = o.batch * blocks_per_sequence, shape.max_sequences = o.batch;
  shape.max_blocks_per_sequence = blocks_per_sequence, shape.max_step_tokens = std::min(context, kChunkTokens);
  shape.k_ranks = r.k, shape.v_ranks = r.v;
  for (int g = 0; g < o.kv_heads; ++g) {  // the identity's first rows: k' is k's first k_rank dims
    for (int row = 0; row < r.k[size_t(g)]; ++row) {
      for (int c = 0; c < d; ++c) shape.qk_bases.push_back(row == c ? 1.0f : 0.0f);
    }
  }
  SLIMKV_ASSIGN_OR_RETURN(auto cache, CudaZackKvCache::create(shape));
  const int max_queries = o.batch * o.queries;
  SLIMKV_ASSIGN_OR_RETURN(auto attention,
                          CudaZackAttention::create({1, o.heads, o.kv_heads, d, o.batch, max_queries, r.k, r.v, o.tasks_per_cta}));
  const size_t chunk = size_t(shape.max_step_tokens) * o.kv_heads * d;
  SLIMKV_ASSIGN_OR_RETURN(auto k, DeviceArray<uint16_t>::allocate(chunk, "K chunk"));
  SLIMKV_ASSIGN_OR_RETURN(auto v, DeviceArray<uint16_t>::allocate(chunk, "V chunk"));
  std::vector<int> ids;
  for (int b = 0; b < o.batch; ++b) {
    SLIMKV_ASSIGN_OR_RETURN(int id, cache->sequences().add_sequence());
    ids.push_back(id);
    for (int at = 0, n = 0; at < context; at += n) {
      n = std::min(shape.max_step_tokens, context - at);
      SLIMKV_RETURN_IF_ERROR(fill_random_fp16(k.data(), chunk, 1000 + uint64_t(b) * 7919 + uint64_t(at), 1.0f));
      SLIMKV_RETURN_IF_ERROR(fill_random_fp16(v.data(), chunk, 2000 + uint64_t(b) * 7919 + uint64_t(at), 1.0f));
      SLIMKV_RETURN_IF_ERROR(cache->begin_step({id}, {n}));
      SLIMKV_RETURN_IF_ERROR(cache->append(0, k.data(), v.data()));
    }
  }
  const size_t q_elements = size_t(max_queries) * o.heads * d;
  SLIMKV_ASSIGN_OR_RETURN(auto q, DeviceArray<uint16_t>::allocate(q_elements, "queries"));
  SLIMKV_ASSIGN_OR_RETURN(auto out, DeviceArray<uint16_t>::allocate(q_elements, "outputs"));
  SLIMKV_RETURN_IF_ERROR(fill_random_fp16(q.data(), q_elements, 99, 1.0f));
  const PagedAttentionBatch batch = step_batch(o, ids, context);
  const float scale = 1.0f / std::sqrt(float(d));
  ZackTimes times{0, 0};
  for (ZackSchedule schedule : {ZackSchedule::kBalanced, ZackSchedule::kUniform}) {
    SLIMKV_RETURN_IF_ERROR(attention->plan(batch, {schedule, schedule}));
    SLIMKV_ASSIGN_OR_RETURN(double ms, median_launch_ms([&] { return attention->run(0, cache->view(0), q.data(), scale, out.data()); },
                                                        o.repetitions, 10, 5));
    (schedule == ZackSchedule::kBalanced ? times.balanced_ms : times.uniform_ms) = ms;
  }
  return times;
}

int run(int argc, char** argv) {
  Options o;
  CLI::App app{"slimkv ZACK attention (decode or a prefill chunk) on the GPU vs dense FP16"};
  app.add_option("--batch", o.batch)->capture_default_str();
  app.add_option("--heads", o.heads)->capture_default_str();
  app.add_option("--kv-heads", o.kv_heads)->capture_default_str();
  app.add_option("--head-dim", o.head_dim)->check(CLI::IsMember({64, 128}))->capture_default_str();
  app.add_option("--queries", o.queries, "new queries per sequence: 1 decode, more a prefill chunk (the context's last)")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--contexts", o.contexts)->delimiter(',');
  app.add_option("--compressions", o.compressions, "KV compressions (1 - kept dims / full dims)")->delimiter(',');
  app.add_option("--spread", o.spread, "log-normal sigma of the ranks around their mean")->capture_default_str();
  app.add_flag("--skewed", o.skewed, "also heads alternating between rank d and rank 8");
  app.add_option("--repetitions", o.repetitions)->capture_default_str();
  app.add_option("--tasks-per-cta", o.tasks_per_cta, "ZACK attention tasks per resident CTA for a sequence alone")
      ->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--codec", o.codec, "also zack followed by this codec, and the codec alone")->check(CLI::IsMember({"hack", "quant"}));
  app.add_option("--codec-bits", o.codec_bits, "the codec's K and V bits")->check(CLI::IsMember({2, 4, 8}))->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (failed(device_usable())) return 1;
  if (o.queries > 1 && !o.codec.empty()) return failed(error("--codec: measured with decode only (--queries 1)")), 1;
  for (int context : o.contexts) {
    if (context < o.queries) return failed(error("--contexts: ", context, " is shorter than --queries ", o.queries)), 1;
  }
  for (double c : o.compressions) {
    if (!(c >= 0.0 && c < 1.0)) return failed(error("--compressions: ", c, " is not in [0, 1)")), 1;
  }
  std::mt19937 rng(o.seed);
  std::vector<Ranks> variants;
  for (double c : o.compressions) variants.push_back(ranks_for(o, c, rng));
  if (o.skewed) {
    Ranks skewed{"skewed", {}, {}};
    for (int g = 0; g < o.kv_heads; ++g) {
      skewed.k.push_back(g % 2 ? 8 : o.head_dim);
      skewed.v.push_back(g % 2 ? 8 : o.head_dim);
    }
    variants.push_back(skewed);
  }
  const bool decode = o.queries == 1;
  if (decode) {
    std::printf("decode attention: batch %d, %d q / %d KV heads, d %d; dense FP16 vs zack (balanced | uniform schedule), "
                "%d tasks per resident CTA\n", o.batch, o.heads, o.kv_heads, o.head_dim, o.tasks_per_cta);
  } else {
    std::printf("prefill attention: batch %d, a chunk of %d queries per sequence at the end of its context, %d q / %d KV "
                "heads, d %d; dense FP16 vs zack (splits balanced by rank | uniform), both on their tensor-core prefill "
                "kernels (dense TFLOP/s: causal Q·Kᵀ and P·V at d)\n", o.batch, o.queries, o.heads, o.kv_heads, o.head_dim);
  }
  const std::string codec = o.codec.empty() ? "" : str_cat(o.codec, ":bits=", o.codec_bits);
  if (!codec.empty()) {
    std::printf("  and %s at d %d, and zack+%s (ranks rounded up to multiples of 4; x %s: its time over zack+%s's)\n",
                codec.c_str(), o.head_dim, codec.c_str(), o.codec.c_str(), o.codec.c_str());
  }
  for (const Ranks& r : variants) {
    std::string k, v;
    for (int g = 0; g < o.kv_heads; ++g) k += str_cat(g ? "," : "", r.k[size_t(g)]), v += str_cat(g ? "," : "", r.v[size_t(g)]);
    std::printf("  %-10s compression %.3f  K ranks %s  V ranks %s\n", r.name.c_str(), compression_of(o, r), k.c_str(), v.c_str());
  }
  std::printf("%8s %10s", "context", "dense ms");
  if (!decode) std::printf(" %8s", "TFLOP/s");
  if (!codec.empty()) std::printf(" %10s %7s", str_cat(o.codec, " ms").c_str(), "x dense");
  for (const Ranks& r : variants) {
    std::printf(" | %-10s %8s %8s %7s %7s", r.name.c_str(), "bal ms", "uni ms", "x dense", "bal/uni");
    if (!codec.empty()) std::printf(" %10s %7s %7s", str_cat("+", o.codec, " ms").c_str(), "x dense", str_cat("x ", o.codec).c_str());
  }
  std::printf("\n");
  for (int context : o.contexts) {
    auto dense = dense_ms(o, context);
    if (failed(dense.status())) return 1;
    std::printf("%8d %10.4f", context, *dense);
    if (!decode) {
      // Each query at position p sees p + 1 tokens: 4·d flops per (query head, token) for Q·Kᵀ and P·V.
      const double seen = double(o.queries) * (context - o.queries) + double(o.queries) * (o.queries + 1) / 2;
      std::printf(" %8.1f", 4.0 * o.head_dim * o.heads * o.batch * seen / (*dense * 1e-3) / 1e12);
    }
    double full_codec_ms = 0;
    if (!codec.empty()) {
      auto full = quantized_ms(o, context, {});
      if (failed(full.status())) return 1;
      full_codec_ms = *full;
      std::printf(" %10.4f %7.2f", full_codec_ms, *dense / full_codec_ms);
    }
    for (const Ranks& r : variants) {
      auto z = zack_ms(o, context, r);
      if (failed(z.status())) return 1;
      std::printf(" | %-10s %8.4f %8.4f %7.2f %7.2f", "", z->balanced_ms, z->uniform_ms, *dense / z->balanced_ms,
                  z->uniform_ms / z->balanced_ms);
      if (!codec.empty()) {
        auto reduced = quantized_ms(o, context, codec_dims(o, r));
        if (failed(reduced.status())) return 1;
        std::printf(" %10.4f %7.2f %7.2f", *reduced, *dense / *reduced, full_codec_ms / *reduced);
      }
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace slimkv::cuda

int main(int argc, char** argv) { return slimkv::cuda::run(argc, argv); }
