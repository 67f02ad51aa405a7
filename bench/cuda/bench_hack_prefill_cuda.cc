// Prefill attention over a sealed context on the GPU: HACK on INT8 tensor cores over `hack` blocks
// (attention/cuda/hack_prefill_attention.cuh) against the FP16 tensor-core kernel over the same tokens
// in FP16 blocks (attention/cuda/prefill_attention.cuh), side by side. Each sequence holds `context`
// tokens, then a step of N new queries (a 512-query chunk, or a whole 4K prompt). The HACK kernel
// attends the sealed context only; the FP16 kernel attends the context and, causally, the step's own
// tokens (the rest of a prefill step, which HACK leaves to FP16 too): its extra N(N+1)/2 token visits
// per query head are counted in its TFLOP/s, and "speedup" compares work rates (TFLOP/s), "time
// ratio" the raw times.
//
//   bench_hack_prefill_cuda --batches 1,8 --contexts 4096,8192,16384,32768 --queries 512,4096 --bits 2
//
// Measured on H100 (one run; bench_hack_prefill_cuda --batches 1,8 --contexts 4096,32768 --queries 512
// --repetitions 3): speedup 0.60–0.67x, time ratio 0.64–0.68x (batch 8, 512 queries at 32K: FP16
// 7.16 ms, 310 TFLOP/s; HACK 10.6 ms, 207 TFLOP/s; before the packed-operand kernel 12.2 ms, 180);
// --bits 4: 0.65x, --bits 8: 0.63x there. See hack_prefill_attention.cuh for what bounds the kernel.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attention/cuda/hack_prefill_attention.cuh"
#include "attention/cuda/paged_attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/paged_kv_cache.h"
#include "backend/cuda/quantized_kv_pool.h"
#include "backend/cuda/random_fill.h"
#include "gpu_timing.h"

