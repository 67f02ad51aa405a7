// PQCache on the GPU (issue 25): decode step time of a random-weight model (--shape, Llama-3-8B's by
// default) whose sequences hold --configs CONTEXTxBATCH tokens of random K/V, side by side:
//   dense          every block resident in GPU memory (skipped when it does not fit)
//   dense@offload  every token's K/V streamed from pinned host memory, layer by layer
//   dense@kvpr     the same, part recomputed from X (the cost model's split)
//   pq@offload     pq:topk=<each of --topks>,cache=<each of --caches>: the PQ index on the GPU, only the
//                  selected tokens' K/V read from pinned host memory (kv/cuda/gpu_pq_kv.cc), those not
//                  found in the GPU cache of selected tokens (cache=0: none; kv/cuda/pq_token_cache.h);
//                  per --fp16-rows, the full blocks' K/V read from token-major copies of the pages (on)
//                  or from the pages themselves (off, the default: `rows=off`, what `rows=auto` picks)
//   pq+hack@offload  the same over HACK's sealed blocks of each of --hack-bits (rot=none): the selected
//                  tokens' codes and scales read from pinned host memory and dequantized on the GPU;
//                  per --hack-vlayouts, V's scales per column of a block (HACK's) or per token (KIVI's)
// with the K/V bytes a step moves over PCIe (offload: every token's; kvpr: the streamed part's K/V and
// the recomputed part's X; pq: what the selection reads from the host pages, or the payload of the
// sealed tokens' codes and per-token scales, which it reads from token-major copies of them (whole
// 32-byte sectors move; HACK's per-column V scales are copied to the GPU: docs/pq.md), GPU memory held
// for KV (pq: its index, selection buffer, scratch and cache), that per token of the batch's contexts, the pinned
// host memory, and pq's cache: the share of selected tokens found there and the bytes copied into it
// per step (GPU to GPU).
//
//   bench_pq_offload_cuda --configs 8192x1,32768x1,131072x1,8192x8,32768x8 --topks 0.2,1024 --caches 0,4096
//   bench_pq_offload_cuda --configs 8192x1,32768x1,131072x1 --topks 1024 --caches 0 --hack-bits 2 --hack-vlayouts channel,token
//   bench_pq_offload_cuda --configs 8192x1,32768x1,131072x1 --topks 1024 --caches 0 --fp16-rows on,off --variants pq
// --variants picks the kinds of rows (dense, offload, kvpr, pq, pq+hack): one kind and one config per
// process gives a step tracer (bench/cuda/step_trace) one variant's steps, the last ones it traces.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "kv/cuda/kvpr_profiler.h"
#include "model/cuda/llama_cuda.h"
#include "bench_errors.h"
#include "random_shapes.h"

namespace slimkv::cuda {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string shape = "llama3-8b";
  std::vector<std::string> configs = {"8192x1", "32768x1", "131072x1", "8192x8", "32768x8"};
  std::vector<double> topks = {0.2, 1024};
  std::vector<int> caches = {0, 4096};
  std::vector<int> hack_bits = {2};  // the pq+hack@offload rows: one per bits and V layout
  std::vector<std::string> hack_vlayouts = {"channel"};
  std::vector<std::string> fp16_rows = {"off"};  // the pq@offload rows: one per choice
  std::vector<std::string> variants = {"dense", "offload", "kvpr", "pq", "pq+hack"};
  int steps = 4;
};

using Config = ContextBatch;

struct Measured {
  double step_ms = 0, link_bytes = 0, selected = 1;
  double cache_hit = -1, cache_fill_bytes = 0;  // -1: no cache
  size_t gpu_kv_bytes = 0, host_bytes = 0;
};

