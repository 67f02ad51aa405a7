// GGUF files on device cuda (issue 29), their quantized matrices kept in blocks on the GPU
// (backend/cuda/quantized_gemm.h): the fixtures of tests/data/gguf (llama.cpp's converter and
// quantizer: scripts/gguf/make_fixtures.py) against llama.cpp's logits on the same files, prefill and
// token by token, within the bars the CPU's parity test holds the CPU to (tests/engine/gguf_parity_test.cc;
// quantized files: plus FP16's rounding of the activations), and against the CPU engine's prefill on the
// same file; the GPU memory of the weights is the file's (Qwen3-MoE's experts too); random Q4_K_M-like
// and mixture-of-experts models run; shapes the blocks cannot hold are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <memory>
#include <utility>

#include <nlohmann/json.hpp>

#include "cuda_test_util.h"
#include "gguf_fixtures.h"
#include "golden_models.h"
#include "model/cuda/llama_cuda.h"
#include "model/llama.h"
#include "routing_margins.h"
#include "slimkv/engine.h"
#include "source_dir.h"

namespace slimkv::cuda {
namespace {

const std::string& kDir = slimkv::test::kGgufDir;
using slimkv::test::read_f32;

nlohmann::json manifest() { return slimkv::test::gguf_manifest(); }

std::unique_ptr<Engine> load(const std::string& path, const std::string& device) {
  EngineConfig config;
  config.model_dir = path;
  config.device = device;
  config.threads = 2;
  return take(Engine::load(config));
}

// Prefill of every token (all rows), then the same tokens one decode step at a time.
void run_both_ways(Engine& engine, const std::vector<int32_t>& tokens, std::vector<float>& prefill,
                   std::vector<float>& incremental) {
  prefill = take(engine.new_session()->prefill(tokens, /*all_logits=*/true));
  auto session = engine.new_session();
  incremental.clear();
  for (int32_t id : tokens) {
    const std::vector<float> row = take(session->decode(id));
    incremental.insert(incremental.end(), row.begin(), row.end());
  }
}

// The CPU parity test's bars: F16 files within FP16 rounding (kF16Tolerance, relative to max |logit|);
// quantized files within the quantization's own error (llama.cpp's distance from its logits on the
// model's F16 file). On the GPU a quantized file's activations are rounded to FP16 besides (the CPU
// keeps them in FP32 in prefill, llama.cpp quantizes them to 8 bits): its bar is the quantization's error
// plus the F16 files' allowance for that rounding. (The CPU's own margin is thin on one file: Gemma 3
// Q8_0 decodes 3.40e-2 from llama.cpp against a bar of 3.42e-2.)
constexpr double kF16Tolerance = 5e-3;
// The GPU's half-precision bound against the CPU (llama_cuda_test, model_families_cuda_test), held to the
// CPU's prefill: it multiplies the weights as stored by FP32 activations, as the GPU does by FP16 ones
// (the CPU's decode quantizes its inputs to 8 bits as llama.cpp does, backend/cpu/quant_dot.h: not the
// same arithmetic).
constexpr double kGpuVsCpu = 2e-2;

using GgufCuda = CudaTest;

// Every fixture: Llama, Qwen2, Qwen3, Qwen3-MoE and Gemma 3 files, F16 and quantized.
TEST_F(GgufCuda, LogitsMatchLlamaCppAndTheCpuInPrefillAndIncrementalModes) {
  const nlohmann::json m = manifest();
  const std::vector<int32_t> tokens = m["tokens"].get<std::vector<int32_t>>();
  int checked = 0;
  for (const auto& [file, entry] : m["models"].items()) {
    SCOPED_TRACE(file);
    auto gpu = load(kDir + "/" + file, "cuda");
    auto cpu = load(kDir + "/" + file, "cpu");
    ASSERT_TRUE(gpu && cpu);
    const std::vector<float> golden = read_f32(kDir + "/" + entry["logits"].get<std::string>());
    ASSERT_EQ(golden.size(), tokens.size() * size_t(gpu->model_config().vocab_size));
    std::vector<float> prefill, incremental;
    run_both_ways(*gpu, tokens, prefill, incremental);
    const std::vector<float> cpu_prefill = take(cpu->new_session()->prefill(tokens, /*all_logits=*/true));
    ASSERT_FALSE(HasFatalFailure());
    const double quantization_error =
        relative_max_error(golden, read_f32(kDir + "/" + entry["f16_logits"].get<std::string>()));
    const double bar = entry["type"] == "F16" ? kF16Tolerance : quantization_error + kF16Tolerance;
    const double prefill_error = relative_max_error(prefill, golden);
    const double incremental_error = relative_max_error(incremental, golden);
    EXPECT_LT(prefill_error, bar);
    EXPECT_LT(incremental_error, bar);
    const double cpu_prefill_error = relative_max_error(prefill, cpu_prefill);
    const double cpu_incremental_error = relative_max_error(incremental, cpu_prefill);
    EXPECT_LT(cpu_prefill_error, kGpuVsCpu);
    EXPECT_LT(cpu_incremental_error, kGpuVsCpu);
    std::printf("%s on cuda: max error / max|logit| vs llama.cpp: prefill %.2e, incremental %.2e (bar %.2e); "
                "vs the CPU's prefill: prefill %.2e, incremental %.2e\n",
                file.c_str(), prefill_error, incremental_error, bar, cpu_prefill_error, cpu_incremental_error);
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

// The bytes of the file's matrices as the GPU holds them: blocks at their stored size, plain matrices
// (and the blocks widened, for comparison) at 2 bytes a value.
size_t matrix_bytes(const WeightMatrix& w, bool widened) {
  if (w.quant == BlockQuant::kNone || widened) return size_t(w.rows) * size_t(w.cols) * 2;
  return quantized_matrix_bytes(w.quant, w.rows, w.cols);
}
size_t model_matrix_bytes(const LlamaWeights& weights, bool tied, bool widened) {
  size_t bytes = matrix_bytes(weights.embedding, widened) + (tied ? 0 : matrix_bytes(weights.lm_head, widened));
  for (const LayerWeights& l : weights.layers) {
    for (const WeightMatrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.mlp.gate, &l.mlp.up, &l.mlp.down, &l.router}) {
      bytes += matrix_bytes(*w, widened);
    }
    for (const MlpWeights& expert : l.experts) {
      for (const WeightMatrix* w : {&expert.gate, &expert.up, &expert.down}) bytes += matrix_bytes(*w, widened);
    }
  }
  return bytes;
}

// What the weight arena holds beyond the matrices: the norms (q/k norms where the model has them) and
// RoPE's frequencies, and up to 256 bytes of alignment after each piece (8 a layer at most, and each
// expert's two).
size_t arena_slack(const ModelConfig& c) {
  const size_t layers = size_t(c.num_layers), hidden = size_t(c.hidden_size), head_dim = size_t(c.head_dim);
  const size_t vectors = (2 * layers + 1) * hidden * 4 + head_dim * 2 + (c.qk_norm ? 2 * layers * head_dim * 4 : 0);
  return vectors + 256 * (layers * (8 + 2 * size_t(c.moe.num_experts)) + 8);
}

// The fixtures' uploads: one sequence, steps of up to 32 tokens.
CudaModelOptions one_sequence() {
  CudaModelOptions options;
  options.max_sequences = 1;
  options.max_step_tokens = 32;
  return options;
}

// A model uploaded with its quantized matrices kept in their blocks and widened to FP16.
std::pair<std::unique_ptr<CudaLlamaModel>, std::unique_ptr<CudaLlamaModel>> upload_kept_and_widened(const LlamaModel& model) {
  CudaModelOptions options = one_sequence();
  auto kept = take(CudaLlamaModel::upload(model.config(), model.weights(), options));
  options.widen_quantized_weights = true;
  return {std::move(kept), take(CudaLlamaModel::upload(model.config(), model.weights(), options))};
}

// The largest difference of two uploads' prefill logits of one 20-token prompt, over the largest |logit|.
double prefill_difference(CudaLlamaModel& a, CudaLlamaModel& b, int vocab) {
  std::vector<int32_t> prompt(20);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 37 + 5) % size_t(vocab));
  std::vector<float> a_logits, b_logits;
  const int in_a = take(a.add_sequence()), in_b = take(b.add_sequence());
  EXPECT_TRUE(a.step(std::vector<SequenceTokens>{{in_a, prompt}}, /*all_logits=*/true, a_logits).is_ok());
  EXPECT_TRUE(b.step(std::vector<SequenceTokens>{{in_b, prompt}}, /*all_logits=*/true, b_logits).is_ok());
  return relative_max_error(a_logits, b_logits);
}

// The Q4_K_M fixture's weights take its matrices' bytes on the GPU (plus the norms and the arena's
// 256-byte alignment), under 40% of what the widened upload takes; prefill gives the same logits within
// the embedding's FP16 rounding.
TEST_F(GgufCuda, QuantizedWeightsTakeTheFilesBytes) {
  auto cpu_model = take(LlamaModel::load(kDir + "/llama_k-Q4_K_M.gguf"));
  const ModelConfig& c = cpu_model->config();
  auto [kept, widened] = upload_kept_and_widened(*cpu_model);
  ASSERT_TRUE(kept && widened);
  const size_t file_bytes = model_matrix_bytes(cpu_model->weights(), c.tie_word_embeddings, false);
  const size_t slack = arena_slack(c);
  EXPECT_GE(kept->weight_bytes(), file_bytes);
  EXPECT_LE(kept->weight_bytes(), file_bytes + slack);
  EXPECT_LE(widened->weight_bytes(), model_matrix_bytes(cpu_model->weights(), c.tie_word_embeddings, true) + slack);
  // This small model's Q4_K_M is a third Q6_K (the tied embedding, attn_v, ffn_down): 5.1 bits a value.
  EXPECT_LT(5 * kept->weight_bytes(), 2 * widened->weight_bytes());
  const std::string held = kept->weight_description();
  EXPECT_NE(held.find("Q4_K"), std::string::npos) << held;
  EXPECT_NE(held.find("Q6_K"), std::string::npos) << held;
  EXPECT_EQ(held.find("FP16"), std::string::npos) << held << ": every matrix of the file is quantized";
  EXPECT_EQ(widened->weight_description(), "FP16");
  std::printf("llama_k-Q4_K_M.gguf on cuda: weights %zu bytes kept in blocks (matrices %zu), %zu widened\n",
              kept->weight_bytes(), file_bytes, widened->weight_bytes());

  // Prefill: both multiply the same FP16-rounded matrices (the kept ones dequantized per tile); only the
  // embedding rows differ, read in FP32 from the blocks (as the CPU) or rounded to FP16 by the widening.
  const double difference = prefill_difference(*kept, *widened, int(c.vocab_size));
  EXPECT_LT(difference, 5e-3);
  std::printf("llama_k-Q4_K_M.gguf: prefill logits kept vs widened: max difference / max|logit| %.2e\n", difference);
}

// A prompt of the Qwen3-MoE fixture whose routing on the CPU clears every near tie by kClearRouting
// (routing_margins.h; at 20 tokens its closest call is 0.31 in log-odds, every expert has rows in each
// layer, one 19: the grouped products run an expert's places 8 at a time).
std::vector<int32_t> clearly_routed_prompt(int64_t vocab, size_t tokens) {
  std::vector<int32_t> prompt(tokens);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 79 + 6) % size_t(vocab));
  return prompt;
}
// Log-odds of a k-th and a (k+1)-th expert that the GPU's arithmetic does not reverse: rounding the
// router's inputs, its weights and the experts' intermediate values to FP16 on the CPU moved the
// fixture's log-odds by up to 3.6e-2 (issue 29).
constexpr double kClearRouting = 0.1;

