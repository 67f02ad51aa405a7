// End-to-end decode on the GPU (issues 9, 10): the whole forward pass (model/cuda/llama_cuda.h) of a
// batch of sequences, each first prefilled with --prompt random tokens (or, with --context C, given C
// tokens of random K/V without running the layers: long contexts in milliseconds), then --steps
// decode steps (greedy, or sampled on the GPU with --temperature / --top-k / --top-p), for each KV codec of
// --kvs (dense FP16; hack / quant sealed at --bits; zack at --zack-rate KV compression, and zack+hack (its
// reduced K'/V' sealed by hack at --bits), --random shapes only: every (layer, KV head) at K and V rank
// d·(1 − rate) rounded to 8, printed — random weights have flat spectra, so their calibration would give
// every head about that rank; the skew of a trained model's ranks is bench_zack_attention_cuda's subject).
// A codec with `@offload` (dense, hack, quant, zack) keeps every token's K/V in pinned host memory, streamed
// to the GPU layer by layer each step: the bytes a token moves over PCIe are the codec's (the roofline
// columns still assume GPU memory's bandwidth); not with --fit (the host pool, not GPU memory, bounds it).
// Models: a directory or a GGUF file (--model, e.g. the bundled one) and/or --random llama3-8b (random
// weights of Llama-3-8B's shape generated on the GPU: nothing to download; also llama2-7b, and
// qwen3-30b-a3b, a mixture of experts). Weight variants side by
// side (issue 29): --random-weights f16,q4_k_m,q8_0 (random FP16 matrices, or random GGUF blocks kept
// as blocks on the GPU), and for a GGUF file --weights quantized,widened (its blocks kept, or widened to
// FP16 at upload as the GPU did before); a mixture of experts' decode steps through the grouped expert
// products (the default) or, with --experts per-expert, each expert's own. Prints per model, variant and
// batch size, after a line with the GPU memory of each variant's weights:
// prefill tokens/s, TTFT (ms to prefill one sequence's prompt: the sequences are prefilled one after
// another) and its ratio to the first codec's, TBT (ms per decode step: time between tokens), decode
// tokens/s (all sequences), its ratio to the first codec's, and the step's time against the memory roofline (weights + the KV that
// attention must read, as each codec stores it, once per step at --bandwidth GB/s; of a mixture of
// experts, the experts its rows are expected to choose: weight_gb_read): decode at small batch is a
// weight-streaming problem, so that ratio says how much launch and kernel overhead costs.
//
// --fit: instead of --batches, each codec's largest batch whose contexts fit in the GPU's KV memory (the
// default budget: 90% of what is free after the weights and activations; found by bisection over
// max_sequences, each probe a fresh model), decoded at that batch.
//
//   bench_decode_e2e_cuda --model models/slimkv-llama-15m --random llama3-8b --batches 1,16 --prompt 1024
//   bench_decode_e2e_cuda --random llama3-8b --kvs dense,hack,quant --bits 2 --batches 8 --context 32768
//   bench_decode_e2e_cuda --random llama3-8b --kvs dense,hack,quant --bits 2 --fit --context 32768
//   bench_decode_e2e_cuda --random llama3-8b --kvs dense,zack,hack,zack+hack --bits 4 --zack-rate 0.5 --fit --context 32768
//   bench_decode_e2e_cuda --random llama3-8b --kvs dense,zack,hack --bits 4 --batches 1 --prompt 8192 --steps 16
//   bench_decode_e2e_cuda --random llama3-8b --kvs dense@offload,zack@offload --batches 4 --context 16384 --steps 8
//   bench_decode_e2e_cuda --random llama3-8b --random-weights f16,q4_k_m,q8_0 --batches 1,8,16 --prompt 512
//   bench_decode_e2e_cuda --model model-Q4_K_M.gguf --weights quantized,widened --batches 1,8 --prompt 128
//   bench_decode_e2e_cuda --random qwen3-30b-a3b --random-weights q8_0,q4_0 --batches 1,8,32 --prompt 512
//   bench_decode_e2e_cuda --random qwen3-30b-a3b --random-weights q8_0 --batches 1,8 --prompt 512 --experts per-expert
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "bench_errors.h"
#include "random_shapes.h"
#include "model/cuda/llama_cuda.h"
#include "model/llama.h"

