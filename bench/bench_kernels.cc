// Kernel benchmark: each optimized CPU kernel next to the plain reference it is tested against, and
// the KV codecs next to each other. Google Benchmark times every variant (benchmark_runner.h).
//   bench_kernels [--threads N] [--contexts 1024,4096,...] [--layouts [--layout-specs 'A;B'] [--rounds N]]
//                 [--prefill-gemm ROUNDS] [--decode-gemm ROUNDS] [--quant-dot ROUNDS]
// Attention: decode (one query token) and prefill with the Llama-3-8B shape (32 query / 8 KV heads,
// d = 128) over the paged store: dense FP32 and FP16, quant and hack 2-bit, and the FP64 reference. GEMM: y = x·Wᵀ for F32 and
// BF16 weights, BLAS (+ widening) against the FP64 triple loop (at sizes where that finishes). Prefill
// GEMM (--prefill-gemm): the Llama-3-8B projections for 512 tokens, BF16 weights, one thread, the
// portable FP32 panel kernel against the AVX-512 BF16 and AMX tiers (where the CPU has them), alternating.
// BF16 decode products (--decode-gemm): 1, 4 and 16 inputs, matvec_half against the AMX tiles on packed panels.
// Quantized decode (--quant-dot): one input times the Llama-3-8B matrices in Q8_0, Q4_0, Q4_K and Q6_K, one
// thread: each row widened to FP32 (SLIMKV_QUANT_DOT=f32) against the integer tiers the CPU has (the input's
// 8-bit quantization included in their time), alternating.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "attention/cpu/hack_block_attention.h"
#include "attention/reference.h"
#include "backend/cpu/bf16_gemm.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/dequantize.h"
#include "backend/cpu/panel_gemm.h"
#include "backend/cpu/quant_dot.h"
#include "backend/cpu/vec_ops.h"
#include "benchmark_runner.h"
#include "../tests/backend/random_ggml_blocks.h"
#include "kv/store_attention.h"
#include "slimkv/status.h"
#include "util/half.h"

