// End-to-end decode on the GPU (issue 9): the whole forward pass (model/cuda/llama_cuda.h) of a batch
// of sequences, each first prefilled with --prompt random tokens, then --steps greedy decode steps.
// Models: a directory (--model, e.g. the bundled one) and/or --random llama3-8b (random FP16 weights
// of Llama-3-8B's shape generated on the GPU: nothing to download). Prints per model and batch size:
// prefill tokens/s, decode ms per step, decode tokens/s (all sequences), and the step's time against
// the memory roofline (weights + KV read once per step at --bandwidth GB/s): decode at small batch is
// a weight-streaming problem, so that ratio says how much launch and kernel overhead costs.
//
//   bench_decode_e2e_cuda --model models/slimkv-llama-14m --random llama3-8b --batches 1,16 --prompt 1024
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "model/cuda/llama_cuda.h"
#include "model/llama.h"

namespace slimkv::cuda {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string model_dir;
  std::string random;  // "llama3-8b"
  std::vector<int> batches = {1, 16};
  int prompt = 1024;
  int steps = 64;
  double bandwidth_gb_s = 3000;  // H100 HBM3, device-to-device copy (../shared/GPU.md)
};

ModelConfig llama3_8b_config() {
  ModelConfig c;
  c.architecture_name = "LlamaForCausalLM (random weights)";
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_layers = 32;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5;
  c.rope = {RopeType::kLlama3, 500000.0, 8.0, 1.0, 4.0, 8192};
  return c;
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

Status run_batch(CudaLlamaModel& model, const Options& o, int batch) {
  const ModelConfig& c = model.config();
  std::vector<int> sequences;
  for (int b = 0; b < batch; ++b) {
    SLIMKV_ASSIGN_OR_RETURN(int s, model.add_sequence());
    sequences.push_back(s);
  }
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> id(0, int32_t(c.vocab_size) - 1);
  std::vector<std::vector<int32_t>> prompts(size_t(batch), std::vector<int32_t>(size_t(o.prompt)));
  for (auto& p : prompts) {
    for (int32_t& t : p) t = id(rng);
  }
  // Prefill: each sequence in chunks that fill a step.
  std::vector<int32_t> next(static_cast<size_t>(batch));
  const int chunk = 512;
  SLIMKV_RETURN_IF_ERROR(device_synchronize("before prefill"));
  const auto prefill_start = Clock::now();
  for (int b = 0; b < batch; ++b) {
    std::vector<int32_t> last;
    for (int first = 0; first < o.prompt; first += chunk) {
      const std::span<const int32_t> part(prompts[size_t(b)].data() + first, size_t(std::min(chunk, o.prompt - first)));
      const SequenceTokens step{sequences[size_t(b)], part};
      SLIMKV_RETURN_IF_ERROR(model.step_greedy(std::span(&step, 1), last));
    }
    next[size_t(b)] = last[0];
  }
  const double prefill_s = seconds_since(prefill_start);
  // Decode: every sequence one token per step; the first steps warm up.
  constexpr int kWarmup = 4;
  Clock::time_point decode_start;
  for (int step = 0; step < kWarmup + o.steps; ++step) {
    if (step == kWarmup) decode_start = Clock::now();
    std::vector<SequenceTokens> tokens;
    for (int b = 0; b < batch; ++b) tokens.push_back({sequences[size_t(b)], std::span(&next[size_t(b)], 1)});
    std::vector<int32_t> greedy;
    SLIMKV_RETURN_IF_ERROR(model.step_greedy(tokens, greedy));
    next = greedy;
  }
  const double decode_s = seconds_since(decode_start);
  const double step_ms = decode_s / o.steps * 1e3;
  const double context = o.prompt + kWarmup + o.steps / 2.0;  // the average over the timed steps
  const double kv_bytes = double(batch) * context * double(c.num_layers) * 2 * double(c.kv_dim()) * 2;
  const double roofline_ms = (double(model.weight_bytes()) + kv_bytes) / (o.bandwidth_gb_s * 1e9) * 1e3;
  std::printf("%-34s %5d %8d %12.0f %10.3f %12.1f %10.3f %9.2f\n", c.architecture_name.c_str(), batch, o.prompt,
              double(batch) * o.prompt / prefill_s, step_ms, batch / (step_ms / 1e3), roofline_ms, roofline_ms / step_ms);
  for (int s : sequences) model.remove_sequence(s);
  return Status::ok();
}

Status run_model(CudaLlamaModel& model, const Options& o) {
  std::printf("# %s: %.2f GB of %s weights on the GPU, KV pool %.2f GB (%d blocks of 64 tokens)\n",
              model.config().architecture_name.c_str(), model.weight_bytes() / 1e9,
              model.weight_dtype() == DType::kBF16 ? "BF16" : "FP16", model.kv_cache_bytes() / 1e9,
              model.kv_cache_blocks());
  for (int batch : o.batches) SLIMKV_RETURN_IF_ERROR(run_batch(model, o, batch));
  return Status::ok();
}

CudaModelOptions model_options(const Options& o, const ModelConfig& config) {
  CudaModelOptions options;
  options.max_sequences = 1;
  for (int b : o.batches) options.max_sequences = std::max(options.max_sequences, b);
  options.max_step_tokens = std::max(512, options.max_sequences);
  options.max_context_tokens = int(std::min<int64_t>(config.max_position_embeddings, o.prompt + o.steps + 64));
  return options;
}

Status run(const Options& o) {
  SLIMKV_RETURN_IF_ERROR(device_usable());
  std::printf("%-34s %5s %8s %12s %10s %12s %10s %9s\n", "model", "batch", "prompt", "prefill t/s", "step ms",
              "decode t/s", "roof ms", "of roof");
  if (!o.model_dir.empty()) {
    SLIMKV_ASSIGN_OR_RETURN(auto cpu_model, LlamaModel::load(o.model_dir));
    if (o.prompt + o.steps + 4 > cpu_model->config().max_position_embeddings) {
      return error("--prompt ", o.prompt, " + --steps ", o.steps, " is over the model's context");
    }
    ModelConfig config = cpu_model->config();
    config.architecture_name = o.model_dir;
    SLIMKV_ASSIGN_OR_RETURN(auto model, CudaLlamaModel::upload(config, cpu_model->weights(), model_options(o, config)));
    SLIMKV_RETURN_IF_ERROR(run_model(*model, o));
  }
  if (!o.random.empty()) {
    if (o.random != "llama3-8b") return error("--random ", o.random, ": known shapes are llama3-8b");
    const ModelConfig config = llama3_8b_config();
    SLIMKV_ASSIGN_OR_RETURN(auto model, CudaLlamaModel::random(config, 42, model_options(o, config)));
    SLIMKV_RETURN_IF_ERROR(run_model(*model, o));
  }
  return Status::ok();
}

}  // namespace
}  // namespace slimkv::cuda

int main(int argc, char** argv) {
  slimkv::cuda::Options o;
  CLI::App app{"End-to-end decode tokens/s on the GPU"};
  app.add_option("--model", o.model_dir, "a Hugging Face model directory");
  app.add_option("--random", o.random, "a random-weight model of a known shape: llama3-8b");
  app.add_option("--batches", o.batches, "batch sizes")->delimiter(',');
  app.add_option("--prompt", o.prompt, "prompt tokens per sequence before decoding")->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps, "timed decode steps")->check(CLI::PositiveNumber);
  app.add_option("--bandwidth", o.bandwidth_gb_s, "memory bandwidth for the roofline, GB/s");
  CLI11_PARSE(app, argc, argv);
  if (o.model_dir.empty() && o.random.empty()) {
    std::fprintf(stderr, "error: give --model DIR and/or --random llama3-8b\n");
    return 2;
  }
  const slimkv::Status status = slimkv::cuda::run(o);
  if (!status) {
    std::fprintf(stderr, "error: %s\n", status.message().c_str());
    return 1;
  }
  return 0;
}