namespace slimkv::cuda {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string model_dir;
  std::string random;  // "llama3-8b"
  std::vector<std::string> random_weights = {"f16"};  // RandomWeights names (llama_cuda.h)
  std::vector<std::string> weights = {"quantized"};    // --model: "quantized" (blocks kept), "widened"
  std::vector<int> batches = {1, 16};
  std::vector<std::string> kvs = {"dense"};
  int bits = 2;
  double zack_rate = 0.5;  // zack's KV compression: 1 − stored dims / full dims
  int prompt = 1024;
  int context = 0;  // > 0: random K/V of this many tokens instead of a prompt
  RowSampling sampling;  // of every decode step (temperature 0: greedy)
  int steps = 64;
  double bandwidth_gb_s = 3000;  // H100 HBM3, device-to-device copy (../shared/GPU.md)
  bool fit = false;  // each codec at its largest batch instead of --batches
  std::string experts = "grouped";  // a mixture of experts' decode products: "grouped", or "per-expert"
};

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

struct Row {
  double prefill_tokens_per_s = 0;  // 0: no prefill (random context)
  double step_ms = 0;
};

Expected<Row> run_batch(CudaLlamaModel& model, const Options& o, int batch) {
  const ModelConfig& c = model.config();
  std::vector<int> sequences;
  for (int b = 0; b < batch; ++b) {
    SLIMKV_ASSIGN_OR_RETURN(int s, model.add_sequence());
    sequences.push_back(s);
  }
  Row row;
  std::vector<int32_t> next(static_cast<size_t>(batch), 1);
  if (o.context > 0) {
    for (int b = 0; b < batch; ++b) SLIMKV_RETURN_IF_ERROR(model.append_random_kv(sequences[size_t(b)], o.context, uint64_t(b)));
  } else {
    // Prefill: each sequence's random prompt in chunks that fill a step.
    std::mt19937 rng(1);
    std::uniform_int_distribution<int32_t> id(0, int32_t(c.vocab_size) - 1);
    std::vector<int32_t> prompt(static_cast<size_t>(o.prompt));
    const int chunk = 512;
    SLIMKV_RETURN_IF_ERROR(device_synchronize("before prefill"));
    const auto prefill_start = Clock::now();
    for (int b = 0; b < batch; ++b) {
      for (int32_t& t : prompt) t = id(rng);
      std::vector<int32_t> last;
      for (int first = 0; first < o.prompt; first += chunk) {
        const std::span<const int32_t> part(prompt.data() + first, size_t(std::min(chunk, o.prompt - first)));
        const SequenceTokens step{sequences[size_t(b)], part};
        SLIMKV_RETURN_IF_ERROR(model.step_greedy(std::span(&step, 1), last));
      }
      next[size_t(b)] = last[0];
    }
    row.prefill_tokens_per_s = double(batch) * o.prompt / seconds_since(prefill_start);
  }
  // Decode: every sequence one token per step; the first steps warm up.
  constexpr int kWarmup = 4;
  Clock::time_point decode_start;
  for (int step = 0; step < kWarmup + o.steps; ++step) {
    if (step == kWarmup) decode_start = Clock::now();
    std::vector<SequenceTokens> tokens;
    for (int b = 0; b < batch; ++b) tokens.push_back({sequences[size_t(b)], std::span(&next[size_t(b)], 1)});
    std::vector<RowSampling> sampling;
    if (o.sampling.temperature > 0) {
      for (int b = 0; b < batch; ++b) {
        sampling.push_back(o.sampling);
        sampling.back().seed = uint64_t(b);
        sampling.back().counter = uint64_t(step);
      }
    }
    std::vector<int32_t> chosen;
    SLIMKV_RETURN_IF_ERROR(model.step_sample(tokens, sampling, chosen));
    next = chosen;
  }
  row.step_ms = seconds_since(decode_start) / o.steps * 1e3;
  for (int s : sequences) model.remove_sequence(s);
  return row;
}

