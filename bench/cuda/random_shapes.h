// Model shapes the GPU benchmarks generate random weights for (CudaLlamaModel::random: FP16, or GGUF
// blocks): real models' sizes without downloading them.
#pragma once

#include <cmath>
#include <exception>
#include <string>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "model/model_config.h"
#include "slimkv/status.h"

namespace slimkv::cuda {

// Llama-3-8B: GQA, 8 KV heads of 32 — a token's K and V (4 KB a layer) are half its hidden state.
inline ModelConfig llama3_8b_config() {
  ModelConfig c;
  c.architecture_name = "llama3-8b (random weights)";
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_layers = 32;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5;
  c.rope = {RopeType::kLlama3, 500000.0, 8.0, 1.0, 4.0, 8192, {}};
  c.attention_scale = 1.0 / std::sqrt(128.0);
  return c;
}

// Llama-2-7B: multi-head attention — a token's K and V (16 KB a layer) are twice its hidden state, the
// case KVPR was written for (its models are OPT and Llama-2 shaped). Its context is stretched to 128K
// (RoPE as is) so that long contexts can be timed.
inline ModelConfig llama2_7b_config() {
  ModelConfig c;
  c.architecture_name = "llama2-7b (random weights)";
  c.vocab_size = 32000;
  c.hidden_size = 4096;
  c.intermediate_size = 11008;
  c.num_layers = 32;
  c.num_heads = 32;
  c.num_kv_heads = 32;
  c.head_dim = 128;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5;
  c.rope = {RopeType::kDefault, 10000.0, 1.0, 1.0, 4.0, 0, {}};
  c.attention_scale = 1.0 / std::sqrt(128.0);
  return c;
}

// Qwen3-30B-A3B: a mixture of experts, 8 of 128 experts of 768 a token in every layer (3.3B of its
// 30.5B parameters active a token; FP16 weights 61 GB), q/k norms, GQA of 4 KV heads.
inline ModelConfig qwen3_30b_a3b_config() {
  ModelConfig c;
  c.architecture = Architecture::kQwen3Moe;
  c.architecture_name = "qwen3-30b-a3b (random weights)";
  c.vocab_size = 151936;
  c.hidden_size = 2048;
  c.intermediate_size = 6144;
  c.num_layers = 48;
  c.num_heads = 32;
  c.num_kv_heads = 4;
  c.head_dim = 128;
  c.max_position_embeddings = 40960;
  c.rms_norm_eps = 1e-6;
  c.rope = {RopeType::kDefault, 1000000.0, 1.0, 1.0, 4.0, 0, {}};
  c.attention_scale = 1.0 / std::sqrt(128.0);
  c.qk_norm = true;
  c.moe = {128, 8, 768, true, std::vector<bool>(48, true)};
  return c;
}

inline Expected<ModelConfig> random_shape(const std::string& name) {
  if (name == "llama3-8b") return llama3_8b_config();
  if (name == "llama2-7b") return llama2_7b_config();
  if (name == "qwen3-30b-a3b") return qwen3_30b_a3b_config();
  return error("random model shape '", name, "': known shapes are llama3-8b, llama2-7b, qwen3-30b-a3b");
}

// A benchmark configuration "CONTEXTxBATCH" (e.g. 32768x8): `batch` sequences of `context` tokens each.
struct ContextBatch {
  int context = 0, batch = 0;
};

inline Expected<ContextBatch> parse_context_batch(const std::string& text) {
  const size_t x = text.find('x');
  try {
    if (x != std::string::npos) {
      const ContextBatch c{std::stoi(text.substr(0, x)), std::stoi(text.substr(x + 1))};
      if (c.context > 0 && c.batch > 0) return c;
    }
  } catch (const std::exception&) {
  }
  return error("'", text, "': expected CONTEXTxBATCH, e.g. 32768x8");
}

// The parameters of a shape's matrices (an untied embedding and lm_head both), and of those its experts'.
struct ShapeParameters {
  double all = 0, experts = 0;
};
inline ShapeParameters shape_parameters(const ModelConfig& shape) {
  const double hidden = double(shape.hidden_size);
  ShapeParameters p{2.0 * double(shape.vocab_size) * hidden, 0};
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    p.all += hidden * (2.0 * double(shape.q_dim()) + 2.0 * double(shape.kv_dim()));
    if (!shape.is_sparse(l)) {
      p.all += 3.0 * hidden * double(shape.intermediate_size);
      continue;
    }
    const double experts = double(shape.moe.num_experts) * 3.0 * hidden * double(shape.moe.expert_intermediate_size);
    p.experts += experts;
    p.all += experts + double(shape.moe.num_experts) * hidden;  // and the router
  }
  return p;
}

// Whether resident dense (FP16 weights and KV) fits the GPU's free memory with 4 GB left for activations.
inline Expected<bool> resident_dense_fits(const ModelConfig& shape, const ContextBatch& c) {
  SLIMKV_ASSIGN_OR_RETURN(size_t free_bytes, device_free_memory());
  const double kv = double(c.batch) * (c.context + 64) * double(shape.num_layers) * 4.0 * double(shape.kv_dim());
  const double weights = 2.0 * shape_parameters(shape).all;
  return kv + weights + 4e9 < double(free_bytes);
}

}  // namespace slimkv::cuda
