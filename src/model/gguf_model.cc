#include "model/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace slimkv {
namespace {

// ---------------------------------------------------------------------------------------------
// The tables: a GGUF architecture is one row of kArchitectures; its config keys and tensor names
// follow llama.cpp's conventions (gguf-py `constants.py` KEY_* and MODEL_TENSOR names).
// ---------------------------------------------------------------------------------------------

Status read_experts(const GgufFile& file, const std::string& prefix, ModelConfig* config);
Status read_gemma3(const GgufFile& file, const std::string& prefix, ModelConfig* config);

struct GgufArchitecture {
  std::string_view name;          // general.architecture
  Architecture architecture;      // the slimkv family that computes it
  std::string_view hf_name;       // the transformers class it was converted from
  bool permute_qk;                // the converter interleaved Q/K rows per head (llama.cpp's "normal" RoPE)
  bool attention_bias;            // q/k/v projections have biases
  bool qk_norm;                   // blk.N.attn_q_norm / attn_k_norm: RMSNorm over each head before RoPE
  // The rest of the family's features, from its own keys (and llama.cpp's fixed choices); may be null.
  Status (*read_features)(const GgufFile& file, const std::string& prefix, ModelConfig* config);
};

// qwen3, qwen3moe and gemma3 use NEOX RoPE (rotate halves, as transformers): no Q/K permutation.
constexpr GgufArchitecture kArchitectures[] = {
    {"llama", Architecture::kLlama, "LlamaForCausalLM", true, false, false, nullptr},
    {"qwen2", Architecture::kQwen2, "Qwen2ForCausalLM", false, true, false, nullptr},
    {"qwen3", Architecture::kQwen3, "Qwen3ForCausalLM", false, false, true, nullptr},
    {"qwen3moe", Architecture::kQwen3Moe, "Qwen3MoeForCausalLM", false, false, true, read_experts},
    {"gemma3", Architecture::kGemma3, "Gemma3ForCausalLM", false, false, true, read_gemma3},
};

// "{arch}.<suffix>" -> a ModelConfig integer field. Optional keys keep the field's default (set below
// before the table is read).
struct IntKey {
  std::string_view suffix;
  int64_t ModelConfig::*field;
  bool required;
};
constexpr IntKey kIntKeys[] = {
    {"block_count", &ModelConfig::num_layers, true},
    {"embedding_length", &ModelConfig::hidden_size, true},
    {"feed_forward_length", &ModelConfig::intermediate_size, true},
    {"attention.head_count", &ModelConfig::num_heads, true},
    {"context_length", &ModelConfig::max_position_embeddings, true},
    {"attention.head_count_kv", &ModelConfig::num_kv_heads, false},  // default: head_count
    {"attention.key_length", &ModelConfig::head_dim, false},         // default: embedding / heads
};

// Per-layer tensors: blk.N.<gguf> -> model.layers.N.<hf>, for both ".weight" and ".bias".
struct TensorName {
  std::string_view gguf;
  std::string_view hf;
};
constexpr TensorName kLayerTensors[] = {
    {"attn_norm", "input_layernorm"},     {"attn_q", "self_attn.q_proj"},     {"attn_k", "self_attn.k_proj"},
    {"attn_v", "self_attn.v_proj"},       {"attn_output", "self_attn.o_proj"}, {"ffn_norm", "post_attention_layernorm"},
    {"ffn_gate", "mlp.gate_proj"},        {"ffn_up", "mlp.up_proj"},          {"ffn_down", "mlp.down_proj"},
    {"attn_q_norm", "self_attn.q_norm"},  {"attn_k_norm", "self_attn.k_norm"}, {"ffn_gate_inp", "mlp.gate"},
};
// Gemma 3's sandwich norms, looked up first for that family: there ffn_norm is the pre-MLP norm and
// transformers' post_attention_layernorm is the norm of the attention's output.
constexpr TensorName kSandwichNormTensors[] = {
    {"ffn_norm", "pre_feedforward_layernorm"},
    {"post_attention_norm", "post_attention_layernorm"},
    {"post_ffw_norm", "post_feedforward_layernorm"},
};
// Mixture-of-experts layers store their experts stacked, [num_experts, rows, cols] per matrix; each
// expert's slice becomes the Hub's one tensor per expert, model.layers.N.mlp.experts.E.<hf>.weight.
constexpr TensorName kStackedExpertTensors[] = {
    {"ffn_gate_exps", "gate_proj"}, {"ffn_up_exps", "up_proj"}, {"ffn_down_exps", "down_proj"}};
constexpr TensorName kModelTensors[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};
constexpr std::string_view kRopeFrequencies = "rope_freqs.weight";  // llama3-style scaling, [head_dim / 2]

// ---------------------------------------------------------------------------------------------
// Config
// ---------------------------------------------------------------------------------------------

Expected<const GgufArchitecture*> find_architecture(const GgufFile& file) {
  SLIMKV_ASSIGN_OR_RETURN(const std::string name, file.get_string("general.architecture"));
  std::string known;
  for (const GgufArchitecture& arch : kArchitectures) {
    if (arch.name == name) return &arch;
    known += str_cat(known.empty() ? "" : ", ", arch.name);
  }
  return error(file.path(), ": metadata 'general.architecture' is \"", name, "\"; slimkv runs GGUF files of ", known);
}

Expected<int64_t> positive(const GgufFile& file, const std::string& key) {
  SLIMKV_ASSIGN_OR_RETURN(const int64_t value, file.get_int(key));
  if (value <= 0 || value > (int64_t(1) << 31)) {
    return error(file.path(), ": metadata '", key, "' is ", value, ", expected a positive size below 2^31");
  }
  return value;
}

const GgufTensor* find_tensor(const GgufFile& file, std::string_view name) {
  for (const GgufTensor& tensor : file.tensors()) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

// The token id under `key`, or -1 when absent.
Expected<int64_t> token_id(const GgufFile& file, const std::string& key, int64_t vocab_size) {
  if (!file.find(key)) return int64_t(-1);
  SLIMKV_ASSIGN_OR_RETURN(const int64_t id, file.get_int(key));
  if (id < 0 || id >= vocab_size) {
    return error(file.path(), ": metadata '", key, "' is ", id, ", expected a token id below the vocabulary size ",
                 vocab_size);
  }
  return id;
}

Status read_rope(const GgufFile& file, const std::string& arch, ModelConfig* config) {
  if (file.find(arch + ".rope.freq_base")) {
    SLIMKV_ASSIGN_OR_RETURN(config->rope.theta, file.get_real(arch + ".rope.freq_base"));
    if (!(config->rope.theta > 1.0)) {
      return error(file.path(), ": metadata '", arch, ".rope.freq_base' is ", config->rope.theta, ", expected > 1");
    }
  }
  if (file.find(arch + ".rope.scaling.type")) {
    SLIMKV_ASSIGN_OR_RETURN(const std::string type, file.get_string(arch + ".rope.scaling.type"));
    if (type == "linear") {  // positions divided by the factor (Gemma 3: its global layers only)
      config->rope.type = RopeType::kLinear;
      SLIMKV_ASSIGN_OR_RETURN(config->rope.factor, file.get_real(arch + ".rope.scaling.factor"));
      if (!(config->rope.factor > 0.0) || !std::isfinite(config->rope.factor)) {
        return error(file.path(), ": metadata '", arch, ".rope.scaling.factor' is ", config->rope.factor,
                     ", expected a positive number");
      }
    } else if (type != "none") {
      return error(file.path(), ": metadata '", arch, ".rope.scaling.type' is \"", type,
                   "\"; slimkv reads GGUF RoPE scaling \"none\", \"linear\" and rope_freqs (llama3 style)");
    }
  }
  if (file.find(arch + ".rope.dimension_count")) {
    SLIMKV_ASSIGN_OR_RETURN(const int64_t dims, file.get_int(arch + ".rope.dimension_count"));
    if (dims != config->head_dim) {
      return error(file.path(), ": metadata '", arch, ".rope.dimension_count' is ", dims,
                   ", but slimkv rotates whole heads (head_dim ", config->head_dim, ")");
    }
  }
  const GgufTensor* frequencies = find_tensor(file, kRopeFrequencies);
  if (!frequencies) return Status::ok();
  if (frequencies->type->id != kGgmlF32 || frequencies->shape != std::vector<int64_t>{config->head_dim / 2}) {
    return error(file.path(), ": tensor '", kRopeFrequencies, "' should be F32 [", config->head_dim / 2, "]");
  }
  config->rope.frequency_divisors.resize(size_t(config->head_dim / 2));
  std::memcpy(config->rope.frequency_divisors.data(), frequencies->data, frequencies->size_bytes);
  for (float divisor : config->rope.frequency_divisors) {
    if (!(divisor > 0.0f) || !std::isfinite(divisor)) {
      return error(file.path(), ": tensor '", kRopeFrequencies, "' holds ", divisor, ", expected positive divisors");
    }
  }
  return Status::ok();
}

// Qwen3-MoE as llama.cpp computes it: a layer routes when it has a router (blk.N.ffn_gate_inp), softmax
// over all experts, the top expert_used_count renormalised (llama.cpp's qwen3moe graph always does;
// expert_weights_norm, where a file has it, says so explicitly).
Status read_experts(const GgufFile& file, const std::string& prefix, ModelConfig* config) {
  MoeConfig& moe = config->moe;
  SLIMKV_ASSIGN_OR_RETURN(moe.num_experts, positive(file, prefix + "expert_count"));
  SLIMKV_ASSIGN_OR_RETURN(moe.experts_per_token, positive(file, prefix + "expert_used_count"));
  if (moe.experts_per_token > moe.num_experts) {
    return error(file.path(), ": metadata '", prefix, "expert_used_count' is ", moe.experts_per_token,
                 ", more than '", prefix, "expert_count' (", moe.num_experts, ")");
  }
  SLIMKV_ASSIGN_OR_RETURN(moe.expert_intermediate_size, positive(file, prefix + "expert_feed_forward_length"));
  moe.normalize_top_k = true;
  if (file.find(prefix + "expert_weights_norm")) {
    SLIMKV_ASSIGN_OR_RETURN(const int64_t norm, file.get_int(prefix + "expert_weights_norm"));
    moe.normalize_top_k = norm != 0;
  }
  for (int64_t i = 0; i < config->num_layers; ++i) {
    moe.sparse_layers.push_back(find_tensor(file, str_cat("blk.", i, ".ffn_gate_inp.weight")) != nullptr);
  }
  return Status::ok();
}

// Gemma 3 as llama.cpp's loader reads it (llama-model.cpp, LLM_ARCH_GEMMA3): the window comes from the
// file; the layer pattern (every 6th layer global), the sliding layers' RoPE base (10000, unscaled) and
// the softmax scale are fixed there, as the released models have them. The converter stored every
// RMSNorm weight as 1 + w, so the norms scale by the stored weight.
Status read_gemma3(const GgufFile& file, const std::string& prefix, ModelConfig* config) {
  SLIMKV_ASSIGN_OR_RETURN(config->sliding_window, positive(file, prefix + "attention.sliding_window"));
  for (int64_t i = 0; i < config->num_layers; ++i) config->sliding_layers.push_back((i + 1) % 6 != 0);
  config->sliding_rope = RopeConfig{};
  config->sliding_rope.theta = 10000.0;
  // query_pre_attn_scalar is not stored: llama.cpp takes head_dim, except for the 27B model (62 layers),
  // whose scalar is hidden / heads.
  const int64_t query_scalar = config->num_layers == 62 ? config->hidden_size / config->num_heads : config->head_dim;
  config->attention_scale = 1.0 / std::sqrt(double(query_scalar));
  config->sandwich_norms = config->scale_embeddings = true;
  config->embedding_scale_in_dtype = false;  // llama.cpp: ggml_scale by sqrtf(n_embd) on F32 rows
  config->norm_adds_one = false;
  config->activation = Activation::kGeluTanh;
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Tensors
// ---------------------------------------------------------------------------------------------

// "blk.N.<rest>" -> N and rest; -1 for other names.
int layer_of(const std::string& name, std::string* rest) {
  int layer = -1, consumed = 0;
  if (std::sscanf(name.c_str(), "blk.%d.%n", &layer, &consumed) != 1 || layer < 0 || consumed == 0) return -1;
  *rest = name.substr(size_t(consumed));
  return layer;
}

// The Hugging Face name of a GGUF tensor; empty when it has none (then it keeps its own name).
std::string hf_tensor_name(const std::string& name, bool sandwich_norms) {
  for (const TensorName& entry : kModelTensors) {
    if (entry.gguf == name) return std::string(entry.hf);
  }
  std::string rest;
  const int layer = layer_of(name, &rest);
  if (layer < 0) return "";
  const auto lookup = [&](std::span<const TensorName> table) -> std::string {
    for (const TensorName& entry : table) {
      for (std::string_view suffix : {".weight", ".bias"}) {
        if (rest == str_cat(entry.gguf, suffix)) return str_cat("model.layers.", layer, ".", entry.hf, suffix);
      }
    }
    return "";
  };
  std::string hf = sandwich_norms ? lookup(kSandwichNormTensors) : "";
  return hf.empty() ? lookup(kLayerTensors) : hf;
}

// A stacked expert tensor [num_experts, rows, cols] as one tensor per expert, each a view of its slice
// (an expert's rows are whole rows, so quantized blocks never straddle two experts).
Status split_experts(const TensorInfo& stacked, int layer, std::string_view hf, std::vector<TensorInfo>* out) {
  const int64_t experts = stacked.shape.size() == 3 ? stacked.shape[0] : 0;
  if (experts == 0 || stacked.size_bytes % size_t(experts) != 0) {
    return error(stacked.file, ": tensor '", stacked.name, "' should be 3-D [experts, rows, columns]");
  }
  const size_t slice_bytes = stacked.size_bytes / size_t(experts);
  for (int64_t e = 0; e < experts; ++e) {
    TensorInfo expert = stacked;
    expert.name = str_cat("model.layers.", layer, ".mlp.experts.", e, ".", hf, ".weight");
    expert.shape = {stacked.shape[1], stacked.shape[2]};
    expert.data = stacked.data + size_t(e) * slice_bytes;
    expert.size_bytes = slice_bytes;
    expert.data_begin = stacked.data_begin + uint64_t(e) * slice_bytes;
    expert.data_end = expert.data_begin + slice_bytes;
    out->push_back(std::move(expert));
  }
  return Status::ok();
}

TensorInfo tensor_info(const GgufTensor& tensor, std::string name, const std::string& path) {
  TensorInfo info;
  info.name = std::move(name);
  info.shape = tensor.shape;
  info.data = tensor.data;
  info.size_bytes = tensor.size_bytes;
  info.file = path;
  info.stored_dtype = std::string(tensor.type->name);
  info.dtype_supported = tensor.type->supported;
  info.data_begin = tensor.offset;
  info.data_end = tensor.offset + tensor.size_bytes;
  switch (tensor.type->id) {
    case kGgmlF32: info.dtype = DType::kF32; break;
    case kGgmlF16: info.dtype = DType::kF16; break;
    case kGgmlBF16: info.dtype = DType::kBF16; break;
    case kGgmlQ8_0: info.quant = BlockQuant::kQ8_0; break;
    case kGgmlQ4_0: info.quant = BlockQuant::kQ4_0; break;
    case kGgmlQ4_K: info.quant = BlockQuant::kQ4_K; break;
    case kGgmlQ6_K: info.quant = BlockQuant::kQ6_K; break;
    default: break;
  }
  info.element_size_bytes = tensor.type->block_elements == 1 ? tensor.type->block_bytes : 0;
  return info;
}

// Undoes the converter's per-head row interleave (HF row h·d + p·d/2 + i was stored at h·d + 2i + p),
// into an owned copy. Rows move whole, whatever their encoding.
Status unpermute_rows(TensorInfo* info, int64_t num_heads) {
  const int64_t rows = info->shape.size() == 2 ? info->shape[0] : 0;
  if (rows == 0 || rows % num_heads != 0 || (rows / num_heads) % 2 != 0) {
    return error(info->file, ": tensor '", info->name, "' has shape ", info->shape.empty() ? 0 : info->shape[0],
                 " rows, expected ", num_heads, " heads of an even head size");
  }
  const int64_t head_dim = rows / num_heads, half = head_dim / 2;
  const size_t row_bytes = info->size_bytes / size_t(rows);
  std::shared_ptr<uint8_t> copy(new (std::align_val_t(64)) uint8_t[info->size_bytes],
                                [](uint8_t* p) { ::operator delete[](p, std::align_val_t(64)); });
  for (int64_t h = 0; h < num_heads; ++h) {
    for (int64_t p = 0; p < 2; ++p) {
      for (int64_t i = 0; i < half; ++i) {
        const int64_t hf_row = h * head_dim + p * half + i, stored_row = h * head_dim + 2 * i + p;
        std::memcpy(copy.get() + size_t(hf_row) * row_bytes, info->data + size_t(stored_row) * row_bytes, row_bytes);
      }
    }
  }
  info->data = copy.get();
  info->owned_copy = std::move(copy);
  return Status::ok();
}

}  // namespace

Expected<ModelConfig> gguf_model_config(const GgufFile& file) {
  SLIMKV_ASSIGN_OR_RETURN(const GgufArchitecture* arch, find_architecture(file));
  const std::string prefix = str_cat(arch->name, ".");
  ModelConfig config;
  config.architecture = arch->architecture;
  config.architecture_name = std::string(arch->hf_name);
  config.attention_bias = arch->attention_bias;
  for (const IntKey& key : kIntKeys) {
    const std::string name = prefix + std::string(key.suffix);
    if (key.required || file.find(name)) {
      SLIMKV_ASSIGN_OR_RETURN(config.*key.field, positive(file, name));
    }
  }
  if (config.num_kv_heads == 0) config.num_kv_heads = config.num_heads;
  if (config.num_heads % config.num_kv_heads != 0) {
    return error(file.path(), ": metadata '", prefix, "attention.head_count_kv' is ", config.num_kv_heads,
                 ", which does not divide '", prefix, "attention.head_count' (", config.num_heads, ")");
  }
  if (config.head_dim == 0) {
    if (config.hidden_size % config.num_heads != 0) {
      return error(file.path(), ": metadata '", prefix, "embedding_length' (", config.hidden_size,
                   ") is not a multiple of the head count (", config.num_heads, ") and there is no '", prefix,
                   "attention.key_length'");
    }
    config.head_dim = config.hidden_size / config.num_heads;
  }
  if (file.find(prefix + "attention.value_length")) {
    SLIMKV_ASSIGN_OR_RETURN(const int64_t value_length, file.get_int(prefix + "attention.value_length"));
    if (value_length != config.head_dim) {
      return error(file.path(), ": metadata '", prefix, "attention.value_length' is ", value_length,
                   ", expected the key length ", config.head_dim);
    }
  }
  if (config.head_dim % 2 != 0) {
    return error(file.path(), ": the head size is ", config.head_dim, ", expected an even number (RoPE rotates pairs)");
  }
  config.attention_scale = 1.0 / std::sqrt(double(config.head_dim));  // all but Gemma's softmax scale
  SLIMKV_ASSIGN_OR_RETURN(config.rms_norm_eps, file.get_real(prefix + "attention.layer_norm_rms_epsilon"));
  if (!(config.rms_norm_eps > 0.0)) {
    return error(file.path(), ": metadata '", prefix, "attention.layer_norm_rms_epsilon' is ", config.rms_norm_eps,
                 ", expected > 0");
  }
  SLIMKV_RETURN_IF_ERROR(read_rope(file, std::string(arch->name), &config));
  config.qk_norm = arch->qk_norm;
  if (arch->read_features) SLIMKV_RETURN_IF_ERROR(arch->read_features(file, prefix, &config));

  const GgufTensor* embedding = find_tensor(file, "token_embd.weight");
  if (!embedding || embedding->shape.size() != 2) {
    return error(file.path(), ": tensor 'token_embd.weight' (the token embedding, 2-D) is missing");
  }
  config.vocab_size = embedding->shape[0];
  config.tie_word_embeddings = find_tensor(file, "output.weight") == nullptr;
  // The compute dtype of half-precision backends: BF16 files stay BF16, everything else computes in F16.
  config.dtype = embedding->type->id == kGgmlBF16 ? DType::kBF16 : embedding->type->id == kGgmlF32 ? DType::kF32 : DType::kF16;
  SLIMKV_ASSIGN_OR_RETURN(config.bos_token_id, token_id(file, "tokenizer.ggml.bos_token_id", config.vocab_size));
  SLIMKV_ASSIGN_OR_RETURN(const int64_t eos, token_id(file, "tokenizer.ggml.eos_token_id", config.vocab_size));
  if (eos >= 0) config.eos_token_ids.push_back(eos);
  SLIMKV_ASSIGN_OR_RETURN(const int64_t eot, token_id(file, "tokenizer.ggml.eot_token_id", config.vocab_size));
  if (eot >= 0 && eot != eos) config.eos_token_ids.push_back(eot);
  return config;
}

Expected<GgufModel> load_gguf_model(const std::string& path) {
  SLIMKV_ASSIGN_OR_RETURN(GgufFile opened, GgufFile::open(path));
  auto file = std::make_shared<const GgufFile>(std::move(opened));
  SLIMKV_ASSIGN_OR_RETURN(ModelConfig config, gguf_model_config(*file));
  SLIMKV_ASSIGN_OR_RETURN(const GgufArchitecture* arch, find_architecture(*file));
  std::vector<TensorInfo> tensors;
  for (const GgufTensor& tensor : file->tensors()) {
    std::string rest;
    const int layer = layer_of(tensor.name, &rest);
    const auto stacked = std::find_if(std::begin(kStackedExpertTensors), std::end(kStackedExpertTensors),
                                      [&](const TensorName& entry) { return rest == str_cat(entry.gguf, ".weight"); });
    if (layer >= 0 && stacked != std::end(kStackedExpertTensors)) {
      SLIMKV_RETURN_IF_ERROR(split_experts(tensor_info(tensor, tensor.name, path), layer, stacked->hf, &tensors));
      continue;
    }
    std::string name = hf_tensor_name(tensor.name, config.sandwich_norms);
    TensorInfo info = tensor_info(tensor, name.empty() ? tensor.name : std::move(name), path);
    const bool is_q = info.name.ends_with("self_attn.q_proj.weight"), is_k = info.name.ends_with("self_attn.k_proj.weight");
    if (arch->permute_qk && (is_q || is_k)) {
      SLIMKV_RETURN_IF_ERROR(unpermute_rows(&info, is_q ? config.num_heads : config.num_kv_heads));
    }
    if (arch->permute_qk && (info.name.ends_with("q_proj.bias") || info.name.ends_with("k_proj.bias"))) {
      return error(path, ": tensor '", tensor.name, "': Q/K biases of a '", arch->name, "' file are not supported");
    }
    tensors.push_back(std::move(info));
  }
  return GgufModel{std::move(config), WeightStore::from_tensors(path, std::move(tensors), file)};
}

}  // namespace slimkv