// ZACK on a random-weight shape: every (layer, KV head) at K and V rank d·(1 − rate) rounded to a
// multiple of 8 (at least 8), bases the first rank unit vectors (q and k truncated: the projection costs
// what any basis costs).
int uniform_zack_rank(const ModelConfig& c, double rate) {
  const int d = int(c.head_dim);
  return std::clamp(int(std::lround(d * (1.0 - rate) / 8.0)) * 8, std::min(8, d), d);
}
ZackKvOptions uniform_zack(const ModelConfig& c, double rate) {
  const int d = int(c.head_dim), rank = uniform_zack_rank(c, rate);
  ZackKvOptions zack;
  const size_t heads = size_t(c.num_layers) * size_t(c.num_kv_heads);
  zack.k_ranks.assign(heads, rank);
  zack.v_ranks.assign(heads, rank);
  zack.qk_bases.assign(heads * size_t(rank) * size_t(d), 0.0f);
  for (size_t h = 0; h < heads; ++h) {
    for (int r = 0; r < rank; ++r) zack.qk_bases[(h * size_t(rank) + size_t(r)) * size_t(d) + size_t(r)] = 1.0f;
  }
  return zack;
}

// A --kvs entry's codec, without its `@offload`.
std::string codec_of(const std::string& kv) { return kv.substr(0, kv.find('@')); }
bool offloaded(const std::string& kv) { return kv.ends_with("@offload"); }

CudaModelOptions model_options(const Options& o, const ModelConfig& config, const std::string& kv_entry, int max_sequences) {
  const std::string kv = codec_of(kv_entry);
  CudaModelOptions options;
  options.max_sequences = max_sequences;
  options.max_step_tokens = std::max(512, options.max_sequences);
  const int tokens = (o.context > 0 ? o.context : o.prompt) + o.steps + 64;
  options.max_context_tokens = int(std::min<int64_t>(config.max_position_embeddings, tokens));
  if (kv.starts_with("zack")) options.zack = uniform_zack(config, o.zack_rate);
  if (kv != "dense" && kv != "zack") {  // hack, quant, zack+hack
    QuantizationConfig quantization;
    quantization.k_bits = quantization.v_bits = o.bits;
    options.quantized_kv = QuantizedKvOptions{quantization, kv != "quant", 0};
  }
  if (offloaded(kv_entry)) options.tier = KvTierOptions{};  // the host pool: every sequence's full context
  options.grouped_experts = o.experts == "grouped";
  return options;
}

// KV bytes one decode step's attention reads per token of context: sealed blocks as stored.
double kv_bytes_per_token(const ModelConfig& c, const std::string& kv_entry, int bits, double zack_rate) {
  const std::string kv = codec_of(kv_entry);
  if (kv == "dense") return double(c.num_layers) * 2 * double(c.kv_dim()) * 2;
  const int dims = kv.starts_with("zack") ? uniform_zack_rank(c, zack_rate) : int(c.head_dim);
  if (kv == "zack") return double(c.num_layers) * double(c.num_kv_heads) * 2 * double(dims) * 2;
  QuantizationConfig quantization;
  quantization.k_bits = quantization.v_bits = bits;
  const QuantizedBlockLayout layout(quantization, BlockShape{kCudaBlockTokens, dims, dims});
  return double(c.num_layers) * double(c.num_kv_heads) * double(layout.block_bytes) / kCudaBlockTokens;
}

