// Decode attention on the GPU: one new query per sequence over a paged KV cache, batch of sequences
// of equal context, per context length (--new-tokens N: a causal prefill chunk of N queries per
// sequence at the end of the context instead; --new-tokens 0: the whole context, a full prefill). --kv dense reads FP16 blocks; --kv hack / quant reads
// blocks sealed at --bits (kv/cuda/quantized_kv_cache.h), the open block in FP16 (a prefill chunk:
// the sealed blocks before it, then FP16).
// --specs 'S1;S2;..' (hack / quant KV specs) instead of --kv/--bits: each spec's blocks (its layout:
// klayout, vlayout, groups, range) on the same shapes, side by side with its time over the first's.
// Prints time per step, GB/s of KV read (the bytes the kernel must read: sealed blocks as stored, the
// open block in FP16) and TFLOP/s, and writes them as JSON for bench/cuda/decode_attention_vs_sdpa.py,
// which runs PyTorch's SDPA on the same shapes in the same process run and prints all side by side.
//
//   bench_decode_attention_cuda --batch 8 --heads 32 --kv-heads 8 --head-dim 128 --kv hack --bits 2
//       --contexts 4096,16384,65536,131072 --json decode.json
//   bench_decode_attention_cuda --batch 1 --contexts 32768
//       --specs 'hack:bits=2;hack:bits=2,klayout=channel,vlayout=token'
// --integer-kernels tc,dp4a: each hack variant once per decode kernel for the integer products (2-bit
// HACK blocks of head_dim 128: INT8 tensor cores or dp4a; other blocks take dp4a either way).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "attention/cuda/paged_attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/random_fill.h"
#include "bench_errors.h"
#include "gpu_timing.h"
#include "kv/codec/codec.h"
#include "kv/codec/gpu_block_format.h"
#include "kv/kv_factory.h"
#include "random_kv.h"

