// KV in host memory on the GPU (issue 11): decode latency per step of a random-weight model (--shapes:
// llama2-7b, multi-head, where K+V is twice the hidden state; llama3-8b, GQA, where it is half) whose
// sequences hold --configs CONTEXTxBATCH tokens of random K/V (and X), side by side:
//   dense    every block resident in GPU memory (skipped when it does not fit)
//   offload  every token's K/V streamed from pinned host memory, layer by layer (FlexGen's way)
//   kvpr     the same with the cost model's split (kv/tier/kvpr_cost_model.h, the profiler's rates):
//            the K/V of the first l tokens recomputed from X while the rest streams in
// with each one's GPU memory for KV (staging), kvpr's extra GPU memory (X staging + scratch) and the
// pinned host memory; in the row-by-row schedule and/or (--schedules column, "/c") the column-by-
// column one, whose micro-batches let a batch exceed the staging budget (--gpu-kv-gb). Then, for
// --sweep configs, row-by-row kvpr at forced splits 0, 1/8, ..., 1: the best against the automatic
// split, and the cost model's time per layer against the measured one (the step's time over the
// layers, less dense's step: what the tier adds), written to --csv.
//
// --codec hack (--bits 2) runs every variant with the hack codec (decode steps move sealed blocks).
//
//   bench_kvpr_cuda --shapes llama2-7b,llama3-8b --configs 4096x1,16384x1,65536x1,4096x8 --sweep 16384x1
//       --csv kvpr_sweep.csv
#include <CLI/CLI.hpp>
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
  std::vector<std::string> shapes = {"llama2-7b", "llama3-8b"};
  std::vector<std::string> configs = {"4096x1", "16384x1", "32768x1"};
  std::vector<std::string> sweep = {"16384x1"};
  std::vector<std::string> schedules = {"row"};  // row, column
  double gpu_kv_gb = 0;  // the tiers' staging budget; 0: one layer of every sequence per buffer
  std::string codec = "dense";  // dense, hack, quant (at --bits)
  int bits = 2;
  int steps = 4;
  std::string profile;  // the profiler's cache; empty: the default path
  std::string csv;
};

using Config = ContextBatch;

struct Measured {
  double step_ms = 0;
  double split = 0;
  size_t gpu_kv_bytes = 0, gpu_extra_bytes = 0, host_bytes = 0;
  double kv_bytes_per_token = 0;  // per layer, what a decode step moves of a token not recomputed
};

// Makes the model with `tier` (none: resident), fills the batch's contexts and times --steps decode
// steps after one warm-up step.
Expected<Measured> measure(const ModelConfig& shape, const Config& config, const std::optional<KvTierOptions>& tier,
                           const Options& o) {
  CudaModelOptions options;
  options.max_sequences = config.batch;
  options.max_step_tokens = std::max(512, config.batch);
  options.max_context_tokens = config.context + o.steps + 2;
  options.tier = tier;
  double sealed_bytes_per_token = 0;  // per layer
  if (o.codec != "dense") {
    QuantizationConfig quantization;
    quantization.k_bits = quantization.v_bits = o.bits;
    options.quantized_kv = QuantizedKvOptions{quantization, o.codec == "hack", 0};
    const QuantizedBlockLayout layout(quantization, BlockShape{kCudaBlockTokens, int(shape.head_dim), int(shape.head_dim)});
    sealed_bytes_per_token = double(shape.num_kv_heads) * double(layout.block_bytes) / kCudaBlockTokens;
  }
  if (tier) {
    options.kv_cache_bytes = size_t(o.gpu_kv_gb * 1e9);
    // The host pool holds exactly the batch's contexts.
    const double per_token = double(shape.num_layers) * (4.0 * double(shape.kv_dim()) + sealed_bytes_per_token +
                                                         (tier->recompute ? 2.0 * double(shape.hidden_size) : 0.0));
    options.tier->host_bytes = size_t(per_token * config.batch * (options.max_context_tokens + 64));
  }
  SLIMKV_ASSIGN_OR_RETURN(std::unique_ptr<CudaLlamaModel> model, CudaLlamaModel::random(shape, 42, options));
  std::vector<int> sequences;
  for (int b = 0; b < config.batch; ++b) {
    SLIMKV_ASSIGN_OR_RETURN(int s, model->add_sequence());
    SLIMKV_RETURN_IF_ERROR(model->append_random_kv(s, config.context, uint64_t(b)));
    sequences.push_back(s);
  }
  std::vector<int32_t> next(size_t(config.batch), 1);
  Clock::time_point start;
  for (int step = 0; step <= o.steps; ++step) {
    if (step == 1) start = Clock::now();
    std::vector<SequenceTokens> tokens;
    for (int b = 0; b < config.batch; ++b) tokens.push_back({sequences[size_t(b)], std::span(&next[size_t(b)], 1)});
    SLIMKV_RETURN_IF_ERROR(model->step_greedy(tokens, next));
  }
  Measured m;
  m.step_ms = std::chrono::duration<double>(Clock::now() - start).count() / o.steps * 1e3;
  m.split = model->last_recompute_fraction();
  m.gpu_kv_bytes = model->kv_cache_bytes();
  m.gpu_extra_bytes = model->recompute_bytes();
  m.host_bytes = model->host_kv_bytes();
  m.kv_bytes_per_token = model->kvpr_cost_model().kv_bytes_per_token;
  return m;
}

