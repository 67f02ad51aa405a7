// Prefill attention over a sealed context on the GPU, side by side in one run: each sequence holds
// `context` tokens, then a step of N new queries (a 512-query chunk, or a whole 4K prompt).
//   FP16:  the dense step, the FP16 tensor-core kernel (attention/cuda/prefill_attention.cuh) over FP16 blocks;
//   INT8:  HACK's INT8 tensor-core kernel alone (attention/cuda/hack_prefill_attention.cuh) over the
//          sealed context only ("rate": its TFLOP/s over FP16's, the kernel's work rate);
//   hack:  the whole `hack` step (CudaPagedAttention::run_quantized): INT8 over the sealed blocks, FP16
//          over the step's own tokens, merged ("x FP16": FP16 ms / hack ms);
//   quant: the whole `quant` step: the sealed blocks dequantized inside the FP16 kernel (KIVI-style).
// FP16's TFLOP/s counts the step's own N(N+1)/2 token visits per query head too.
//
//   bench_hack_prefill_cuda --batches 1,8 --contexts 4096,8192,16384,32768 --queries 512,4096 --bits 2
//
// Measured on H100, the INT8 kernel alone (one run, this bench before its hack and quant columns:
// --batches 1,8 --contexts 4096,32768 --queries 512 --repetitions 3): rate 0.60–0.67x (batch 8, 512
// queries at 32K: FP16 7.16 ms, 310 TFLOP/s; INT8 10.6 ms, 207 TFLOP/s; the kernel before operands
// straight from the packed blocks 12.2 ms, 180); --bits 4: 0.65x, --bits 8: 0.63x there. The whole
// hack step was not re-measured with it. See hack_prefill_attention.cuh for what bounds the kernel.
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
#include "backend/cuda/random_fill.h"
#include "bench_errors.h"
#include "gpu_timing.h"
#include "random_kv.h"

namespace slimkv::cuda {
namespace {

struct Options {
  std::vector<int> batches = {1, 8};
  std::vector<int> contexts = {4096, 8192, 16384, 32768};
  std::vector<int> queries = {512, 4096};
  int heads = 32, kv_heads = 8, head_dim = 128, bits = 2;
  int repetitions = 7;  // timed groups; the median is reported
};

// The median over groups of launches of the time of one `step`, in ms.
Expected<double> time_ms(const std::function<Status()>& step, int repetitions) {
  return median_launch_ms(step, repetitions, /*launches_per_group=*/5);
}

struct Measurement {
  double fp16_ms, kernel_ms, hack_ms, quant_ms;  // dense step; the INT8 kernel alone; hack and quant steps
  double fp16_tflops, kernel_tflops;
  int kernel_splits;
};

Expected<Measurement> measure(const Options& o, int batch, int context, int n) {
  const int kv_len = context + n;
  SLIMKV_ASSIGN_OR_RETURN(const RandomKv dense, random_kv({batch, kv_len, n, o.kv_heads, o.head_dim, "dense", o.bits}));
  SLIMKV_ASSIGN_OR_RETURN(const RandomKv hack, random_kv({batch, kv_len, n, o.kv_heads, o.head_dim, "hack", o.bits}));
  SLIMKV_ASSIGN_OR_RETURN(const RandomKv quant, random_kv({batch, kv_len, n, o.kv_heads, o.head_dim, "quant", o.bits}));
  const size_t q_elements = size_t(batch) * n * o.heads * o.head_dim;
  SLIMKV_ASSIGN_OR_RETURN(auto q, DeviceArray<uint16_t>::allocate(q_elements, "queries"));
  SLIMKV_ASSIGN_OR_RETURN(auto out, DeviceArray<uint16_t>::allocate(q_elements, "outputs"));
  SLIMKV_RETURN_IF_ERROR(fill_random_fp16(q.data(), q_elements, 99, 1.0f));
  const PagedAttentionShape attention_shape{o.heads, o.kv_heads, o.head_dim, batch, batch * n};
  const PagedAttentionBatch step{dense.ids, std::vector<int>(size_t(batch), kv_len), std::vector<int>(size_t(batch), n)};
  const float scale = 1.0f / std::sqrt(float(o.head_dim));
  SLIMKV_ASSIGN_OR_RETURN(auto attention, CudaPagedAttention::create(attention_shape));
  SLIMKV_RETURN_IF_ERROR(attention->plan(step));  // the same ids in the three caches
  Measurement m{};
  SLIMKV_ASSIGN_OR_RETURN(m.fp16_ms, time_ms([&] { return attention->run(dense.view(), q.data(), scale, out.data()); }, o.repetitions));
  for (const RandomKv* kv : {&hack, &quant}) {
    SLIMKV_ASSIGN_OR_RETURN((kv == &hack ? m.hack_ms : m.quant_ms), time_ms([&] {
      return attention->run_quantized(kv->view(), kv->quantized->sealed_view(0), q.data(), scale, out.data());
    }, o.repetitions));
  }
  SLIMKV_ASSIGN_OR_RETURN(auto kernel, CudaHackPrefillAttention::create(attention_shape, o.bits));
  SLIMKV_RETURN_IF_ERROR(kernel->plan(step));
  const QuantizedKvView sealed = hack.quantized->sealed_view(0);
  SLIMKV_ASSIGN_OR_RETURN(m.kernel_ms, time_ms([&] { return kernel->run(hack.view(), sealed, q.data(), scale, out.data()); },
                                               o.repetitions));
  // q·k and p·v: 4·d flops per (query head, visible token).
  const double per_visit = 4.0 * batch * o.heads * o.head_dim;
  const double fp16_visits = double(n) * context + 0.5 * double(n) * (n + 1), kernel_visits = double(n) * context;
  m.fp16_tflops = per_visit * fp16_visits / (m.fp16_ms * 1e9);
  m.kernel_tflops = per_visit * kernel_visits / (m.kernel_ms * 1e9);
  m.kernel_splits = kernel->num_splits();
  return m;
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
  if (failed(device_usable())) return 1;

  std::printf("prefill attention over a sealed context: %d q / %d kv heads, d %d; dense FP16 vs %d-bit hack and quant\n",
              o.heads, o.kv_heads, o.head_dim, o.bits);
  std::printf("%6s %7s %7s | %9s %7s | %9s %7s %6s %7s | %9s %7s | %9s %7s | %8s\n", "batch", "queries", "context", "FP16 ms",
              "TFLOP/s", "INT8 ms", "TFLOP/s", "splits", "rate", "hack ms", "x FP16", "quant ms", "x FP16", "hack/q");
  for (int n : o.queries) {
    for (int batch : o.batches) {
      for (int context : o.contexts) {
        auto m = measure(o, batch, context, n);
        if (failed(m.status())) return 1;
        std::printf("%6d %7d %7d | %9.4f %7.1f | %9.4f %7.1f %6d %6.2fx | %9.4f %6.2fx | %9.4f %6.2fx | %7.2fx\n", batch, n,
                    context, m->fp16_ms, m->fp16_tflops, m->kernel_ms, m->kernel_tflops, m->kernel_splits,
                    m->kernel_tflops / m->fp16_tflops, m->hack_ms, m->fp16_ms / m->hack_ms, m->quant_ms, m->fp16_ms / m->quant_ms,
                    m->quant_ms / m->hack_ms);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace slimkv::cuda

int main(int argc, char** argv) { return slimkv::cuda::run(argc, argv); }