namespace slimkv {
namespace {

constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128;

// Random K, V (one sequence of `context` tokens) and one query token, the Llama-3-8B shape.
struct DecodeInputs {
  std::vector<float> k, v, q;
  DecodeInputs(int context, std::mt19937& rng) : k(size_t(context) * kKvHeads * kHeadDim), v(k.size()), q(size_t(kHeads) * kHeadDim) {
    std::normal_distribution<float> normal;
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    for (float& x : q) x = normal(rng);
  }
};

// A store of `spec` holding the inputs (one sequence of `context` tokens).
std::unique_ptr<KvStore> decode_store(const std::string& spec, int context, const DecodeInputs& in) {
  auto pipeline = make_kv_pipeline(spec);
  if (!pipeline) {
    std::fprintf(stderr, "%s\n", pipeline.status().message().c_str());
    std::exit(2);
  }
  auto store = std::make_unique<KvStore>(KvShape{1, kKvHeads, kHeadDim, kHeadDim, context}, *pipeline);
  store->append(0, in.k.data(), in.v.data(), context);
  return store;
}

// Times one decode step's attention (the sequence's last token) over `store`.
double decode_ms(const std::string& name, const KvStore& store, int context, const DecodeInputs& in, ThreadPool& pool) {
  std::vector<float> out(size_t(kHeads) * kHeadDim);
  const AttentionParams params{kHeads, 1.0f / std::sqrt(float(kHeadDim)), &pool};
  return measure_ms("decode/" + name + "/" + std::to_string(context),
                    [&] { attend(store, 0, in.q.data(), 1, context - 1, params, out.data()); });
}

// Times one decode step's attention over a store of `spec` holding the inputs; sealed_bytes: its size.
double decode_ms(const std::string& spec, int context, const DecodeInputs& in, ThreadPool& pool, double* sealed_bytes) {
  const auto store = decode_store(spec, context, in);
  if (sealed_bytes) *sealed_bytes = double(store->memory().sealed_bytes);
  return decode_ms(spec, *store, context, in, pool);
}

// The scale layouts of issue 28 next to HACK's (the first spec), on the integers (hack) and dequantized
// (quant, kivi). Every store is built once; the specs are then timed in turn, `rounds` times (A B A B),
// each ratio against the first spec's time of the same round.
void bench_layouts(const std::vector<int>& contexts, const std::vector<std::string>& specs, int rounds,
                   ThreadPool& pool) {
  std::printf("\n== decode attention by scale layout, 1 query token, %d/%d heads, d=%d, %d threads, hack kernel on %s ==\n",
              kHeads, kKvHeads, kHeadDim, pool.threads(), hack_kernel_target());
  std::printf("%5s %8s %-72s %10s %10s %10s\n", "round", "context", "spec", "ms", "x first", "B/token");
  std::mt19937 rng(42);
  for (int context : contexts) {
    const DecodeInputs in(context, rng);
    std::vector<std::unique_ptr<KvStore>> stores;
    for (const std::string& spec : specs) stores.push_back(decode_store(spec, context, in));
    for (int round = 1; round <= rounds; ++round) {
      double base = 0;
      for (size_t i = 0; i < specs.size(); ++i) {
        const double ms = decode_ms(specs[i], *stores[i], context, in, pool);
        if (i == 0) base = ms;
        std::printf("%5d %8d %-72s %10.3f %10.2f %10.1f\n", round, context, specs[i].c_str(), ms, ms / base,
                    double(stores[i]->memory().sealed_bytes) / context / kKvHeads);
        std::fflush(stdout);
      }
    }
  }
}

void bench_attention(const std::vector<int>& contexts, ThreadPool& pool) {
  const int threads = pool.threads();
  const int num_heads = kHeads, num_kv_heads = kKvHeads, d = kHeadDim;
  const std::vector<std::string> specs = {"dense", "dense:dtype=f16", "quant:bits=2,pi=64", "hack:bits=2,pi=64"};
  std::printf("\n== decode attention, 1 query token, %d/%d heads, d=%d, %d threads, hack kernel on %s ==\n",
              num_heads, num_kv_heads, d, threads, hack_kernel_target());
  std::printf("%8s %12s", "context", "ref f64 ms");
  for (const std::string& spec : specs) std::printf(" %20s", (spec + " ms").c_str());
  std::printf(" %10s %10s %12s\n", "hack/f16", "hack/quant", "hack GB/s");
  std::mt19937 rng(42);
  for (int context : contexts) {
    const DecodeInputs in(context, rng);
    const std::vector<float>&k = in.k, &v = in.v, &q = in.q;
    std::vector<float> out(size_t(num_heads) * d);
    const AttentionParams params{num_heads, 1.0f / std::sqrt(float(d)), &pool};
    std::vector<double> ms;
    double hack_bytes = 0;
    for (const std::string& spec : specs) ms.push_back(decode_ms(spec, context, in, pool, &hack_bytes));
    const int position = context - 1;
    const double ref_ms = context <= 8192 ? measure_ms("decode/reference/" + std::to_string(context), [&] {
      attention_reference(q.data(), 1, &position, k.data(), v.data(), context, num_heads, num_kv_heads, d, d,
                          params.scale, out.data());
    }, 0.2) : NAN;
    std::printf("%8d %12.3f", context, ref_ms);
    for (double t : ms) std::printf(" %20.3f", t);
    std::printf(" %10.2f %10.2f %12.1f\n", ms[1] / ms[3], ms[2] / ms[3], hack_bytes / (ms[3] * 1e6));
  }
}

// Prefill: every query of a prompt against the causal prefix, through the same block kernels on tiles.
// prefill=quantized: the prompt is appended in one chunk, which prefill=exact would read whole in FP32.
void bench_prefill_attention(int tokens, ThreadPool& pool) {
  const int threads = pool.threads();
  const int num_heads = 32, num_kv_heads = 8, d = 128;
  const std::vector<std::string> specs = {"dense", "dense:dtype=f16", "quant:bits=2,pi=64,prefill=quantized",
                                          "hack:bits=2,pi=64,prefill=quantized"};
  std::printf("\n== prefill attention, %d tokens causal, %d/%d heads, d=%d, %d threads ==\n", tokens, num_heads,
              num_kv_heads, d, threads);
  std::mt19937 rng(43);
  std::normal_distribution<float> normal;
  std::vector<float> k(size_t(tokens) * num_kv_heads * d), v(k.size()), q(size_t(tokens) * num_heads * d);
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  for (float& x : q) x = normal(rng);
  std::vector<float> out(q.size());
  const AttentionParams params{num_heads, 1.0f / std::sqrt(float(d)), &pool};
  std::vector<double> ms;
  for (const std::string& spec : specs) {
    auto pipeline = make_kv_pipeline(spec);
    KvStore store({1, num_kv_heads, d, d, tokens}, *pipeline);
    store.append(0, k.data(), v.data(), tokens);
    ms.push_back(measure_ms("prefill/" + spec, [&] { attend(store, 0, q.data(), tokens, 0, params, out.data()); }, 1.0));
    std::printf("%-22s %10.1f ms  %6.2fx dense f16\n", spec.c_str(), ms.back(), ms.size() > 1 ? ms[1] / ms.back() : NAN);
  }
}

void bench_gemm(ThreadPool& pool) {
  std::printf("\n== GEMM y = x·Wᵀ (W rows × cols) ==\n");
  std::printf("%6s %6s %6s %6s %14s %14s %10s %10s\n", "n", "rows", "cols", "dtype", "reference ms", "optimized ms",
              "GFLOP/s", "ref/opt");
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  struct Shape {
    int n, rows, cols;
  };
  for (const Shape shape : {Shape{1, 4096, 4096}, Shape{1, 14336, 4096}, Shape{64, 1024, 1024}, Shape{512, 1024, 1024}}) {
    std::vector<float> x(size_t(shape.n) * shape.cols), w32(size_t(shape.rows) * shape.cols);
    for (float& e : x) e = normal(rng);
    for (float& e : w32) e = normal(rng);
    std::vector<uint16_t> w16(w32.size());
    for (size_t i = 0; i < w32.size(); ++i) w16[i] = float_to_bf16(w32[i]);
    std::vector<float> y(size_t(shape.n) * shape.rows);
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      const WeightMatrix w{dtype == DType::kF32 ? static_cast<const void*>(w32.data()) : w16.data(), dtype,
                           shape.rows, shape.cols};
      const std::string name = str_cat("gemm/", dtype_name(dtype), "/", shape.n, "x", shape.rows, "x", shape.cols);
      const double opt_ms = measure_ms(name, [&] { matmul(x.data(), shape.n, w, y.data(), pool); });
      const bool small = double(shape.n) * shape.rows * shape.cols <= 1e8;
      const double ref_ms =
          small ? measure_ms(name + "/reference", [&] { matmul_reference(x.data(), shape.n, w, y.data()); }, 0.2) : NAN;
      const double flops = 2.0 * shape.n * shape.rows * shape.cols;
      std::printf("%6d %6d %6d %6s %14.3f %14.3f %10.1f %10.1f\n", shape.n, shape.rows, shape.cols,
                  std::string(dtype_name(dtype)).c_str(), ref_ms, opt_ms, flops / (opt_ms * 1e6), ref_ms / opt_ms);
    }
  }
}

// One thread, whole matrices: panel_gemm (BF16 widened to FP32, FMAs) and each BF16 tier the CPU has
// (bf16_gemm.h: AVX-512 BF16, AMX; split activations included in their time), each run `rounds` times in
// turn so that drift hits all alike. Speedups are against panel_gemm.
void bench_prefill_gemm(int rounds) {
  std::printf("\n== prefill GEMM, BF16 weights, 512 inputs, one thread (Llama-3-8B projections) ==\n");
  const Bf16GemmTier tiers[] = {Bf16GemmTier::kAvx512Bf16, Bf16GemmTier::kAmx};
  for (const Bf16GemmTier tier : tiers) {
    if (!bf16_gemm_tier_supported(tier)) std::printf("(no %s tier on this CPU: its columns are nan)\n", bf16_gemm_tier_name(tier));
  }
  std::printf("%6s %6s %6s %6s %10s %8s", "round", "n", "rows", "cols", "panel ms", "GFLOP/s");
  for (const Bf16GemmTier tier : tiers) std::printf(" %14s %8s %8s", str_cat(bf16_gemm_tier_name(tier), " ms").c_str(), "GFLOP/s", "speedup");
  std::printf(" %14s %8s %8s\n", "amx-packed ms", "GFLOP/s", "speedup");
  const bool amx = bf16_gemm_tier_supported(Bf16GemmTier::kAmx);
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  const int n = 512;
  struct Shape {
    int rows, cols;
  };
  for (const Shape shape : {Shape{4096, 4096}, Shape{14336, 4096}, Shape{4096, 14336}}) {
    std::vector<float> x(size_t(n) * shape.cols);
    for (float& e : x) e = normal(rng);
    std::vector<uint16_t> w(size_t(shape.rows) * shape.cols);
    for (uint16_t& e : w) e = float_to_bf16(normal(rng));
    std::vector<float> y(size_t(n) * shape.rows);
    const double flops = 2.0 * n * shape.rows * shape.cols;
    Bf16SplitActivations split;
    const Bf16Panels packed = amx ? bf16_pack_panels(w.data(), shape.rows, shape.cols) : nullptr;
    for (int round = 1; round <= rounds; ++round) {
      const std::string name = str_cat(n, "x", shape.rows, "x", shape.cols);
      const double panel_ms = measure_ms("panel/" + name, [&] {
        panel_gemm(x.data(), n, w.data(), DType::kBF16, shape.rows, shape.cols, 0, shape.rows, y.data());
      }, 0.2);
      std::printf("%6d %6d %6d %6d %10.1f %8.1f", round, n, shape.rows, shape.cols, panel_ms, flops / (panel_ms * 1e6));
      for (const Bf16GemmTier tier : tiers) {
        const double ms = !bf16_gemm_tier_supported(tier) ? NAN : measure_ms(str_cat(bf16_gemm_tier_name(tier), "/", name), [&] {
          bf16_split_prepare(n, shape.cols, split);
          bf16_split_rows(x.data(), 0, n, split);
          bf16_gemm(tier, split, w.data(), nullptr, shape.rows, 0, shape.rows, y.data());
        }, 0.2);
        std::printf(" %14.1f %8.1f %7.2fx", ms, flops / (ms * 1e6), panel_ms / ms);
      }
      // AMX from panels packed at load (the model's layer weights where the CPU has AMX): no gathers per call.
      const double packed_ms = !packed ? NAN : measure_ms("amx-packed/" + name, [&] {
        bf16_split_prepare(n, shape.cols, split);
        bf16_split_rows(x.data(), 0, n, split);
        bf16_gemm(Bf16GemmTier::kAmx, split, w.data(), packed.get(), shape.rows, 0, shape.rows, y.data());
      }, 0.2);
      std::printf(" %14.1f %8.1f %7.2fx", packed_ms, flops / (packed_ms * 1e6), panel_ms / packed_ms);
      std::printf("\n");
    }
  }
}

// One thread, a decode step of 1, 4 or 16 inputs, whole matrices of the bundled model and of Llama-3-8B:
// matvec_half (BF16 widened in registers, the path of CPUs without AMX) against the AMX tiles on panels
// packed at load (bf16_decode_gemm, the activations' split included in its time), each run `rounds` times in
// turn. GB/s: weight bytes read per second; speedups are against matvec_half.
void bench_decode_gemm(int rounds) {
  std::printf("\n== decode products, BF16 weights, one thread ==\n");
  const bool amx = bf16_gemm_tier_supported(Bf16GemmTier::kAmx);
  if (!amx) std::printf("(no AMX tier on this CPU: its columns are nan)\n");
  std::printf("%5s %3s %6s %6s %12s %6s %12s %6s %8s\n", "round", "n", "rows", "cols", "matvec ms", "GB/s", "amx ms",
              "GB/s", "speedup");
  std::mt19937 rng(15);
  std::normal_distribution<float> normal;
  struct Shape {
    int64_t rows, cols;
  };
  for (const Shape shape : {Shape{512, 384}, Shape{768, 384}, Shape{384, 768}, Shape{8192, 384}, Shape{4096, 4096},
                            Shape{14336, 4096}}) {
    std::vector<uint16_t> w(size_t(shape.rows * shape.cols));
    for (uint16_t& e : w) e = float_to_bf16(normal(rng));
    const Bf16Panels packed = amx ? bf16_pack_panels(w.data(), shape.rows, shape.cols) : nullptr;
    const double gigabytes = double(w.size()) * 2e-9;
    for (const int64_t n : {1, 4, 16}) {
      std::vector<float> x(size_t(n * shape.cols)), y(size_t(n * shape.rows));
      for (float& e : x) e = normal(rng);
      Bf16SplitActivations split;
      const std::string name = str_cat(n, "x", shape.rows, "x", shape.cols);
      for (int round = 1; round <= rounds; ++round) {
        const double matvec_ms = measure_ms("matvec/" + name, [&] {
          matvec_half(x.data(), n, w.data(), DType::kBF16, shape.rows, shape.cols, 0, shape.rows, y.data());
        }, 0.2);
        const double amx_ms = !amx ? NAN : measure_ms("amx-decode/" + name, [&] {
          bf16_split_prepare(n, shape.cols, split);
          bf16_split_rows(x.data(), 0, n, split);
          bf16_decode_gemm(split, packed.get(), shape.rows, 0, shape.rows, y.data());
        }, 0.2);
        std::printf("%5d %3ld %6ld %6ld %12.4f %6.1f %12.4f %6.1f %7.2fx\n", round, long(n), long(shape.rows),
                    long(shape.cols), matvec_ms, gigabytes / (matvec_ms * 1e-3), amx_ms, gigabytes / (amx_ms * 1e-3),
                    matvec_ms / amx_ms);
      }
    }
  }
}

// One thread, one input (a decode step), whole matrices: the FP32 path (matvec_quantized: each row dequantized
// to FP32, FMAs) against each integer tier the CPU has (quant_dot.h, quantize_activations included), each run
// `rounds` times in turn. GB/s: weight bytes read per second; speedups are against the FP32 path.
void bench_quant_dot(int rounds) {
  std::printf("\n== quantized decode products, 1 input, one thread (Llama-3-8B matrices) ==\n");
  const QuantDotTier tiers[] = {QuantDotTier::kScalar, QuantDotTier::kAvx2, QuantDotTier::kAvxVnni,
                                QuantDotTier::kAvx512Vnni};
  for (const QuantDotTier tier : tiers) {
    if (!quant_dot_tier_supported(tier)) std::printf("(no %s tier on this CPU: its columns are nan)\n", quant_dot_tier_name(tier));
  }
  std::printf("%5s %5s %6s %6s %9s %6s", "round", "quant", "rows", "cols", "f32 ms", "GB/s");
  for (const QuantDotTier tier : tiers) std::printf(" %14s %6s %8s", str_cat(quant_dot_tier_name(tier), " ms").c_str(), "GB/s", "speedup");
  std::printf("\n");
  std::mt19937 rng(13);
  std::normal_distribution<float> normal;
  struct Shape {
    int64_t rows, cols;
  };
  for (const Shape shape : {Shape{4096, 4096}, Shape{14336, 4096}, Shape{4096, 14336}}) {
    std::vector<float> x(size_t(shape.cols)), y(size_t(shape.rows));
    for (float& e : x) e = normal(rng);
    for (const BlockQuant quant : {BlockQuant::kQ8_0, BlockQuant::kQ4_0, BlockQuant::kQ4_K, BlockQuant::kQ6_K}) {
      const std::vector<uint8_t> w = test::random_blocks(quant, shape.rows * shape.cols, rng);
      const double gigabytes = double(w.size()) * 1e-9;
      const std::string name = str_cat(block_quant_name(quant), "/", shape.rows, "x", shape.cols);
      QuantizedActivations quantized;
      for (int round = 1; round <= rounds; ++round) {
        const double f32_ms = measure_ms("f32/" + name, [&] {
          matvec_quantized(x.data(), 1, w.data(), quant, shape.rows, shape.cols, 0, shape.rows, y.data());
        }, 0.2);
        std::printf("%5d %5s %6ld %6ld %9.2f %6.1f", round, std::string(block_quant_name(quant)).c_str(), long(shape.rows),
                    long(shape.cols), f32_ms, gigabytes / (f32_ms * 1e-3));
        for (const QuantDotTier tier : tiers) {
          const double ms = !quant_dot_tier_supported(tier) ? NAN : measure_ms(str_cat(quant_dot_tier_name(tier), "/", name), [&] {
            quantize_activations(tier, x.data(), 1, shape.cols, quantized);
            matvec_quant_dot(tier, quantized, w.data(), quant, shape.rows, 0, shape.rows, y.data());
          }, 0.2);
          std::printf(" %14.2f %6.1f %7.2fx", ms, gigabytes / (ms * 1e-3), f32_ms / ms);
        }
        std::printf("\n");
      }
    }
  }
}

}  // namespace
}  // namespace slimkv