// Fills the batch's contexts and times --steps decode steps after two warm-up steps (the first waits
// for the clustering of the filled contexts).
Expected<Measured> measure(const ModelConfig& shape, const Config& c, CudaModelOptions options, const Options& o) {
  options.max_sequences = c.batch;
  options.max_step_tokens = std::max(512, c.batch);
  options.max_context_tokens = c.context + o.steps + 4;
  if (options.tier) {
    const double per_token = double(shape.num_layers) * (4.0 * double(shape.kv_dim()) +
                                                         (options.tier->recompute ? 2.0 * double(shape.hidden_size) : 0.0));
    options.tier->host_bytes = size_t(per_token * c.batch * (options.max_context_tokens + 64));
  }
  SLIMKV_ASSIGN_OR_RETURN(std::unique_ptr<CudaLlamaModel> model, CudaLlamaModel::random(shape, 42, options));
  std::vector<int> sequences;
  for (int b = 0; b < c.batch; ++b) {
    SLIMKV_ASSIGN_OR_RETURN(int s, model->add_sequence());
    SLIMKV_RETURN_IF_ERROR(model->append_random_kv(s, c.context, uint64_t(b)));
    sequences.push_back(s);
  }
  std::vector<int32_t> next(size_t(c.batch), 1);
  Clock::time_point start;
  Measured m;
  for (int step = 0; step < o.steps + 2; ++step) {
    if (step == 2) start = Clock::now();
    std::vector<SequenceTokens> tokens;
    for (int b = 0; b < c.batch; ++b) tokens.push_back({sequences[size_t(b)], std::span(&next[size_t(b)], 1)});
    SLIMKV_RETURN_IF_ERROR(model->step_greedy(tokens, next));
  }
  m.step_ms = std::chrono::duration<double>(Clock::now() - start).count() / o.steps * 1e3;
  m.gpu_kv_bytes = model->kv_cache_bytes();
  m.host_bytes = model->host_kv_bytes();
  const SelectionReport selection = model->kv().selection();
  const double held = double(c.batch) * (c.context + o.steps + 2) * double(shape.num_layers);  // tokens × layers
  if (options.pq) {
    m.link_bytes = options.pq->offload ? double(selection.page_bytes_read) : 0;
    m.selected = double(selection.selected_tokens) / double(std::max(1L, selection.held_tokens));
    if (selection.cache_used_tokens > 0) {
      m.cache_hit = double(selection.cache_hit_tokens) / double(selection.cache_used_tokens);
      m.cache_fill_bytes = double(selection.cache_filled_bytes);
    }
  } else if (options.tier) {
    const double split = model->last_recompute_fraction();
    m.link_bytes = held * ((1 - split) * 4.0 * double(shape.kv_dim()) + split * 2.0 * double(shape.hidden_size));
  }
  return m;
}