// The Q8_0 Qwen3-MoE fixture on the CPU: its prefill logits of `prompt`, checked to route every token
// clear of a near tie (else a GPU that chose the other expert would be held to the wrong logits).
std::vector<float> clearly_routed_cpu_logits(const std::vector<int32_t>& prompt) {
  auto cpu = load(kDir + "/qwen3moe_tiny-Q8_0.gguf", "cpu");
  const ModelConfig& c = cpu->model_config();
  slimkv::test::RoutingMargins routing(int(c.moe.num_experts), int(c.moe.experts_per_token));
  auto session = cpu->new_session();
  EXPECT_TRUE(session->set_observer(&routing).is_ok());
  std::vector<float> logits = take(session->prefill(prompt, /*all_logits=*/true));
  const slimkv::test::RoutingMargin& closest = routing.smallest();
  EXPECT_GT(closest.log_odds, kClearRouting) << "the prompt routes token " << closest.row << " of layer "
                                             << closest.layer << " on a near tie: choose another prompt";
  return logits;
}

// Qwen3-MoE's experts stay in the file's blocks as well: the Q8_0 fixture's weights take its matrices'
// bytes on the GPU (every expert's; the routers, F32 in the file, in FP16), the widened upload its
// values at 2 bytes; prefill gives the CPU's logits through every path of the experts.
TEST_F(GgufCuda, ExpertsTakeTheFilesBytes) {
  auto cpu_model = take(LlamaModel::load(kDir + "/qwen3moe_tiny-Q8_0.gguf"));
  const ModelConfig& c = cpu_model->config();
  ASSERT_GT(c.moe.num_experts, 0);
  auto [kept, widened] = upload_kept_and_widened(*cpu_model);
  ASSERT_TRUE(kept && widened);
  const size_t file_bytes = model_matrix_bytes(cpu_model->weights(), c.tie_word_embeddings, false);
  const size_t widened_bytes = model_matrix_bytes(cpu_model->weights(), c.tie_word_embeddings, true);
  EXPECT_GE(kept->weight_bytes(), file_bytes);
  EXPECT_LE(kept->weight_bytes(), file_bytes + arena_slack(c));
  EXPECT_GE(widened->weight_bytes(), widened_bytes);
  EXPECT_LE(widened->weight_bytes(), widened_bytes + arena_slack(c));
  EXPECT_NE(kept->weight_description().find("Q8_0"), std::string::npos) << kept->weight_description();
  EXPECT_EQ(widened->weight_description(), "FP16");
  std::printf("qwen3moe_tiny-Q8_0.gguf on cuda: weights %zu bytes kept in blocks (matrices %zu), %zu widened (%zu)\n",
              kept->weight_bytes(), file_bytes, widened->weight_bytes(), widened_bytes);

  // Each upload's prefill gives the CPU's logits (which multiply the weights as stored): the kept blocks
  // through the grouped expert GEMVs (FP32 on the weights as stored) and through each expert's own
  // products (cuBLAS on FP16 tiles where an expert has more than 8 rows), the widened ones on FP16
  // roundings of them.
  CudaModelOptions options = one_sequence();
  options.grouped_experts = false;
  auto per_expert = take(CudaLlamaModel::upload(c, cpu_model->weights(), options));
  ASSERT_TRUE(per_expert);
  const std::vector<int32_t> prompt = clearly_routed_prompt(c.vocab_size, 20);
  const std::vector<float> cpu_logits = clearly_routed_cpu_logits(prompt);
  const std::pair<const char*, CudaLlamaModel*> uploads[] = {
      {"kept, grouped experts", kept.get()}, {"kept, each expert apart", per_expert.get()}, {"widened", widened.get()}};
  for (const auto& [name, gpu] : uploads) {
    std::vector<float> logits;
    const int s = take(gpu->add_sequence());
    SLIMKV_ASSERT_OK(gpu->step(std::vector<SequenceTokens>{{s, prompt}}, /*all_logits=*/true, logits));
    const double error = relative_max_error(logits, cpu_logits);
    std::printf("  %s: prefill vs the CPU's %.2e\n", name, error);
    EXPECT_LT(error, kGpuVsCpu) << name;
  }
}