void print_row(const std::string& shape, const Config& c, const char* variant, const Measured& m, double offload_ms) {
  std::printf("%-10s %7d %5d  %-8s %6.3f %10.2f %10.1f %9.2fx %8.2f %8.2f %8.2f\n", shape.c_str(), c.context, c.batch,
              variant, m.split, m.step_ms, c.batch / (m.step_ms / 1e3), offload_ms / m.step_ms, m.gpu_kv_bytes / 1e9,
              m.gpu_extra_bytes / 1e9, m.host_bytes / 1e9);
}

Status run(const Options& o) {
  SLIMKV_RETURN_IF_ERROR(device_usable());
  std::FILE* csv = o.csv.empty() ? nullptr : std::fopen(o.csv.c_str(), "w");
  if (!o.csv.empty() && csv == nullptr) return error("cannot write --csv ", o.csv);
  if (csv) std::fprintf(csv, "shape,context,batch,split,step_ms,measured_layer_ms,predicted_layer_ms\n");
  std::printf("%-10s %7s %5s  %-8s %6s %10s %10s %10s %8s %8s %8s\n", "shape", "context", "batch", "variant", "split",
              "ms/step", "tok/s", "vs offload", "GPU KV GB", "+kvpr GB", "host GB");
  for (const std::string& name : o.shapes) {
    SLIMKV_ASSIGN_OR_RETURN(const ModelConfig shape, random_shape(name));
    const std::string path = o.profile.empty() ? default_kvpr_profile_path() : o.profile;
    SLIMKV_ASSIGN_OR_RETURN(const KvprProfile profile,
                            load_or_measure_kvpr_profile(path, int(shape.hidden_size), int(2 * shape.kv_dim()), DType::kF16, false));
    std::printf("# %s: link %.1f GB/s, recompute GEMM %.0f TFLOP/s (profile %s)\n", name.c_str(),
                profile.link_bytes_per_s / 1e9, profile.gemm_flops_per_s / 1e12, path.c_str());
    const KvTierOptions offload{false, 0, 1, 0, profile.link_bytes_per_s, profile.gemm_flops_per_s};
    KvTierOptions kvpr = offload;
    kvpr.recompute = true;
    kvpr.split = -1;
    const auto compare = [&](const Config& c, bool sweep) -> Status {
      SLIMKV_ASSIGN_OR_RETURN(bool fits, resident_dense_fits(shape, c));
      Measured dense, row_streamed, row_recomputed;
      if (fits) {
        SLIMKV_ASSIGN_OR_RETURN(dense, measure(shape, c, std::nullopt, o));
      }
      for (const std::string& schedule : o.schedules) {
        // Column-by-column: micro-batches as the staging budget needs (at least 2).
        KvTierOptions scheduled_offload = offload, scheduled_kvpr = kvpr;
        scheduled_offload.micro_batches = scheduled_kvpr.micro_batches = schedule == "column" ? 0 : 1;
        const Expected<Measured> streamed_or = measure(shape, c, scheduled_offload, o);
        if (!streamed_or.has_value()) {  // e.g. row-by-row over the staging budget: say so, go on
          std::printf("# %s %dx%d %s: %s\n", name.c_str(), c.context, c.batch, schedule.c_str(),
                      streamed_or.status().message().c_str());
          continue;
        }
        const Measured streamed = *streamed_or;
        SLIMKV_ASSIGN_OR_RETURN(const Measured recomputed, measure(shape, c, scheduled_kvpr, o));
        if (schedule == "row") row_streamed = streamed, row_recomputed = recomputed;
        if (fits) print_row(name, c, "dense", dense, streamed.step_ms);
        print_row(name, c, schedule == "column" ? "offload/c" : "offload", streamed, streamed.step_ms);
        print_row(name, c, schedule == "column" ? "kvpr/c" : "kvpr", recomputed, streamed.step_ms);
      }
      if (!sweep) return Status::ok();
      if (row_streamed.step_ms == 0) return error("--sweep needs the row schedule in --schedules");
      // Forced splits: the best measured against the automatic one; the model's own cost model's time
      // per layer against the measured step less dense's.
      const KvprCostModel cost = kvpr_cost_model(shape, DType::kF16, row_recomputed.kv_bytes_per_token,
                                                 profile.link_bytes_per_s, profile.gemm_flops_per_s);
      const long held = long(c.batch) * (c.context + 1);
      double best_ms = 1e30, best_split = 0;
      for (int eighth = 0; eighth <= 8; ++eighth) {
        KvTierOptions forced = kvpr;
        forced.split = eighth / 8.0;
        SLIMKV_ASSIGN_OR_RETURN(const Measured m, measure(shape, c, forced, o));
        print_row(name, c, "kvpr=", m, row_streamed.step_ms);
        if (m.step_ms < best_ms) best_ms = m.step_ms, best_split = forced.split;
        const double measured_layer = (m.step_ms - dense.step_ms) / double(shape.num_layers);
        const double predicted_layer = cost.layer_seconds(std::lround(forced.split * double(held)), held) * 1e3;
        std::printf("#   split %.3f: per layer measured %.3f ms%s, the cost model predicts %.3f ms\n", forced.split, measured_layer,
                    fits ? "" : " (no dense: whole step)", predicted_layer);
        if (csv) {
          std::fprintf(csv, "%s,%d,%d,%.4f,%.4f,%.4f,%.4f\n", name.c_str(), c.context, c.batch, forced.split, m.step_ms,
                       measured_layer, predicted_layer);
        }
      }
      std::printf("# %s %dx%d: automatic split %.3f runs %.2f ms, best forced split %.3f runs %.2f ms: %.3fx the best\n",
                  name.c_str(), c.context, c.batch, row_recomputed.split, row_recomputed.step_ms, best_split, best_ms,
                  row_recomputed.step_ms / best_ms);
      return Status::ok();
    };
    for (const std::string& text : o.configs) {
      SLIMKV_ASSIGN_OR_RETURN(const Config c, parse_context_batch(text));
      SLIMKV_RETURN_IF_ERROR(compare(c, false));
    }
    for (const std::string& text : o.sweep) {
      if (text.empty()) continue;  // --sweep "": none
      SLIMKV_ASSIGN_OR_RETURN(const Config c, parse_context_batch(text));
      SLIMKV_RETURN_IF_ERROR(compare(c, true));
    }
  }
  if (csv) std::fclose(csv);
  return Status::ok();
}

}  // namespace
}  // namespace slimkv::cuda

