// Model shapes the GPU benchmarks generate random FP16 weights for (CudaLlamaModel::random): real
// models' sizes without downloading them.
#pragma once

#include <string>

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
  return c;
}

inline Expected<ModelConfig> random_shape(const std::string& name) {
  if (name == "llama3-8b") return llama3_8b_config();
  if (name == "llama2-7b") return llama2_7b_config();
  return error("random model shape '", name, "': known shapes are llama3-8b, llama2-7b");
}

}  // namespace slimkv::cuda