// Where each expert's own products run the matrix-vector kernel too (no expert of more than
// kQuantizedGemvMaxInputs rows in a step), the grouped products give the same bits (the same loop,
// weight_rows.cuh; the activation and the weighted sum as the separate kernels compute them): the Q8_0
// fixture's 8-token prefill and decode steps after it, every logit equal.
TEST_F(GgufCuda, GroupedExpertsGiveEachExpertsProductsBits) {
  auto cpu_model = take(LlamaModel::load(kDir + "/qwen3moe_tiny-Q8_0.gguf"));
  const ModelConfig& c = cpu_model->config();
  const std::vector<int32_t> prompt = clearly_routed_prompt(c.vocab_size, 8);
  std::vector<std::vector<float>> logits;
  for (const bool grouped : {true, false}) {
    CudaModelOptions options = one_sequence();
    options.grouped_experts = grouped;
    auto gpu = take(CudaLlamaModel::upload(c, cpu_model->weights(), options));
    ASSERT_TRUE(gpu);
    const int s = take(gpu->add_sequence());
    std::vector<float>& all = logits.emplace_back();
    SLIMKV_ASSERT_OK(gpu->step(std::vector<SequenceTokens>{{s, prompt}}, /*all_logits=*/true, all));
    for (int32_t next = 0; next < 4; ++next) {
      std::vector<float> row;
      SLIMKV_ASSERT_OK(gpu->step(std::vector<SequenceTokens>{{s, std::span(&next, 1)}}, /*all_logits=*/false, row));
      all.insert(all.end(), row.begin(), row.end());
    }
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  for (size_t i = 0; i < logits[0].size(); ++i) {
    ASSERT_EQ(logits[0][i], logits[1][i]) << "row " << i / size_t(c.vocab_size) << ", logit " << i % size_t(c.vocab_size);
  }
}

// Random models run in every kind random() makes at their shape: finite logits in prefill and decode.
// The Q4_K_M fixture's shape (Q4_K_M-like blocks and the others), and a Qwen3-MoE of 64 experts, 8 a
// token (whole Q4_K blocks need rows of 256: its 32 are refused, ShapesTheBlocksCannotHoldAreRefused).
TEST_F(GgufCuda, RandomQuantizedModelsGiveFiniteLogits) {
  const ModelConfig llama_k = take(LlamaModel::load(kDir + "/llama_k-Q4_K_M.gguf"))->config();
  ModelConfig moe = take(LlamaModel::load(kDir + "/qwen3moe_tiny-Q8_0.gguf"))->config();
  moe.moe.num_experts = 64;
  moe.moe.experts_per_token = 8;
  const std::pair<ModelConfig, std::vector<RandomWeights>> shapes[] = {
      {llama_k, {RandomWeights::kQ4_K_M, RandomWeights::kQ8_0, RandomWeights::kQ4_0, RandomWeights::kF16}},
      {moe, {RandomWeights::kQ8_0, RandomWeights::kQ4_0, RandomWeights::kF16}}};
  CudaModelOptions options;
  options.max_sequences = 2;
  options.max_step_tokens = 64;
  for (const auto& [c, kinds] : shapes) {
    SCOPED_TRACE(str_cat(c.architecture_name, " of ", c.moe.num_experts, " experts"));
    for (RandomWeights kind : kinds) {
      auto model = take(CudaLlamaModel::random(c, 3, options, kind));
      ASSERT_TRUE(model);
      SCOPED_TRACE(model->weight_description());
      std::vector<int32_t> prompt(40);
      for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 11 + 2) % size_t(c.vocab_size));
      const int s = take(model->add_sequence());
      std::vector<float> logits;
      SLIMKV_ASSERT_OK(model->step(std::vector<SequenceTokens>{{s, prompt}}, /*all_logits=*/true, logits));
      for (int step = 0; step < 4; ++step) {
        std::vector<float> row;
        const int32_t next = int32_t(step);
        SLIMKV_ASSERT_OK(model->step(std::vector<SequenceTokens>{{s, std::span(&next, 1)}}, false, row));
        logits.insert(logits.end(), row.begin(), row.end());
      }
      double largest = 0;
      for (float v : logits) {
        ASSERT_TRUE(std::isfinite(v));
        largest = std::max(largest, double(std::fabs(v)));
      }
      EXPECT_GT(largest, 0.0);
    }
  }
}