// The largest batch of sequences of the run's context whose KV fits the model's default GPU budget
// with codec kv, and the model that holds it: bisection over max_sequences (the budget depends on it
// through the activations and, for quantized KV, the FP16 window).
template <typename MakeModel>
Expected<std::pair<int, std::unique_ptr<CudaLlamaModel>>> largest_batch(const Options& o, const ModelConfig& config,
                                                                       const std::string& kv, MakeModel make_model) {
  const int tokens = (o.context > 0 ? o.context : o.prompt) + o.steps;
  const int blocks_per_sequence = (tokens + kCudaBlockTokens - 1) / kCudaBlockTokens;
  Status last_refusal = Status::ok();  // a model too big to make does not fit either
  const auto fits = [&](int batch) -> Expected<bool> {
    auto model = make_model(model_options(o, config, kv, batch));
    if (!model) {
      last_refusal = model.status();
      return false;
    }
    return size_t((*model)->kv_cache_blocks()) >= size_t(batch) * blocks_per_sequence;
  };
  int lo = 0, hi = 1;  // fits(lo) (0 trivially), !fits(hi) once found
  for (;; hi *= 2) {
    SLIMKV_ASSIGN_OR_RETURN(const bool ok, fits(hi));
    if (!ok) break;
    lo = hi;
    if (hi >= 4096) return error("over 4096 sequences fit: use --batches");
  }
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    SLIMKV_ASSIGN_OR_RETURN(const bool ok, fits(mid));
    (ok ? lo : hi) = mid;
  }
  if (lo == 0) {
    return error("not one sequence of ", tokens, " tokens fits with kv ", kv,
                 last_refusal ? std::string() : " (" + last_refusal.message() + ")");
  }
  SLIMKV_ASSIGN_OR_RETURN(auto model, make_model(model_options(o, config, kv, lo)));
  return std::make_pair(lo, std::move(model));
}

// The weights a decode step of `batch` rows reads: all of them, but of a mixture of experts' only the
// experts its rows choose, estimated as if the batch·k choices fell uniformly on the E experts (1 − (1 −
// k/E)^batch of them chosen; the experts' share of the bytes taken as their share of the parameters).
double weight_gb_read(const ModelConfig& config, size_t weight_bytes, int batch) {
  const ShapeParameters parameters = shape_parameters(config);
  if (parameters.experts == 0) return double(weight_bytes) / 1e9;
  const double k_of_e = double(config.moe.experts_per_token) / double(config.moe.num_experts);
  const double chosen = 1.0 - std::pow(1.0 - k_of_e, double(batch));
  return double(weight_bytes) / 1e9 * (1.0 - parameters.experts / parameters.all * (1.0 - chosen));
}

// The first codec's figures of each batch column, that the other rows are compared with.
struct FirstRow {
  double tokens_per_s = 0;
  double ttft_ms = 0;
};

