// The weights of a model of the Llama family and its descendants (Llama, Mistral, Qwen2, Qwen3,
// Qwen3-MoE, Gemma 3), found by their Hugging Face names and checked against the shapes the config
// implies. Matrices stay memory-mapped in their stored dtype; the small vectors (norms, biases) are
// widened to FP32 once, and Gemma's (1 + w) norm weights are stored as that sum.
#pragma once

#include <optional>
#include <vector>

#include "backend/cpu/matmul.h"
#include "model/model_config.h"
#include "model/weight_store.h"

namespace slimkv {

// One SwiGLU/GeGLU feed-forward: down(act(gate(x)) · up(x)).
struct MlpWeights {
  WeightMatrix gate;  // (intermediate, hidden)
  WeightMatrix up;    // (intermediate, hidden)
  WeightMatrix down;  // (hidden, intermediate)
};

struct LayerWeights {
  std::vector<float> attention_norm;  // (hidden)           input_layernorm
  WeightMatrix wq;                    // (q_dim, hidden)
  WeightMatrix wk;                    // (kv_dim, hidden)
  WeightMatrix wv;                    // (kv_dim, hidden)
  std::vector<float> bq, bk, bv;      // (q_dim), (kv_dim), (kv_dim); empty without attention_bias
  std::vector<float> q_norm, k_norm;  // (head_dim) each, with qk_norm; else empty
  WeightMatrix wo;                    // (hidden, q_dim)
  std::vector<float> attention_out_norm;  // (hidden)      sandwich_norms: post_attention_layernorm; else empty
  std::vector<float> mlp_norm;        // (hidden)           post_attention_layernorm (Gemma: pre_feedforward_)
  std::vector<float> mlp_out_norm;    // (hidden)           sandwich_norms: post_feedforward_layernorm
  MlpWeights mlp;                     // a dense layer's MLP (intermediate_size)
  WeightMatrix router;                // (num_experts, hidden)  a sparse layer's mlp.gate; else empty
  std::vector<MlpWeights> experts;    // a sparse layer's experts (expert_intermediate_size); else empty
};

struct LlamaWeights {
  WeightMatrix embedding;          // (vocab, hidden)   model.embed_tokens
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;   // (hidden)          model.norm
  WeightMatrix lm_head;            // (vocab, hidden)   lm_head, or the embedding when tied

  static Expected<LlamaWeights> load(const WeightStore& store, const ModelConfig& config);
};

}  // namespace slimkv