// SLIMKV_CUDA_GGUF_WEIGHTS chooses blocks or widened FP16 for the engine: an unknown value is refused at
// load naming the variable and its choices; `widened` gives the blocks' prefill logits within the
// embedding's FP16 rounding (as QuantizedWeightsTakeTheFilesBytes holds the two uploads).
TEST_F(GgufCuda, TheEnvironmentChoosesBlocksOrWidened) {
  const std::string file = kDir + "/llama_k-Q4_K_M.gguf";
  std::vector<int32_t> prompt(12);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(i * 7 + 3);
  EngineConfig config;
  config.model_dir = file;
  config.device = "cuda";
  ASSERT_EQ(setenv("SLIMKV_CUDA_GGUF_WEIGHTS", "fp8", 1), 0);
  Expected<std::unique_ptr<Engine>> refused = Engine::load(config);
  ASSERT_FALSE(refused.has_value());
  EXPECT_NE(refused.status().message().find("SLIMKV_CUDA_GGUF_WEIGHTS=fp8: expected blocks (the default) or widened"),
            std::string::npos)
      << refused.status().message();
  ASSERT_EQ(setenv("SLIMKV_CUDA_GGUF_WEIGHTS", "widened", 1), 0);
  const std::vector<float> widened = take(load(file, "cuda")->new_session()->prefill(prompt, /*all_logits=*/true));
  ASSERT_EQ(unsetenv("SLIMKV_CUDA_GGUF_WEIGHTS"), 0);
  const std::vector<float> blocks = take(load(file, "cuda")->new_session()->prefill(prompt, /*all_logits=*/true));
  EXPECT_LT(relative_max_error(blocks, widened), 5e-3);
}

// Rows that are not whole blocks are refused at upload, naming the tensor, the type and the multiple.
TEST_F(GgufCuda, ShapesTheBlocksCannotHoldAreRefused) {
  auto cpu_model = take(LlamaModel::load(kDir + "/llama_tiny-Q8_0.gguf"));  // hidden 64: no whole Q4_K block
  CudaModelOptions options;
  options.max_sequences = 1;
  options.max_step_tokens = 16;
  const auto refused = CudaLlamaModel::random(cpu_model->config(), 1, options, RandomWeights::kQ4_K_M);
  ASSERT_FALSE(refused.has_value());
  for (const char* part : {"token_embd", "Q4_K", "multiple of 256"}) {
    EXPECT_NE(refused.status().message().find(part), std::string::npos) << refused.status().message();
  }
}

}  // namespace
}  // namespace slimkv::cuda
