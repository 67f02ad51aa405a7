// ModelConfig: what a Hugging Face config.json says about a Llama-family model, validated.
// Both layouts in the wild are read: transformers 4.x (`rope_theta`, `rope_scaling`, `torch_dtype`)
// and 5.x (`rope_parameters`, `dtype`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "slimkv/status.h"
#include "tensor/dtype.h"

namespace slimkv {

enum class Architecture { kLlama, kMistral, kQwen2 };

enum class RopeType { kDefault, kLlama3 };

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  // llama3 only (rope_type "llama3"): frequency-dependent scaling of the inverse frequencies.
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
  // GGUF files store llama3-style scaling as per-frequency divisors (tensor rope_freqs.weight, what
  // llama.cpp divides each frequency by) instead of its parameters: [head_dim / 2], or empty.
  std::vector<float> frequency_divisors;
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

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  int64_t gqa_group_size() const { return num_heads / num_kv_heads; }
};

// Parses and validates config.json text. `source` names the file in errors ("DIR/config.json: ...").
// Refuses unknown architectures, rope types, dtypes, hidden_act other than silu, inconsistent head
// counts, sliding windows shorter than the context, with a message naming the field and its value.
Expected<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source);

// Reads and parses `model_dir`/config.json.
Expected<ModelConfig> load_model_config(const std::string& model_dir);

}  // namespace slimkv