// Every codec of --kvs on one model's weight variant (made by make_model), each batch size (or its
// largest), side by side; "vs first" is against the first row of the same batch column (first, shared
// by the variants of a model).
template <typename MakeModel>
Status run_model(const Options& o, const ModelConfig& config, const std::string& variant, MakeModel make_model,
                 std::vector<FirstRow>& first) {
  for (const std::string& kv : o.kvs) {
    std::unique_ptr<CudaLlamaModel> model;
    std::vector<int> batches = o.batches;
    if (o.fit) {
      SLIMKV_ASSIGN_OR_RETURN(auto fitted, largest_batch(o, config, kv, make_model));
      batches = {fitted.first};
      model = std::move(fitted.second);
    } else {
      SLIMKV_ASSIGN_OR_RETURN(model, make_model(model_options(o, config, kv, *std::max_element(batches.begin(), batches.end()))));
    }
    std::printf("# %s, weights %s, kv %s: %.2f GB of %s weights on the GPU, KV pools %.2f GB (%d blocks of 64 tokens)\n",
                config.architecture_name.c_str(), variant.c_str(), kv.c_str(), model->weight_bytes() / 1e9,
                model->weight_description().c_str(), model->kv_cache_bytes() / 1e9, model->kv_cache_blocks());
    if (kv.starts_with("zack")) {  // zack, zack+hack, zack@offload
      const int rank = uniform_zack_rank(config, o.zack_rate);
      std::printf("# zack ranks: K and V rank %d of %d at every layer and KV head (--zack-rate %.2f, uniform: random "
                  "weights have flat spectra), KV compression %.3f\n",
                  rank, int(config.head_dim), o.zack_rate, 1.0 - double(rank) / double(config.head_dim));
    }
    for (size_t i = 0; i < batches.size(); ++i) {
      const int batch = batches[i];
      SLIMKV_ASSIGN_OR_RETURN(Row row, run_batch(*model, o, batch));
      const double tokens_per_s = batch / (row.step_ms / 1e3);
      const double ttft_ms = row.prefill_tokens_per_s > 0 ? o.prompt / row.prefill_tokens_per_s * 1e3 : 0;
      if (first[i].tokens_per_s == 0) first[i] = {tokens_per_s, ttft_ms};
      const int context = o.context > 0 ? o.context : o.prompt;
      const double kv_gb = double(batch) * (context + o.steps / 2.0) * kv_bytes_per_token(config, kv, o.bits, o.zack_rate) / 1e9;
      const double roofline_ms = (weight_gb_read(config, model->weight_bytes(), batch) + kv_gb) / o.bandwidth_gb_s * 1e3;
      std::printf("%-34s %-9s %7.2f %-9s %5d %8d %12.0f %9.1f %8.2fx %10.3f %12.1f %8.2fx %8.2f %9.3f %8.2f\n",
                  config.architecture_name.c_str(), variant.c_str(), model->weight_bytes() / 1e9, kv.c_str(), batch,
                  context, row.prefill_tokens_per_s, ttft_ms, first[i].ttft_ms > 0 ? ttft_ms / first[i].ttft_ms : 0.0,
                  row.step_ms, tokens_per_s, tokens_per_s / first[i].tokens_per_s, kv_gb, roofline_ms,
                  roofline_ms / row.step_ms);
    }
  }
  return Status::ok();
}

Status run(const Options& o) {
  SLIMKV_RETURN_IF_ERROR(device_usable());
  for (const std::string& kv : o.kvs) {
    const std::string codec = codec_of(kv);
    if ((codec != "dense" && codec != "hack" && codec != "quant" && codec != "zack" && codec != "zack+hack") ||
        (codec != kv && (!offloaded(kv) || codec == "zack+hack"))) {
      return error("--kvs ", kv, ": expected dense, hack, quant, zack or zack+hack, the first four optionally @offload");
    }
    if (offloaded(kv) && o.fit) return error("--kvs ", kv, " with --fit: the host pool bounds the batch, not GPU memory");
    if (kv.starts_with("zack") && !o.model_dir.empty()) {
      return error("--kvs ", kv, " runs on --random shapes only: a model's ZACK needs its calibration and folded weights ",
                   "(slimkv generate --device cuda --kv zack:rate=...)");
    }
  }
  if (!(o.zack_rate >= 0 && o.zack_rate < 1)) return error("--zack-rate ", o.zack_rate, ": expected 0 <= rate < 1");
  for (const std::string& w : o.weights) {
    if (w != "quantized" && w != "widened") return error("--weights ", w, ": expected quantized or widened");
  }
  if (o.experts != "grouped" && o.experts != "per-expert") {
    return error("--experts ", o.experts, ": expected grouped or per-expert");
  }
  std::vector<RandomWeights> random_weights;
  for (const std::string& w : o.random_weights) {
    SLIMKV_ASSIGN_OR_RETURN(RandomWeights kind, parse_random_weights(w));
    random_weights.push_back(kind);
  }
  std::printf("%-34s %-9s %7s %-9s %5s %8s %12s %9s %9s %10s %12s %9s %8s %9s %8s\n", "model", "weights", "wt GB", "kv",
              "batch", "context", "prefill t/s", "TTFT ms", "vs first", "TBT ms", "decode t/s", "vs first", "KV GB",
              "roof ms", "of roof");
  const size_t columns = o.fit ? 1 : o.batches.size();
  if (!o.model_dir.empty()) {
    SLIMKV_ASSIGN_OR_RETURN(auto cpu_model, LlamaModel::load(o.model_dir));
    ModelConfig config = cpu_model->config();
    config.architecture_name = o.model_dir;
    if ((o.context > 0 ? o.context : o.prompt) + o.steps + 4 > config.max_position_embeddings) {
      return error("the context and --steps ", o.steps, " are over the model's context");
    }
    std::vector<FirstRow> first(columns);
    for (const std::string& variant : o.weights) {
      SLIMKV_RETURN_IF_ERROR(run_model(o, config, variant, [&](CudaModelOptions options) {
        options.widen_quantized_weights = variant == "widened";
        return CudaLlamaModel::upload(config, cpu_model->weights(), options);
      }, first));
    }
  }
  if (!o.random.empty()) {
    SLIMKV_ASSIGN_OR_RETURN(const ModelConfig config, random_shape(o.random));
    std::vector<FirstRow> first(columns);
    for (size_t v = 0; v < random_weights.size(); ++v) {
      SLIMKV_RETURN_IF_ERROR(run_model(o, config, o.random_weights[v], [&](const CudaModelOptions& options) {
        return CudaLlamaModel::random(config, 42, options, random_weights[v]);
      }, first));
    }
  }
  return Status::ok();
}

}  // namespace
}  // namespace slimkv::cuda

