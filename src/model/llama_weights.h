// The weights of a Llama-family model (Llama, Mistral, Qwen2), found by their Hugging Face names and
// checked against the shapes the config implies. Matrices stay memory-mapped in their stored dtype;
// the small vectors (norms, biases) are widened to FP32 once.
#pragma once

#include <optional>
#include <vector>

#include "backend/cpu/matmul.h"
#include "model/model_config.h"
#include "model/weight_store.h"

namespace slimkv {

struct LayerWeights {
  std::vector<float> attention_norm;  // (hidden)           input_layernorm
  WeightMatrix wq;                    // (q_dim, hidden)
  WeightMatrix wk;                    // (kv_dim, hidden)
  WeightMatrix wv;                    // (kv_dim, hidden)
  std::vector<float> bq, bk, bv;      // (q_dim), (kv_dim), (kv_dim); empty without attention_bias
  WeightMatrix wo;                    // (hidden, q_dim)
  std::vector<float> mlp_norm;        // (hidden)           post_attention_layernorm
  WeightMatrix w_gate;                // (intermediate, hidden)
  WeightMatrix w_up;                  // (intermediate, hidden)
  WeightMatrix w_down;                // (hidden, intermediate)
};

struct LlamaWeights {
  WeightMatrix embedding;          // (vocab, hidden)   model.embed_tokens
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;   // (hidden)          model.norm
  WeightMatrix lm_head;            // (vocab, hidden)   lm_head, or the embedding when tied

  static Expected<LlamaWeights> load(const WeightStore& store, const ModelConfig& config);
};

}  // namespace slimkv