namespace slimkv::cuda {
namespace {

struct Options {
  int batch = 8, heads = 32, kv_heads = 8, head_dim = 128;
  std::vector<int> contexts = {4096, 8192, 16384, 32768, 65536, 131072};
  int new_tokens = 1;    // queries per sequence: 1 is decode, 0 the whole context
  int tensor_core_min_queries = kPrefillMinQueries;  // 0: the CUDA-core kernel only
  std::string kv = "dense";  // dense, hack or quant
  int bits = 2;              // hack / quant
  std::vector<std::string> specs;  // instead of kv/bits: hack / quant specs side by side
  std::vector<std::string> integer_kernels = {"tc"};  // tc: 2-bit HACK decode on tensor cores; dp4a
  int repetitions = 30;  // timed groups; the median is reported
  std::string json;
};

// What one row measures: --kv/--bits, or one of --specs.
struct Variant {
  std::string name;
  std::string kv;  // dense, hack or quant
  int bits = 2;
  QuantizationConfig quantization;
  bool integer_tensor_cores = true;
};

Expected<Variant> spec_variant(const std::string& spec) {
  SLIMKV_ASSIGN_OR_RETURN(const KvPipeline pipeline, make_kv_pipeline(spec));
  const GpuBlockFormat format = pipeline.codec->gpu_block_format();
  if (format.kind != GpuBlockFormat::Kind::kQuantized || pipeline.block_tokens != kCudaBlockTokens) {
    return error("--specs: '", spec, "' is not a hack / quant spec the GPU runs (",
                 format.unsupported.empty() ? str_cat("pi=", pipeline.block_tokens) : format.unsupported, ")");
  }
  return Variant{spec, format.integer_attention ? "hack" : "quant", format.quantization.k_bits, format.quantization};
}

struct Measurement {
  int context;
  double ms_per_step;
  double kv_gb_per_s;
  double tflop_per_s;
  int splits;
  double seal_us_per_block;  // hack / quant: writing and sealing one block of one KV head (FP16 in, packed out)
};

Expected<Measurement> measure(const Options& o, const Variant& variant, int context) {
  const int new_tokens = o.new_tokens == 0 ? context : o.new_tokens;
  SLIMKV_ASSIGN_OR_RETURN(const RandomKv kv, random_kv({o.batch, context, new_tokens, o.kv_heads, o.head_dim, variant.kv,
                                                        variant.bits, variant.quantization}));
  SLIMKV_ASSIGN_OR_RETURN(auto attention, CudaPagedAttention::create({o.heads, o.kv_heads, o.head_dim, o.batch, o.batch * new_tokens,
                                                                        o.tensor_core_min_queries, variant.integer_tensor_cores}));
  const bool quantized = kv.quantized != nullptr;
  const double sealed_block_heads = double(o.batch) * (context / kCudaBlockTokens) * o.kv_heads;
  const double seal_us_per_block = quantized ? kv.append_ms * 1e3 / sealed_block_heads : 0.0;
  const size_t q_elements = size_t(o.batch) * new_tokens * o.heads * o.head_dim;
  SLIMKV_ASSIGN_OR_RETURN(auto q, DeviceArray<uint16_t>::allocate(q_elements, "queries"));
  SLIMKV_ASSIGN_OR_RETURN(auto out, DeviceArray<uint16_t>::allocate(q_elements, "outputs"));
  SLIMKV_RETURN_IF_ERROR(fill_random_fp16(q.data(), q_elements, 99, 1.0f));
  SLIMKV_RETURN_IF_ERROR(attention->plan({kv.ids, std::vector<int>(size_t(o.batch), context), std::vector<int>(size_t(o.batch), new_tokens)}));
  const float scale = 1.0f / std::sqrt(float(o.head_dim));
  const PagedKvView view = kv.view();
  const auto step = [&]() {
    return quantized ? attention->run_quantized(view, kv.quantized->sealed_view(0), q.data(), scale, out.data())
                     : attention->run(view, q.data(), scale, out.data());
  };
  SLIMKV_ASSIGN_OR_RETURN(const double median_ms,
                          median_launch_ms(step, o.repetitions, /*launches_per_group=*/10, /*warm_up=*/5));
  // Decode reads every full block sealed; a prefill chunk the blocks wholly before it.
  const int sealed_blocks = quantized ? (new_tokens == 1 ? context : context - new_tokens) / kCudaBlockTokens : 0;
  const double open_tokens = double(context - sealed_blocks * kCudaBlockTokens);
  const double kv_bytes = double(o.batch) * o.kv_heads *
                          (double(sealed_blocks) * (quantized ? double(kv.quantized->layout().block_bytes) : 0.0) +
                           2.0 * open_tokens * o.head_dim * 2);  // open (or dense) K and V in FP16
  // q·k and p·v: 4·d flops per (query head, visible token); query i of the chunk sees context - N + 1 + i.
  const double visible = double(new_tokens) * context - 0.5 * double(new_tokens) * (new_tokens - 1);
  const double flops = 4.0 * o.batch * o.heads * o.head_dim * visible;
  return Measurement{context, median_ms, kv_bytes / (median_ms * 1e-3) / 1e9, flops / (median_ms * 1e-3) / 1e12,
                     attention->num_splits(), seal_us_per_block};
}

int run(int argc, char** argv) {
  Options o;
  CLI::App app{"slimkv paged FP16 decode attention on the GPU"};
  app.add_option("--batch", o.batch)->capture_default_str();
  app.add_option("--heads", o.heads)->capture_default_str();
  app.add_option("--kv-heads", o.kv_heads)->capture_default_str();
  app.add_option("--head-dim", o.head_dim)->capture_default_str();
  app.add_option("--contexts", o.contexts)->delimiter(',');
  app.add_option("--new-tokens", o.new_tokens, "queries per sequence (1: decode, 0: the whole context)")->check(CLI::Range(0, 1 << 20))->capture_default_str();
  app.add_option("--tensor-core-min-queries", o.tensor_core_min_queries,
                 "queries of a sequence from which a step runs on tensor cores (0: never)")->capture_default_str();
  app.add_option("--repetitions", o.repetitions)->capture_default_str();
  app.add_option("--kv", o.kv, "dense, hack or quant")->check(CLI::IsMember({"dense", "hack", "quant"}))->capture_default_str();
  app.add_option("--bits", o.bits, "hack / quant bits (K and V)")->check(CLI::IsMember({2, 4, 8}))->capture_default_str();
  app.add_option("--specs", o.specs, "hack / quant KV specs, ';'-separated, side by side (instead of --kv, --bits)")
      ->delimiter(';');
  app.add_option("--integer-kernels", o.integer_kernels, "hack's decode kernels, side by side: tc (INT8 tensor cores "
                 "for 2-bit blocks of head_dim 128), dp4a")->delimiter(',')->check(CLI::IsMember({"tc", "dp4a"}));
  app.add_option("--json", o.json, "write the measurements here");
  CLI11_PARSE(app, argc, argv);
  std::vector<Variant> specs;
  for (const std::string& spec : o.specs) {
    auto variant = spec_variant(spec);
    if (failed(variant.status())) return 1;
    specs.push_back(*variant);
  }
  if (specs.empty()) specs.push_back({o.kv, o.kv, o.bits, QuantizationConfig{}});
  std::vector<Variant> variants;
  for (const Variant& spec : specs) {
    for (const std::string& kernel : o.integer_kernels) {
      if (spec.kv != "hack" && kernel != o.integer_kernels[0]) continue;  // one row for the kinds without integer products
      Variant variant = spec;
      variant.integer_tensor_cores = kernel == "tc";
      if (spec.kv == "hack" && o.integer_kernels.size() > 1) variant.name += str_cat(" [", kernel, "]");
      variants.push_back(variant);
    }
  }
  if (failed(device_usable())) return 1;

  const std::string new_tokens = o.new_tokens == 0 ? "the whole context" : str_cat(o.new_tokens);
  std::printf("attention, paged %s%s: batch %d, %s new tokens each, %d q / %d kv heads, d %d\n",
              o.specs.empty() ? o.kv.c_str() : "specs below", o.specs.empty() && o.kv != "dense" ? str_cat(" ", o.bits, "-bit").c_str() : "",
              o.batch, new_tokens.c_str(), o.heads, o.kv_heads, o.head_dim);
  std::printf("%10s %12s %12s %10s %8s %16s %9s  %s\n", "context", "ms/step", "KV GB/s", "TFLOP/s", "splits", "seal us/block",
              "vs first", "kv");
  std::vector<Measurement> results;
  for (int context : o.contexts) {
    double first_ms = 0;
    for (const Variant& variant : variants) {
      auto m = measure(o, variant, context);
      if (failed(m.status())) return 1;
      if (first_ms == 0) first_ms = m->ms_per_step;
      std::printf("%10d %12.4f %12.1f %10.2f %8d %16.4f %8.2fx  %s\n", m->context, m->ms_per_step, m->kv_gb_per_s,
                  m->tflop_per_s, m->splits, m->seal_us_per_block, m->ms_per_step / first_ms, variant.name.c_str());
      results.push_back(*m);
    }
  }
  if (!o.json.empty()) {
    std::ofstream file(o.json);
    file << "[";
    for (size_t i = 0; i < results.size(); ++i) {
      file << (i ? "," : "") << "{\"context\":" << results[i].context << ",\"ms\":" << results[i].ms_per_step
           << ",\"gb_per_s\":" << results[i].kv_gb_per_s << ",\"tflop_per_s\":" << results[i].tflop_per_s
           << ",\"splits\":" << results[i].splits << "}";
    }
    file << "]\n";
  }
  return 0;
}

}  // namespace
}  // namespace slimkv::cuda

int main(int argc, char** argv) { return slimkv::cuda::run(argc, argv); }