int main(int argc, char** argv) {
  slimkv::cuda::Options o;
  CLI::App app{"End-to-end decode tokens/s on the GPU"};
  app.add_option("--model", o.model_dir, "a Hugging Face model directory or a GGUF file");
  app.add_option("--random", o.random, "a random-weight model of a known shape: llama3-8b, llama2-7b, qwen3-30b-a3b");
  app.add_option("--random-weights", o.random_weights, "--random's weights, side by side: f16, q8_0, q4_0, q4_k_m")
      ->delimiter(',');
  app.add_option("--weights", o.weights, "--model's quantized matrices, side by side: quantized (blocks kept), widened")
      ->delimiter(',');
  app.add_option("--batches", o.batches, "batch sizes")->delimiter(',');
  app.add_option("--kvs", o.kvs, "KV codecs: dense, hack, quant; zack, zack+hack (--random only)")->delimiter(',');
  app.add_option("--bits", o.bits, "hack / quant bits (2, 4, 8)");
  app.add_option("--zack-rate", o.zack_rate, "zack's KV compression (1 - stored dims / full dims), uniform ranks")
      ->capture_default_str();
  app.add_option("--prompt", o.prompt, "prompt tokens per sequence before decoding")->check(CLI::PositiveNumber);
  app.add_option("--context", o.context, "random K/V tokens per sequence instead of a prompt (0: the prompt)");
  app.add_option("--steps", o.steps, "timed decode steps")->check(CLI::PositiveNumber);
  app.add_option("--temperature", o.sampling.temperature, "decode by sampling at this temperature (0: greedy)");
  app.add_option("--top-k", o.sampling.top_k, "sampling: the top-k logits (0: all)");
  app.add_option("--top-p", o.sampling.top_p, "sampling: the top-p probability mass");
  app.add_option("--bandwidth", o.bandwidth_gb_s, "memory bandwidth for the roofline, GB/s");
  app.add_option("--experts", o.experts, "a mixture of experts' decode steps: grouped (a launch a matrix for every "
                 "expert) or per-expert (each expert's own products, as prefill)");
  app.add_flag("--fit", o.fit, "each codec at the largest batch whose KV fits in GPU memory (instead of --batches)");
  CLI11_PARSE(app, argc, argv);
  if (o.model_dir.empty() && o.random.empty()) {
    std::fprintf(stderr, "error: give --model DIR and/or --random SHAPE (llama3-8b, llama2-7b, qwen3-30b-a3b)\n");
    return 2;
  }
  const slimkv::Status status = slimkv::cuda::run(o);
  if (slimkv::cuda::failed(status)) return 1;
  return 0;
}