Status run(const Options& o) {
  SLIMKV_RETURN_IF_ERROR(device_usable());
  SLIMKV_ASSIGN_OR_RETURN(ModelConfig shape, random_shape(o.shape));
  // Random weights: positions past the shape's trained length are as good as any (a context of 128K
  // and the steps after it).
  for (const std::string& text : o.configs) {
    SLIMKV_ASSIGN_OR_RETURN(const Config c, parse_context_batch(text));
    shape.max_position_embeddings = std::max<decltype(shape.max_position_embeddings)>(shape.max_position_embeddings,
                                                                                       c.context + o.steps + 64);
  }
  SLIMKV_ASSIGN_OR_RETURN(const KvprProfile profile,
                          load_or_measure_kvpr_profile(default_kvpr_profile_path(), int(shape.hidden_size),
                                                       int(2 * shape.kv_dim()), DType::kF16, false));
  std::printf("# %s, random weights; link %.1f GB/s, GEMM %.0f TFLOP/s\n", o.shape.c_str(), profile.link_bytes_per_s / 1e9,
              profile.gemm_flops_per_s / 1e12);
  std::printf("%7s %5s  %-50s %9s %11s %9s %11s %9s %10s %8s %9s %11s\n", "context", "batch", "variant", "ms/step",
              "vs offload", "selected", "PCIe MB/st", "GPU KV GB", "GPU KB/tok", "host GB", "cache hit", "fill MB/st");
  for (const std::string& text : o.configs) {
    SLIMKV_ASSIGN_OR_RETURN(const Config c, parse_context_batch(text));
    std::vector<std::pair<std::string, CudaModelOptions>> variants;
    const auto wanted = [&](const char* kind) { return std::find(o.variants.begin(), o.variants.end(), kind) != o.variants.end(); };
    SLIMKV_ASSIGN_OR_RETURN(const bool fits, resident_dense_fits(shape, c));
    if (fits && wanted("dense")) variants.emplace_back("dense", CudaModelOptions{});
    CudaModelOptions offload, kvpr;
    offload.tier = KvTierOptions{false, 0, 1, 0, profile.link_bytes_per_s, profile.gemm_flops_per_s};
    kvpr.tier = KvTierOptions{true, -1, 1, 0, profile.link_bytes_per_s, profile.gemm_flops_per_s};
    if (wanted("offload")) variants.emplace_back("dense@offload", offload);
    if (wanted("kvpr")) variants.emplace_back("dense@kvpr", kvpr);
    for (const double topk : o.topks) {
      for (const int cache : o.caches) {
        CudaModelOptions pq;
        PqOptions options;
        options.window.topk = topk;
        options.cache_tokens = cache;
        pq.pq = PqKvOptions{options, true, 0};
        for (const std::string& rows : wanted("pq") ? o.fp16_rows : std::vector<std::string>{}) {
          CudaModelOptions fp16 = pq;
          fp16.pq->pq.rows = rows;
          variants.emplace_back(str_cat("pq:topk=", topk, ",cache=", cache, ",rows=", rows, "@offload"), fp16);
        }
        for (const int bits : wanted("pq+hack") ? o.hack_bits : std::vector<int>{}) {
          for (const std::string& vlayout : o.hack_vlayouts) {
            QuantizationConfig quantization;
            quantization.k_bits = quantization.v_bits = bits;
            quantization.v_per_token = vlayout == "token";
            CudaModelOptions hack = pq;
            hack.quantized_kv = QuantizedKvOptions{quantization, true, 0};
            variants.emplace_back(str_cat("pq:topk=", topk, ",cache=", cache, "+hack:bits=", bits,
                                          vlayout == "token" ? ",vlayout=token" : "", ",rot=none@offload"),
                                  hack);
          }
        }
      }
    }
    double offload_ms = 0;
    for (const auto& [name, options] : variants) {
      const Expected<Measured> m = measure(shape, c, options, o);
      if (!m.has_value()) {
        std::printf("# %dx%d %s: %s\n", c.context, c.batch, name.c_str(), m.status().message().c_str());
        continue;
      }
      if (name == "dense@offload") offload_ms = m->step_ms;
      const std::string hit = m->cache_hit < 0 ? "-" : str_cat(int(100 * m->cache_hit + 0.5), "%");
      std::printf("%7d %5d  %-50s %9.2f %10.2fx %9.3f %11.1f %9.2f %10.2f %8.2f %9s %11.1f\n", c.context, c.batch,
                  name.c_str(), m->step_ms, offload_ms > 0 ? offload_ms / m->step_ms : 0.0, m->selected,
                  m->link_bytes / 1e6, m->gpu_kv_bytes / 1e9, double(m->gpu_kv_bytes) / 1e3 / (double(c.batch) * c.context),
                  m->host_bytes / 1e9, hit.c_str(), m->cache_fill_bytes / 1e6);
    }
  }
  return Status::ok();
}

}  // namespace
}  // namespace slimkv::cuda

int main(int argc, char** argv) {
  slimkv::cuda::Options o;
  CLI::App app{"PQCache on the GPU: decode with pq@offload against dense, dense@offload and dense@kvpr (issue 25)"};
  app.add_option("--shape", o.shape, "random-weight model shape: llama2-7b, llama3-8b");
  app.add_option("--configs", o.configs, "CONTEXTxBATCH, e.g. 8192x1,131072x1")->delimiter(',');
  app.add_option("--topks", o.topks, "pq's topk values (<= 1: a fraction; > 1: tokens)")->delimiter(',');
  app.add_option("--caches", o.caches, "pq's GPU cache sizes, tokens per layer and KV head (0: none)")->delimiter(',');
  app.add_option("--hack-bits", o.hack_bits, "bits of the pq+hack@offload rows (2, 4 or 8)")->delimiter(',');
  app.add_option("--hack-vlayouts", o.hack_vlayouts, "V scales of the pq+hack@offload rows: channel (HACK's), token")
      ->delimiter(',')
      ->check(CLI::IsMember({"channel", "token"}));
  app.add_option("--fp16-rows", o.fp16_rows, "pq@offload's full blocks read from token-major copies (on) or the pages (off)")
      ->delimiter(',')
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--variants", o.variants, "kinds of rows: dense, offload, kvpr, pq, pq+hack (default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember({"dense", "offload", "kvpr", "pq", "pq+hack"}));
  app.add_option("--steps", o.steps, "decode steps timed per run (after two warm-up steps)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const slimkv::Status status = slimkv::cuda::run(o);
  if (slimkv::cuda::failed(status)) return 1;
  return 0;
}
