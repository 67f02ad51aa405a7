// ModelConfig: what a Hugging Face config.json says about a decoder-only model of the families slimkv
// runs (Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Gemma 3), validated. Both layouts in the wild are read:
// transformers 4.x (`rope_theta`, `rope_scaling`, `torch_dtype`, Gemma's `rope_local_base_freq`) and 5.x
// (`rope_parameters`, per layer type for Gemma 3; `dtype`).
// The forward pass reads only the features below (norms, activation, sliding layers, experts), never the
// architecture's name: another source of the same facts (GGUF metadata) fills the same struct.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "slimkv/status.h"
#include "tensor/dtype.h"

namespace slimkv {

enum class Architecture { kLlama, kMistral, kQwen2, kQwen3, kQwen3Moe, kGemma3 };

enum class RopeType { kDefault, kLinear, kLlama3 };

// The MLP's gating nonlinearity: silu(gate)·up (SwiGLU), or gelu_tanh(gate)·up (GeGLU, Gemma).
enum class Activation { kSilu, kGeluTanh };

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  // linear and llama3: inverse frequencies divided by `factor` (llama3: only the long wavelengths).
  // llama3 only (rope_type "llama3"): frequency-dependent scaling of the inverse frequencies.
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
  // GGUF files store llama3-style scaling as per-frequency divisors (tensor rope_freqs.weight, what
  // llama.cpp divides each frequency by) instead of its parameters: [head_dim / 2], or empty.
  std::vector<float> frequency_divisors;
};

// A sparse mixture-of-experts feed-forward (Qwen3-MoE): a router picks experts_per_token of num_experts
// SwiGLU experts per token by softmax; their outputs are summed, weighted by the routing probabilities.
struct MoeConfig {
  int64_t num_experts = 0;  // 0: every layer has a dense MLP
  int64_t experts_per_token = 0;
  int64_t expert_intermediate_size = 0;
  bool normalize_top_k = false;      // norm_topk_prob: the top-k probabilities are rescaled to sum to 1
  std::vector<bool> sparse_layers;   // [num_layers]: which layers route (decoder_sparse_step, mlp_only_layers)
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  std::string architecture_name;  // as config.json's "architectures"[0] says, e.g. "Qwen2ForCausalLM"

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;        // dim of the residual stream
  int64_t intermediate_size = 0;  // SwiGLU hidden dim
  int64_t num_layers = 0;         // num_hidden_layers
  int64_t num_heads = 0;          // num_attention_heads (query heads)
  int64_t num_kv_heads = 0;       // num_key_value_heads (null: num_heads; absent: HF's default)
  int64_t head_dim = 0;           // explicit "head_dim", else hidden_size / num_heads
  int64_t max_position_embeddings = 0;  // the context length
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections have biases (Qwen2 always; Llama's "attention_bias")
  DType dtype = DType::kF32;    // "torch_dtype" / "dtype": the checkpoint's dtype as declared

  std::vector<int64_t> eos_token_ids;  // "eos_token_id": an int or a list; may be empty
  int64_t bos_token_id = -1;           // -1 when absent

  // Family features.
  bool qk_norm = false;           // Qwen3, Gemma 3: RMSNorm over each head's q and k before RoPE
  bool norm_adds_one = false;     // Gemma: RMSNorm scales by (1 + w) (the stored w is the offset from 1)
  bool sandwich_norms = false;    // Gemma 3: attention and MLP outputs are normed before the residual add
  bool scale_embeddings = false;  // Gemma: embeddings × √hidden_size
  // How that scale is applied: rounded to `dtype` first, as transformers multiplies in the weights'
  // dtype (config.json); or as an F32 value, as llama.cpp multiplies (GGUF).
  bool embedding_scale_in_dtype = true;
  Activation activation = Activation::kSilu;
  double attention_scale = 0;     // softmax scale: 1/√query_pre_attn_scalar (Gemma) or 1/√head_dim
  double final_logit_softcap = 0; // Gemma: logits = cap·tanh(logits / cap); 0: none
  // Sliding-window layers (Gemma 3): a query at position p sees positions p - sliding_window + 1 .. p.
  std::vector<bool> sliding_layers;  // [num_layers]; empty: every layer attends over the whole context
  int64_t sliding_window = 0;
  RopeConfig sliding_rope;           // the sliding layers' RoPE (Gemma 3: rope_local_base_freq)
  MoeConfig moe;

  // The features above that the plain Llama layer lacks, e.g. "q/k norms, experts"; empty for Llama,
  // Mistral and Qwen2 (for a backend that runs that layer only, to say what it cannot run).
  std::string features_beyond_llama() const;
  bool is_sliding(int64_t layer) const { return !sliding_layers.empty() && sliding_layers[size_t(layer)]; }
  bool is_sparse(int64_t layer) const { return moe.num_experts > 0 && moe.sparse_layers[size_t(layer)]; }
  // What embeddings are multiplied by: √hidden_size where the family scales (rounded to `dtype` when
  // embedding_scale_in_dtype: transformers multiplies in the weights' dtype, llama.cpp in F32), else 1.
  float embedding_scale() const;
  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  int64_t gqa_group_size() const { return num_heads / num_kv_heads; }
};

// Parses and validates config.json text. `source` names the file in errors ("DIR/config.json: ...").
// Refuses unknown architectures, rope types, dtypes, activations other than the family's, inconsistent
// head counts, sliding windows shorter than the context where the family has no sliding layers (Mistral,
// Qwen2, Qwen3), with a message naming the field and its value.
Expected<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source);

// Reads and parses `model_dir`/config.json.
Expected<ModelConfig> load_model_config(const std::string& model_dir);

}  // namespace slimkv