int main(int argc, char** argv) {
  CLI::App app{"slimkv kernel benchmark: optimized kernels next to their references"};
  int threads = 2;
  std::vector<int> contexts = {1024, 4096, 16384, 32768, 65536};
  app.add_option("--threads", threads, "threads")->capture_default_str();
  app.add_option("--contexts", contexts, "KV lengths for decode attention")->delimiter(',');
  int prefill_tokens = 4096;
  app.add_option("--prefill", prefill_tokens, "prompt length for prefill attention (0: skip)")->capture_default_str();
  bool layouts_only = false;
  app.add_flag("--layouts", layouts_only, "only decode attention by K/V scale layout (issue 28)");
  std::vector<std::string> layout_specs = {
      "hack:bits=2,pi=64", "hack:bits=2,pi=64,klayout=channel", "hack:bits=2,pi=64,klayout=channel,vlayout=token",
      "hack:bits=2,pi=128,klayout=channel,kgroup=32,vlayout=token,vgroup=32", "quant:bits=2,pi=64,klayout=channel,vlayout=token",
      "kivi:bits=2"};
  app.add_option("--layout-specs", layout_specs, "--layouts: the KV specs, ';'-separated (ratios against the first)")
      ->delimiter(';')
      ->capture_default_str();
  int layout_rounds = 1;
  app.add_option("--rounds", layout_rounds, "--layouts: times every spec is timed, in turn")->capture_default_str();
  int prefill_gemm_rounds = 0;
  app.add_option("--prefill-gemm", prefill_gemm_rounds, "only the prefill GEMM kernels, this many alternating rounds");
  int decode_gemm_rounds = 0;
  app.add_option("--decode-gemm", decode_gemm_rounds, "only the BF16 decode products (matvec vs AMX), this many alternating rounds");
  int quant_dot_rounds = 0;
  app.add_option("--quant-dot", quant_dot_rounds, "only the quantized decode products, this many alternating rounds");
  CLI11_PARSE(app, argc, argv);
  if (quant_dot_rounds > 0) {
    slimkv::bench_quant_dot(quant_dot_rounds);
    return 0;
  }
  if (decode_gemm_rounds > 0) {
    slimkv::bench_decode_gemm(decode_gemm_rounds);
    return 0;
  }
  if (prefill_gemm_rounds > 0) {
    slimkv::bench_prefill_gemm(prefill_gemm_rounds);
    return 0;
  }
  slimkv::ThreadPool pool(threads);
  if (layouts_only) {
    slimkv::bench_layouts(contexts, layout_specs, layout_rounds, pool);
    return 0;
  }
  slimkv::bench_attention(contexts, pool);
  if (prefill_tokens > 0) slimkv::bench_prefill_attention(prefill_tokens, pool);
  slimkv::bench_gemm(pool);
  return 0;
}