int main(int argc, char** argv) {
  slimkv::cuda::Options o;
  CLI::App app{"Decode with the KV cache in host memory: resident dense vs offload vs kvpr (issue 11)"};
  app.add_option("--shapes", o.shapes, "random-weight model shapes: llama2-7b, llama3-8b")->delimiter(',');
  app.add_option("--configs", o.configs, "CONTEXTxBATCH, e.g. 4096x1,16384x4")->delimiter(',');
  app.add_option("--sweep", o.sweep, "configs also run at forced splits 0, 1/8, ..., 1")->delimiter(',');
  app.add_option("--schedules", o.schedules, "row (row-by-row), column (column-by-column)")
      ->delimiter(',')
      ->check(CLI::IsMember({"row", "column"}));
  app.add_option("--gpu-kv-gb", o.gpu_kv_gb, "the tiers' GPU staging budget in GB (0: a layer of every sequence per buffer)");
  app.add_option("--codec", o.codec, "the KV codec of every variant: dense, hack or quant")
      ->check(CLI::IsMember({"dense", "hack", "quant"}));
  app.add_option("--bits", o.bits, "hack / quant bits (K and V)")->check(CLI::IsMember({2, 4, 8}));
  app.add_option("--steps", o.steps, "decode steps timed per run (after one warm-up)")->check(CLI::PositiveNumber);
  app.add_option("--profile", o.profile, "the KVPR profiler's cache file (default: $XDG_CACHE_HOME/slimkv/...)");
  app.add_option("--csv", o.csv, "write the sweep's predicted and measured times per layer here");
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // rows as they are measured: runs are long
  const slimkv::Status status = slimkv::cuda::run(o);
  if (slimkv::cuda::failed(status)) return 1;
  return 0;
}