namespace slimkv::cuda {
namespace {

struct Options {
  std::vector<int> batches = {1, 8};
  std::vector<int> contexts = {4096, 8192, 16384, 32768};
  std::vector<int> queries = {512, 4096};
  int heads = 32, kv_heads = 8, head_dim = 128, bits = 2;
  int repetitions = 7;  // timed groups; the median is reported
};

Status check(const Status& status) {
  if (!status) std::fprintf(stderr, "error: %s\n", status.message().c_str());
  return status;
}

// The median over groups of launches of the time of one `step`, in ms.
Expected<double> time_ms(const std::function<Status()>& step, int repetitions) {
  return median_launch_ms(step, repetitions, /*launches_per_group=*/5);
}

struct Measurement {
  double fp16_ms, hack_ms, fp16_tflops, hack_tflops;
  int hack_splits;
};

Expected<Measurement> measure(const Options& o, int batch, int context, int n) {
  const int kv_len = context + n;
  const int blocks_per_sequence = (kv_len + kCudaBlockTokens - 1) / kCudaBlockTokens;
  const int chunk_tokens = std::min(kv_len, 8192);  // filled a chunk at a time: small step buffers
  const CudaKvShape shape{1, o.kv_heads, o.head_dim, batch * blocks_per_sequence, batch, blocks_per_sequence, batch * chunk_tokens};
  SLIMKV_ASSIGN_OR_RETURN(auto cache, CudaPagedKvCache::create(shape));
  QuantizationConfig config;
  config.k_bits = config.v_bits = o.bits;
  SLIMKV_ASSIGN_OR_RETURN(auto pool, CudaQuantizedKvPool::create(shape, config, true, 7));
  const size_t step_elements = size_t(batch) * chunk_tokens * o.kv_heads * o.head_dim;
  SLIMKV_ASSIGN_OR_RETURN(auto k_step, DeviceArray<uint16_t>::allocate(step_elements, "K chunk"));
  SLIMKV_ASSIGN_OR_RETURN(auto v_step, DeviceArray<uint16_t>::allocate(step_elements, "V chunk"));
  std::vector<int> ids;
  for (int b = 0; b < batch; ++b) {
    SLIMKV_ASSIGN_OR_RETURN(int id, cache->sequences().add_sequence());
    ids.push_back(id);
  }
  for (int filled = 0, chunk = 0; filled < kv_len; filled += chunk_tokens, ++chunk) {
    const int tokens = std::min(chunk_tokens, kv_len - filled);
    const std::vector<int> counts(size_t(batch), tokens);
    SLIMKV_RETURN_IF_ERROR(cache->begin_step(ids, counts));
    SLIMKV_RETURN_IF_ERROR(fill_random_fp16(k_step.data(), step_elements, 2 * chunk + 1, 2.0f));
    SLIMKV_RETURN_IF_ERROR(fill_random_fp16(v_step.data(), step_elements, 2 * chunk + 2, 1.0f));
    SLIMKV_RETURN_IF_ERROR(cache->append(0, k_step.data(), v_step.data()));
    SLIMKV_RETURN_IF_ERROR(pool->seal_filled_blocks(0, *cache, ids, counts));
  }
  const size_t q_elements = size_t(batch) * n * o.heads * o.head_dim;
  SLIMKV_ASSIGN_OR_RETURN(auto q, DeviceArray<uint16_t>::allocate(q_elements, "queries"));
  SLIMKV_ASSIGN_OR_RETURN(auto out, DeviceArray<uint16_t>::allocate(q_elements, "outputs"));
  SLIMKV_RETURN_IF_ERROR(fill_random_fp16(q.data(), q_elements, 99, 1.0f));
  const PagedAttentionShape attention_shape{o.heads, o.kv_heads, o.head_dim, batch, batch * n};
  const PagedAttentionBatch step{ids, std::vector<int>(size_t(batch), kv_len), std::vector<int>(size_t(batch), n)};
  const float scale = 1.0f / std::sqrt(float(o.head_dim));
  const PagedKvView view = cache->view(0);

  SLIMKV_ASSIGN_OR_RETURN(auto fp16, CudaPagedAttention::create(attention_shape));
  SLIMKV_RETURN_IF_ERROR(fp16->plan(step));
  SLIMKV_ASSIGN_OR_RETURN(const double fp16_ms, time_ms([&] { return fp16->run(view, q.data(), scale, out.data()); }, o.repetitions));
  SLIMKV_ASSIGN_OR_RETURN(auto hack, CudaHackPrefillAttention::create(attention_shape, o.bits));
  SLIMKV_RETURN_IF_ERROR(hack->plan(step));
  const QuantizedKvView sealed = pool->view(0, view.block_tables);
  SLIMKV_ASSIGN_OR_RETURN(const double hack_ms,
                          time_ms([&] { return hack->run(view, sealed, q.data(), scale, out.data()); }, o.repetitions));

  // q·k and p·v: 4·d flops per (query head, visible token).
  const double per_visit = 4.0 * batch * o.heads * o.head_dim;
  const double fp16_visits = double(n) * context + 0.5 * double(n) * (n + 1), hack_visits = double(n) * context;
  return Measurement{fp16_ms, hack_ms, per_visit * fp16_visits / (fp16_ms * 1e9), per_visit * hack_visits / (hack_ms * 1e9),
                     hack->num_splits()};
}

int run(int argc, char** argv) {
  Options o;
  CLI::App app{"slimkv prefill attention over a sealed context: HACK INT8 vs FP16 tensor cores"};
  app.add_option("--batches", o.batches)->delimiter(',');
  app.add_option("--contexts", o.contexts)->delimiter(',');
  app.add_option("--queries", o.queries, "new tokens per sequence")->delimiter(',');
  app.add_option("--heads", o.heads)->capture_default_str();
  app.add_option("--kv-heads", o.kv_heads)->capture_default_str();
  app.add_option("--head-dim", o.head_dim)->capture_default_str();
  app.add_option("--bits", o.bits, "hack bits (K and V)")->check(CLI::IsMember({2, 4, 8}))->capture_default_str();
  app.add_option("--repetitions", o.repetitions)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (!check(device_usable())) return 1;

  std::printf("prefill attention over a sealed context: %d q / %d kv heads, d %d; FP16 tensor cores vs HACK %d-bit INT8\n",
              o.heads, o.kv_heads, o.head_dim, o.bits);
  std::printf("%6s %8s %8s | %10s %8s | %10s %8s %7s | %8s %10s\n", "batch", "queries", "context", "FP16 ms", "TFLOP/s",
              "HACK ms", "TFLOP/s", "splits", "speedup", "time ratio");
  for (int n : o.queries) {
    for (int batch : o.batches) {
      for (int context : o.contexts) {
        auto m = measure(o, batch, context, n);
        if (!check(m.status())) return 1;
        std::printf("%6d %8d %8d | %10.4f %8.1f | %10.4f %8.1f %7d | %7.2fx %9.2fx\n", batch, n, context, m->fp16_ms,
                    m->fp16_tflops, m->hack_ms, m->hack_tflops, m->hack_splits, m->hack_tflops / m->fp16_tflops,
                    m->fp16_ms / m->hack_ms);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace slimkv::cuda

int main(int argc, char** argv) { return slimkv::cuda::run(argc, argv); }
