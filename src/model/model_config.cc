#include "model/model_config.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <utility>

#include "util/half.h"
#include "util/mapped_file.h"
#include "util/json_error.h"

namespace slimkv {
namespace {

using Json = nlohmann::json;

// Sizes beyond this are a corrupt config, not a model (and keep every product of two in int64).
constexpr int64_t kMaxConfigSize = std::numeric_limits<int32_t>::max();

// ---------------------------------------------------------------------------------------------
// Architectures and their transformers defaults (configuration_{llama,mistral,qwen2,qwen3,qwen3_moe,
// gemma3}.py): used when
// config.json leaves a field out. save_pretrained writes every field, so these matter only for
// hand-written configs, and then we read them exactly as transformers would.
// ---------------------------------------------------------------------------------------------

struct ArchitectureDefaults {
  std::string_view name;        // "architectures"[0]
  std::string_view model_type;  // "model_type", the fallback when "architectures" is absent
  Architecture architecture;
  int64_t max_position_embeddings;
  // num_key_value_heads when the key is absent (null means num_attention_heads in all three);
  // 0 = num_attention_heads.
  int64_t num_kv_heads_when_absent;
  std::optional<int64_t> sliding_window_when_absent;  // Mistral: 4096
  std::optional<int64_t> head_dim_when_absent;        // Gemma 3: 256; otherwise hidden / heads
};

constexpr ArchitectureDefaults kArchitectures[] = {
    {"LlamaForCausalLM", "llama", Architecture::kLlama, 2048, 0, std::nullopt, std::nullopt},
    {"MistralForCausalLM", "mistral", Architecture::kMistral, 4096 * 32, 8, 4096, std::nullopt},
    {"Qwen2ForCausalLM", "qwen2", Architecture::kQwen2, 32768, 32, 4096, std::nullopt},
    {"Qwen3ForCausalLM", "qwen3", Architecture::kQwen3, 32768, 32, 4096, std::nullopt},
    {"Qwen3MoeForCausalLM", "qwen3_moe", Architecture::kQwen3Moe, 32768, 4, 4096, std::nullopt},
    {"Gemma3ForCausalLM", "gemma3_text", Architecture::kGemma3, 131072, 4, 4096, 256},
};

std::string supported_architecture_list() {
  std::string list;
  for (const ArchitectureDefaults& arch : kArchitectures) {
    list += (list.empty() ? "" : ", ") + std::string(arch.name);
  }
  return list;
}

// ---------------------------------------------------------------------------------------------
// Field readers: each error names the file, the field, and the value found.
// A field that is absent or null counts as "not given" (transformers treats both as its default).
// ---------------------------------------------------------------------------------------------

class FieldReader {
 public:
  FieldReader(const Json& object, std::string source, std::string prefix = "")
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  const Json* get(std::string_view key) const {
    const auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(std::string_view key) const { return get(key) != nullptr; }
  bool present_even_if_null(std::string_view key) const { return object_.contains(key); }

  // "DIR/config.json: field "rope_scaling.factor" ..."
  std::string where(std::string_view key) const {
    return str_cat(source_, ": field \"", prefix_, key, "\"");
  }
  Status wrong(std::string_view key, const Json& value, std::string_view expected) const {
    return error(where(key), " is ", value.dump(), ", expected ", expected);
  }

  Expected<int64_t> positive_int(std::string_view key, std::optional<int64_t> fallback) const {
    return int_at_least(key, fallback, 1);
  }

  Expected<int64_t> int_at_least(std::string_view key, std::optional<int64_t> fallback,
                                 int64_t minimum) const {
    const Json* value = get(key);
    if (!value) {
      if (fallback) return *fallback;
      return error(source_, ": missing required field \"", prefix_, key, "\"");
    }
    const bool is_int = value->is_number_integer();
    const bool fits =
        is_int && (value->is_number_unsigned() ? value->get<uint64_t>() <= uint64_t(kMaxConfigSize)
                                               : value->get<int64_t>() <= kMaxConfigSize);
    if (!is_int || !fits || value->get<int64_t>() < minimum) {
      return wrong(key, *value,
                   minimum == 1 ? str_cat("a positive integer (at most ", kMaxConfigSize, ")")
                                : str_cat("an integer from ", minimum, " to ", kMaxConfigSize));
    }
    return value->get<int64_t>();
  }

  Expected<int64_t> token_id(std::string_view key, const Json& value) const {
    if (!value.is_number_integer() || (!value.is_number_unsigned() && value.get<int64_t>() < 0) ||
        (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(kMaxConfigSize))) {
      return wrong(key, value, "a non-negative integer token id");
    }
    return value.get<int64_t>();
  }

  Expected<double> positive_number(std::string_view key, double fallback) const {
    const Json* value = get(key);
    if (!value) return fallback;
    if (!value->is_number() || !std::isfinite(value->get<double>()) || value->get<double>() <= 0) {
      return wrong(key, *value, "a positive number");
    }
    return value->get<double>();
  }

  Expected<bool> boolean(std::string_view key, bool fallback) const {
    const Json* value = get(key);
    if (!value) return fallback;
    if (!value->is_boolean()) return wrong(key, *value, "true or false");
    return value->get<bool>();
  }

  Expected<std::string> string(std::string_view key, std::string fallback) const {
    const Json* value = get(key);
    if (!value) return fallback;
    if (!value->is_string()) return wrong(key, *value, "a string");
    return value->get<std::string>();
  }

  const std::string& source() const { return source_; }

 private:
  const Json& object_;
  std::string source_;
  std::string prefix_;
};

// ---------------------------------------------------------------------------------------------
// The parts
// ---------------------------------------------------------------------------------------------

Expected<const ArchitectureDefaults*> parse_architecture(const FieldReader& fields,
                                                         std::string* name) {
  if (const Json* list = fields.get("architectures")) {
    if (!list->is_array() || list->empty() || !(*list)[0].is_string()) {
      return fields.wrong("architectures", *list,
                          "a list of architecture names, e.g. [\"LlamaForCausalLM\"]");
    }
    *name = (*list)[0].get<std::string>();
    for (const ArchitectureDefaults& arch : kArchitectures) {
      if (arch.name == *name) return &arch;
    }
    return error(fields.where("architectures"), " is \"", *name,
                 "\", which slimkv does not support (supported: ", supported_architecture_list(),
                 ")");
  }
  // No "architectures": fall back on "model_type", as transformers' AutoModelForCausalLM does.
  if (const Json* model_type = fields.get("model_type")) {
    if (model_type->is_string()) {
      for (const ArchitectureDefaults& arch : kArchitectures) {
        if (arch.model_type == model_type->get<std::string>()) {
          *name = std::string(arch.name);
          return &arch;
        }
      }
    }
    return error(fields.where("model_type"), " is ", model_type->dump(),
                 " and there is no \"architectures\"; supported: ", supported_architecture_list());
  }
  return error(fields.source(),
               ": missing field \"architectures\" (and \"model_type\"); expected "
               "one of ",
               supported_architecture_list());
}

Expected<DType> parse_dtype(const FieldReader& fields) {
  // transformers 5.x writes "dtype", 4.x "torch_dtype"; absent means the float32 default.
  const std::string_view key = fields.has("dtype") ? "dtype" : "torch_dtype";
  const Json* value = fields.get(key);
  if (!value) return DType::kF32;
  if (value->is_string()) {
    std::string_view name = value->get_ref<const std::string&>();
    if (name.starts_with("torch.")) name.remove_prefix(6);
    if (name == "float32") return DType::kF32;
    if (name == "float16") return DType::kF16;
    if (name == "bfloat16") return DType::kBF16;
  }
  return fields.wrong(key, *value, "\"float32\", \"float16\" or \"bfloat16\"");
}

// One RoPE parameter object: `rope_fields` (5.x's rope_parameters or an entry of it per layer type, 4.x's
// rope_scaling, or empty), its theta inside or else `fallback_theta`'s top-level key.
Expected<RopeConfig> parse_rope_object(const FieldReader& fields, const FieldReader& rope_fields,
                                       const std::string& rope_key, std::string_view fallback_theta,
                                       double default_theta) {
  RopeConfig rope;
  if (rope_fields.has("rope_theta")) {
    SLIMKV_ASSIGN_OR_RETURN(rope.theta, rope_fields.positive_number("rope_theta", default_theta));
  } else {
    SLIMKV_ASSIGN_OR_RETURN(rope.theta, fields.positive_number(fallback_theta, default_theta));
  }
  // partial rotary (rotating only part of each head) is not the Llama family's RoPE.
  for (const FieldReader* where : {&fields, &rope_fields}) {
    SLIMKV_ASSIGN_OR_RETURN(const double partial,
                            where->positive_number("partial_rotary_factor", 1.0));
    if (partial != 1.0) {
      return error(where->where("partial_rotary_factor"), " is ", partial,
                   ": partial rotary embeddings are not supported (only 1.0)");
    }
  }

  const std::string_view type_key = rope_fields.has("rope_type") ? "rope_type" : "type";
  SLIMKV_ASSIGN_OR_RETURN(const std::string type, rope_fields.string(type_key, "default"));
  if (type == "default") return rope;
  if (type != "llama3" && type != "linear") {
    return error(rope_fields.where(type_key), " is \"", type,
                 "\", which slimkv does not support (supported: default, linear, llama3)");
  }
  rope.type = type == "linear" ? RopeType::kLinear : RopeType::kLlama3;
  const std::vector<std::string_view> needed =
      rope.type == RopeType::kLinear
          ? std::vector<std::string_view>{"factor"}
          : std::vector<std::string_view>{"factor", "low_freq_factor", "high_freq_factor",
                                          "original_max_position_embeddings"};
  for (std::string_view key : needed) {
    if (!rope_fields.has(key)) {
      return error(fields.source(), ": rope_type \"", type, "\" needs field \"", rope_key, ".", key,
                   "\", which is missing");
    }
  }
  SLIMKV_ASSIGN_OR_RETURN(rope.factor, rope_fields.positive_number("factor", 1.0));
  if (rope.factor < 1.0) {
    return error(rope_fields.where("factor"), " is ", rope.factor, ", expected at least 1");
  }
  if (rope.type == RopeType::kLinear) return rope;
  SLIMKV_ASSIGN_OR_RETURN(rope.low_freq_factor,
                          rope_fields.positive_number("low_freq_factor", 1.0));
  SLIMKV_ASSIGN_OR_RETURN(rope.high_freq_factor,
                          rope_fields.positive_number("high_freq_factor", 4.0));
  SLIMKV_ASSIGN_OR_RETURN(
      rope.original_max_position_embeddings,
      rope_fields.positive_int("original_max_position_embeddings", std::nullopt));
  if (rope.high_freq_factor <= rope.low_freq_factor) {
    return error(rope_fields.where("high_freq_factor"), " is ", rope.high_freq_factor,
                 ", expected more than low_freq_factor (", rope.low_freq_factor, ")");
  }
  return rope;
}

// rope_parameters (5.x) or rope_scaling (4.x, with the top-level rope_theta). 5.x nests the parameters
// per layer type ({"full_attention": {...}, "sliding_attention": {...}}) where layers differ (Gemma 3);
// 4.x has the sliding layers' theta at the top level as rope_local_base_freq (their scaling: none).
// Sets config->rope and config->sliding_rope.
Status parse_rope(const FieldReader& fields, ModelConfig* config) {
  std::string rope_key;
  const Json* params = nullptr;
  if ((params = fields.get("rope_parameters"))) {
    rope_key = "rope_parameters";
  } else if ((params = fields.get("rope_scaling"))) {
    rope_key = "rope_scaling";
  }
  if (params && !params->is_object()) {
    return fields.wrong(rope_key, *params, "an object such as {\"rope_type\": \"default\", ...}");
  }
  const Json empty = Json::object();
  const bool per_layer_type = params && !params->contains("rope_type") && !params->contains("type") &&
                              (params->contains("full_attention") || params->contains("sliding_attention"));
  const auto entry = [&](const char* layer_type) -> Expected<FieldReader> {
    if (!per_layer_type) return FieldReader(params ? *params : empty, fields.source(), params ? rope_key + "." : "");
    const auto it = params->find(layer_type);
    if (it == params->end()) return FieldReader(empty, fields.source(), "");
    const std::string key = rope_key + "." + layer_type;
    if (!it->is_object()) return fields.wrong(key, *it, "an object such as {\"rope_type\": \"default\", ...}");
    return FieldReader(*it, fields.source(), key + ".");
  };
  const std::string full_key = per_layer_type ? rope_key + ".full_attention" : rope_key;
  SLIMKV_ASSIGN_OR_RETURN(const FieldReader full, entry("full_attention"));
  const double default_theta = config->architecture == Architecture::kGemma3 ? 1000000.0 : 10000.0;
  SLIMKV_ASSIGN_OR_RETURN(config->rope, parse_rope_object(fields, full, full_key, "rope_theta", default_theta));
  if (config->sliding_layers.empty()) return Status::ok();
  if (per_layer_type) {
    SLIMKV_ASSIGN_OR_RETURN(const FieldReader sliding, entry("sliding_attention"));
    SLIMKV_ASSIGN_OR_RETURN(config->sliding_rope, parse_rope_object(fields, sliding, rope_key + ".sliding_attention",
                                                                    "rope_local_base_freq", 10000.0));
  } else {
    SLIMKV_ASSIGN_OR_RETURN(config->sliding_rope.theta, fields.positive_number("rope_local_base_freq", 10000.0));
  }
  return Status::ok();
}

Status parse_token_ids(const FieldReader& fields, ModelConfig* config) {
  if (const Json* eos = fields.get("eos_token_id")) {
    if (eos->is_array()) {
      for (size_t i = 0; i < eos->size(); ++i) {
        SLIMKV_ASSIGN_OR_RETURN(const int64_t id,
                                fields.token_id(str_cat("eos_token_id[", i, "]"), (*eos)[i]));
        config->eos_token_ids.push_back(id);
      }
    } else {
      SLIMKV_ASSIGN_OR_RETURN(const int64_t id, fields.token_id("eos_token_id", *eos));
      config->eos_token_ids.push_back(id);
    }
  }
  if (const Json* bos = fields.get("bos_token_id")) {
    SLIMKV_ASSIGN_OR_RETURN(config->bos_token_id, fields.token_id("bos_token_id", *bos));
  }
  return Status::ok();
}

// We implement full causal attention only; refuse any configuration that makes some layer slide
// over a window shorter than the context (it would silently change the outputs).
Status check_no_sliding_window(const FieldReader& fields, const ArchitectureDefaults& arch,
                               const ModelConfig& config) {
  if (arch.architecture == Architecture::kLlama || arch.architecture == Architecture::kGemma3) return Status::ok();
  std::optional<int64_t> window;
  if (fields.has("sliding_window")) {
    SLIMKV_ASSIGN_OR_RETURN(window, fields.positive_int("sliding_window", std::nullopt));
  } else if (!fields.present_even_if_null("sliding_window")) {
    window = arch.sliding_window_when_absent;
  }
  const bool window_matters = window && *window < config.max_position_embeddings;

  if (arch.architecture == Architecture::kMistral) {
    if (!window_matters) return Status::ok();
    return error(fields.where("sliding_window"), " is ", *window,
                 fields.present_even_if_null("sliding_window") ? "" : " (the default when absent)",
                 ", shorter than max_position_embeddings (", config.max_position_embeddings,
                 "): sliding-window attention is not implemented; set \"sliding_window\": null "
                 "if the model attends over its whole context");
  }

  // Qwen2/3: layers slide only when use_sliding_window is true, and then only the "sliding_attention"
  // entries of layer_types (derived from max_window_layers when absent).
  SLIMKV_ASSIGN_OR_RETURN(const bool use_sliding_window,
                          fields.boolean("use_sliding_window", false));
  int64_t sliding_layers = 0;
  if (const Json* layer_types = fields.get("layer_types")) {
    if (!layer_types->is_array() || int64_t(layer_types->size()) != config.num_layers) {
      return fields.wrong("layer_types", *layer_types,
                          str_cat("a list of num_hidden_layers (", config.num_layers,
                                  ") entries \"full_attention\" or \"sliding_attention\""));
    }
    for (const Json& type : *layer_types) {
      if (type == "sliding_attention") {
        ++sliding_layers;
      } else if (type != "full_attention") {
        return error(fields.where("layer_types"), " has entry ", type.dump(),
                     ", expected \"full_attention\" or \"sliding_attention\"");
      }
    }
  } else {
    SLIMKV_ASSIGN_OR_RETURN(const int64_t max_window_layers,
                            fields.int_at_least("max_window_layers", 28, 0));
    sliding_layers = std::max<int64_t>(0, config.num_layers - max_window_layers);
  }
  if (use_sliding_window && window_matters && sliding_layers > 0) {
    return error(fields.where("use_sliding_window"), " is true (sliding_window ", *window, " on ",
                 sliding_layers, " of ", config.num_layers,
                 " layers): sliding-window attention is not implemented; set "
                 "\"use_sliding_window\": false if the model attends over its whole context");
  }
  return Status::ok();
}

// Gemma 3's layer pattern: "layer_types", else every sliding_window_pattern-th layer global (5.x saves the
// pattern as "_sliding_window_pattern"); the window, the attention scale and the soft caps.
Status parse_gemma3(const FieldReader& fields, ModelConfig* config) {
  if (const Json* layer_types = fields.get("layer_types")) {
    if (!layer_types->is_array() || int64_t(layer_types->size()) != config->num_layers) {
      return fields.wrong("layer_types", *layer_types,
                          str_cat("a list of num_hidden_layers (", config->num_layers,
                                  ") entries \"full_attention\" or \"sliding_attention\""));
    }
    for (const Json& type : *layer_types) {
      if (type != "full_attention" && type != "sliding_attention") {
        return error(fields.where("layer_types"), " has entry ", type.dump(),
                     ", expected \"full_attention\" or \"sliding_attention\"");
      }
      config->sliding_layers.push_back(type == "sliding_attention");
    }
  } else {
    const std::string_view key = fields.has("sliding_window_pattern") ? "sliding_window_pattern" : "_sliding_window_pattern";
    SLIMKV_ASSIGN_OR_RETURN(const int64_t pattern, fields.positive_int(key, 6));
    for (int64_t i = 0; i < config->num_layers; ++i) config->sliding_layers.push_back((i + 1) % pattern != 0);
  }
  SLIMKV_ASSIGN_OR_RETURN(config->sliding_window, fields.positive_int("sliding_window", 4096));
  SLIMKV_ASSIGN_OR_RETURN(const double query_scalar, fields.positive_number("query_pre_attn_scalar", 256.0));
  config->attention_scale = 1.0 / std::sqrt(query_scalar);
  SLIMKV_ASSIGN_OR_RETURN(config->final_logit_softcap, fields.positive_number("final_logit_softcapping", 0.0));
  if (fields.has("attn_logit_softcapping")) {
    return error(fields.where("attn_logit_softcapping"), " is ", fields.get("attn_logit_softcapping")->dump(),
                 ": attention logit soft-capping (Gemma 2) is not supported; expected null");
  }
  SLIMKV_ASSIGN_OR_RETURN(const bool bidirectional, fields.boolean("use_bidirectional_attention", false));
  if (bidirectional) {
    return error(fields.where("use_bidirectional_attention"),
                 " is true: only causal attention is supported (a decoder generates left to right)");
  }
  config->qk_norm = config->norm_adds_one = config->sandwich_norms = config->scale_embeddings = true;
  config->activation = Activation::kGeluTanh;
  return Status::ok();
}

// Qwen3-MoE's experts: how many, how many per token, their size, and which layers route
// (those (i + 1) % decoder_sparse_step == 0 and not in mlp_only_layers; the rest have a dense MLP).
Status parse_moe(const FieldReader& fields, ModelConfig* config) {
  MoeConfig& moe = config->moe;
  // 4.x writes "num_experts", 5.x "num_local_experts".
  const std::string_view experts_key = fields.has("num_local_experts") ? "num_local_experts" : "num_experts";
  SLIMKV_ASSIGN_OR_RETURN(moe.num_experts, fields.positive_int(experts_key, 128));
  SLIMKV_ASSIGN_OR_RETURN(moe.experts_per_token, fields.positive_int("num_experts_per_tok", 8));
  if (moe.experts_per_token > moe.num_experts) {
    return error(fields.where("num_experts_per_tok"), " is ", moe.experts_per_token, ", more than ", experts_key,
                 " (", moe.num_experts, ")");
  }
  SLIMKV_ASSIGN_OR_RETURN(moe.expert_intermediate_size, fields.positive_int("moe_intermediate_size", 768));
  SLIMKV_ASSIGN_OR_RETURN(moe.normalize_top_k, fields.boolean("norm_topk_prob", false));
  SLIMKV_ASSIGN_OR_RETURN(const int64_t step, fields.positive_int("decoder_sparse_step", 1));
  moe.sparse_layers.assign(size_t(config->num_layers), false);
  for (int64_t i = 0; i < config->num_layers; ++i) moe.sparse_layers[size_t(i)] = (i + 1) % step == 0;
  if (const Json* dense = fields.get("mlp_only_layers")) {
    if (!dense->is_array()) return fields.wrong("mlp_only_layers", *dense, "a list of layer indices");
    for (const Json& layer : *dense) {
      if (!layer.is_number_integer() || layer.get<int64_t>() < 0 || layer.get<int64_t>() >= config->num_layers) {
        return error(fields.where("mlp_only_layers"), " has entry ", layer.dump(), ", expected a layer index from 0 to ",
                     config->num_layers - 1);
      }
      moe.sparse_layers[size_t(layer.get<int64_t>())] = false;
    }
  }
  return Status::ok();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// parse_model_config
// ---------------------------------------------------------------------------------------------

Expected<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source) {
  Json json;
  try {
    json = Json::parse(json_text);
  } catch (const Json::parse_error& e) {
    return Status::error(json_syntax_error(source, json_text, e.byte, e.what()));
  } catch (const Json::exception& e) {
    return error(source, ": not valid JSON: ", e.what());
  } catch (const std::bad_alloc&) {
    return error(source, ": too large to parse");
  }
  if (!json.is_object()) {
    return error(source, ": is a JSON ", json.type_name(), ", expected an object (a config.json)");
  }
  const FieldReader fields(json, source);
  ModelConfig config;

  SLIMKV_ASSIGN_OR_RETURN(const ArchitectureDefaults* arch,
                          parse_architecture(fields, &config.architecture_name));
  config.architecture = arch->architecture;

  if (fields.has("quantization_config")) {
    return error(fields.where("quantization_config"),
                 " is present: quantized checkpoints are not supported; use an unquantized "
                 "(F32/F16/BF16) checkpoint");
  }

  // Sizes.
  SLIMKV_ASSIGN_OR_RETURN(config.vocab_size, fields.positive_int("vocab_size", std::nullopt));
  SLIMKV_ASSIGN_OR_RETURN(config.hidden_size, fields.positive_int("hidden_size", std::nullopt));
  SLIMKV_ASSIGN_OR_RETURN(config.intermediate_size,
                          fields.positive_int("intermediate_size", std::nullopt));
  SLIMKV_ASSIGN_OR_RETURN(config.num_layers,
                          fields.positive_int("num_hidden_layers", std::nullopt));
  SLIMKV_ASSIGN_OR_RETURN(config.num_heads,
                          fields.positive_int("num_attention_heads", std::nullopt));
  const std::optional<int64_t> kv_heads_fallback =
      fields.present_even_if_null("num_key_value_heads") || arch->num_kv_heads_when_absent == 0
          ? config.num_heads
          : arch->num_kv_heads_when_absent;
  SLIMKV_ASSIGN_OR_RETURN(config.num_kv_heads,
                          fields.positive_int("num_key_value_heads", kv_heads_fallback));
  if (config.num_heads % config.num_kv_heads != 0) {
    const bool absent = !fields.present_even_if_null("num_key_value_heads");
    return error(fields.where("num_key_value_heads"), " is ", config.num_kv_heads,
                 absent ? str_cat(" (transformers' default for ", arch->name, " when absent)") : "",
                 ", which does not divide num_attention_heads (", config.num_heads,
                 "): each KV head must serve a whole group of query heads");
  }
  if (fields.has("head_dim") || arch->head_dim_when_absent) {
    SLIMKV_ASSIGN_OR_RETURN(config.head_dim, fields.positive_int("head_dim", arch->head_dim_when_absent));
  } else {
    if (config.hidden_size % config.num_heads != 0) {
      return error(source, ": hidden_size (", config.hidden_size,
                   ") is not a multiple of num_attention_heads (", config.num_heads,
                   ") and there is no \"head_dim\" to say the head size");
    }
    config.head_dim = config.hidden_size / config.num_heads;
  }
  if (config.head_dim % 2 != 0) {
    return error(source, ": head_dim is ", config.head_dim,
                 ", expected an even number (RoPE rotates pairs of dimensions)");
  }
  SLIMKV_ASSIGN_OR_RETURN(
      config.max_position_embeddings,
      fields.positive_int("max_position_embeddings", arch->max_position_embeddings));
  SLIMKV_ASSIGN_OR_RETURN(config.rms_norm_eps, fields.positive_number("rms_norm_eps", 1e-6));

  // Layer structure. Gemma names its activation "hidden_activation" (GeGLU with the tanh GELU).
  const bool gemma = config.architecture == Architecture::kGemma3;
  const std::string_view act_key = gemma && fields.has("hidden_activation") ? "hidden_activation" : "hidden_act";
  const std::string_view expected_act = gemma ? "gelu_pytorch_tanh" : "silu";
  SLIMKV_ASSIGN_OR_RETURN(const std::string hidden_act, fields.string(act_key, std::string(expected_act)));
  if (hidden_act != expected_act) {
    return error(fields.where(act_key), " is \"", hidden_act, "\", but slimkv implements only \"", expected_act,
                 "\" for ", arch->name, gemma ? " (GeGLU)" : " (SwiGLU)");
  }
  SLIMKV_ASSIGN_OR_RETURN(config.tie_word_embeddings, fields.boolean("tie_word_embeddings", gemma));
  switch (config.architecture) {
    case Architecture::kLlama: {
      SLIMKV_ASSIGN_OR_RETURN(config.attention_bias, fields.boolean("attention_bias", false));
      SLIMKV_ASSIGN_OR_RETURN(const bool mlp_bias, fields.boolean("mlp_bias", false));
      if (mlp_bias) {
        return error(fields.where("mlp_bias"), " is true: MLP biases are not supported");
      }
      break;
    }
    case Architecture::kMistral:
      config.attention_bias =
          false;  // transformers' Mistral has no biases whatever the config says
      break;
    case Architecture::kQwen2:
      config.attention_bias = true;  // Qwen2's q/k/v projections always have biases
      break;
    case Architecture::kQwen3:
    case Architecture::kQwen3Moe:
    case Architecture::kGemma3: {
      // Their attention_bias would put a bias on o_proj too, which no released checkpoint has.
      SLIMKV_ASSIGN_OR_RETURN(const bool bias, fields.boolean("attention_bias", false));
      if (bias) {
        return error(fields.where("attention_bias"), " is true: ", arch->name,
                     " with attention biases is not supported");
      }
      config.qk_norm = true;
      break;
    }
  }
  config.attention_scale = 1.0 / std::sqrt(double(config.head_dim));
  if (gemma) SLIMKV_RETURN_IF_ERROR(parse_gemma3(fields, &config));
  if (config.architecture == Architecture::kQwen3Moe) SLIMKV_RETURN_IF_ERROR(parse_moe(fields, &config));
  SLIMKV_RETURN_IF_ERROR(check_no_sliding_window(fields, *arch, config));

  SLIMKV_RETURN_IF_ERROR(parse_rope(fields, &config));
  SLIMKV_ASSIGN_OR_RETURN(config.dtype, parse_dtype(fields));
  SLIMKV_RETURN_IF_ERROR(parse_token_ids(fields, &config));
  return config;
}

float ModelConfig::embedding_scale() const {
  const float scale = std::sqrt(float(hidden_size));
  if (!scale_embeddings) return 1.0f;
  if (!embedding_scale_in_dtype) return scale;
  if (dtype == DType::kBF16) return bf16_to_float(float_to_bf16(scale));
  if (dtype == DType::kF16) return fp16_to_float(float_to_fp16(scale));
  return scale;
}

std::string ModelConfig::features_beyond_llama() const {
  std::string list;
  const auto add = [&](bool used, std::string_view name) {
    if (used) list += str_cat(list.empty() ? "" : ", ", name);
  };
  add(qk_norm, "q/k norms");
  add(norm_adds_one || sandwich_norms, "Gemma's norms");
  add(scale_embeddings, "scaled embeddings");
  add(activation != Activation::kSilu, "GeGLU");
  add(std::abs(attention_scale * std::sqrt(double(head_dim)) - 1.0) > 1e-12, "query_pre_attn_scalar");
  add(final_logit_softcap > 0, "logit soft-capping");
  add(!sliding_layers.empty(), "sliding-window layers");
  add(moe.num_experts > 0, "experts");
  return list;
}

Expected<ModelConfig> load_model_config(const std::string& model_dir) {
  const std::string path = model_dir.empty() || model_dir.back() == '/'
                               ? model_dir + "config.json"
                               : model_dir + "/config.json";
  SLIMKV_ASSIGN_OR_RETURN(const std::string text, read_text_file(path));
  return parse_model_config(text, path);
}

}  // namespace slimkv
