// Model shapes the GPU benchmarks generate random weights for (CudaLlamaModel::random: FP16, or GGUF
// blocks): real models' sizes without downloading them.
#pragma once

#include <cmath>
#include <exception>
#include <string>

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

inline Expected<ModelConfig> random_shape(const std::string& name) {
  if (name == "llama3-8b") return llama3_8b_config();
  if (name == "llama2-7b") return llama2_7b_config();
  return error("random model shape '", name, "': known shapes are llama3-8b, llama2-7b");
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

// Whether resident dense (FP16 weights and KV) fits the GPU's free memory with 4 GB left for activations.
inline Expected<bool> resident_dense_fits(const ModelConfig& shape, const ContextBatch& c) {
  SLIMKV_ASSIGN_OR_RETURN(size_t free_bytes, device_free_memory());
  const double kv = double(c.batch) * (c.context + 64) * double(shape.num_layers) * 4.0 * double(shape.kv_dim());
  const double weights = 2.0 * (double(shape.num_layers) * (double(shape.hidden_size) * (2.0 * shape.q_dim() + 2 * shape.kv_dim()) +
                                                            3.0 * double(shape.hidden_size) * shape.intermediate_size) +
                                2.0 * double(shape.vocab_size) * shape.hidden_size);
  return kv + weights + 4e9 < double(free_bytes);
}

}  // namespace slimkv::cuda
