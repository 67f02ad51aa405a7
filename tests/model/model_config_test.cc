// config.json parsing: both transformers layouts (4.x rope_scaling/torch_dtype, 5.x
// rope_parameters/dtype) give the same ModelConfig; every refusal names the field and its value.
#include "model/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace slimkv {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using Json = nlohmann::json;

constexpr const char* kSource = "models/x/config.json";

// A Llama 3 style config as transformers 5.x writes it.
Json llama_v5() {
  return Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "attention_bias": false, "mlp_bias": false, "hidden_act": "silu",
    "bos_token_id": 1, "eos_token_id": [2, 3], "dtype": "bfloat16",
    "head_dim": 32, "hidden_size": 128, "intermediate_size": 320,
    "max_position_embeddings": 512, "num_attention_heads": 4, "num_hidden_layers": 3,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-05, "tie_word_embeddings": false,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 64},
    "vocab_size": 512, "pad_token_id": null, "use_cache": true
  })");
}

// The same config as transformers 4.x writes it.
Json llama_v4() {
  Json config = llama_v5();
  config.erase("rope_parameters");
  config.erase("dtype");
  config["rope_theta"] = 500000.0;
  config["rope_scaling"] = {{"rope_type", "llama3"},
                            {"factor", 8.0},
                            {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 64}};
  config["torch_dtype"] = "bfloat16";
  return config;
}

Json qwen2_v5() {
  return Json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
    "bos_token_id": null, "eos_token_id": 0, "dtype": "float32", "hidden_size": 96,
    "intermediate_size": 256, "layer_types": ["full_attention", "full_attention"],
    "max_position_embeddings": 512, "max_window_layers": 28, "num_attention_heads": 6,
    "num_hidden_layers": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    "sliding_window": null, "tie_word_embeddings": true, "use_sliding_window": false,
    "vocab_size": 384
  })");
}

Json mistral_v5() {
  return Json::parse(R"({
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu",
    "bos_token_id": 1, "eos_token_id": 2, "dtype": "float16", "head_dim": 64, "hidden_size": 128,
    "intermediate_size": 288, "max_position_embeddings": 512, "num_attention_heads": 4,
    "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "sliding_window": null, "tie_word_embeddings": false, "vocab_size": 448
  })");
}

Expected<ModelConfig> parse(const Json& config) {
  return parse_model_config(config.dump(), kSource);
}

// Parses `config`, expects a refusal whose message holds the source and every substring.
void expect_refused(const Json& config, const std::vector<std::string>& substrings) {
  auto result = parse(config);
  ASSERT_FALSE(result.has_value()) << config.dump();
  EXPECT_THAT(result.status().message(), HasSubstr(kSource));
  for (const std::string& s : substrings) {
    EXPECT_THAT(result.status().message(), HasSubstr(s)) << config.dump();
  }
}

void expect_same(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(a.architecture_name, b.architecture_name);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.rope.type, b.rope.type);
  EXPECT_EQ(a.rope.theta, b.rope.theta);
  EXPECT_EQ(a.rope.factor, b.rope.factor);
  EXPECT_EQ(a.rope.low_freq_factor, b.rope.low_freq_factor);
  EXPECT_EQ(a.rope.high_freq_factor, b.rope.high_freq_factor);
  EXPECT_EQ(a.rope.original_max_position_embeddings, b.rope.original_max_position_embeddings);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
}

// --- accepted configs
// -----------------------------------------------------------------------------

TEST(ModelConfig, LlamaBothLayoutsAgree) {
  auto v5 = parse(llama_v5());
  ASSERT_TRUE(v5.has_value()) << v5.status().message();
  auto v4 = parse(llama_v4());
  ASSERT_TRUE(v4.has_value()) << v4.status().message();
  expect_same(*v5, *v4);

  const ModelConfig& c = *v5;
  EXPECT_EQ(c.architecture, Architecture::kLlama);
  EXPECT_EQ(c.architecture_name, "LlamaForCausalLM");
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.intermediate_size, 320);
  EXPECT_EQ(c.num_layers, 3);
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.q_dim(), 128);
  EXPECT_EQ(c.kv_dim(), 64);
  EXPECT_EQ(c.gqa_group_size(), 2);
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope.type, RopeType::kLlama3);
  EXPECT_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.factor, 8.0);
  EXPECT_EQ(c.rope.low_freq_factor, 1.0);
  EXPECT_EQ(c.rope.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 64);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.dtype, DType::kBF16);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(c.bos_token_id, 1);
}

TEST(ModelConfig, LegacyTypeKeyInRopeScaling) {
  Json config = llama_v4();
  config["rope_scaling"].erase("rope_type");
  config["rope_scaling"]["type"] = "llama3";
  auto legacy = parse(config);
  ASSERT_TRUE(legacy.has_value()) << legacy.status().message();
  EXPECT_EQ(legacy->rope.type, RopeType::kLlama3);
  expect_same(*legacy, *parse(llama_v5()));

  config["rope_scaling"] = {{"type", "default"}};
  auto plain = parse(config);
  ASSERT_TRUE(plain.has_value()) << plain.status().message();
  EXPECT_EQ(plain->rope.type, RopeType::kDefault);
  EXPECT_EQ(plain->rope.theta, 500000.0);
}

TEST(ModelConfig, Qwen2BothLayouts) {
  Json v4 = qwen2_v5();
  v4.erase("rope_parameters");
  v4.erase("dtype");
  v4.erase("layer_types");
  v4["rope_theta"] = 1000000.0;
  v4["rope_scaling"] = nullptr;
  v4["torch_dtype"] = "float32";
  auto a = parse(qwen2_v5());
  ASSERT_TRUE(a.has_value()) << a.status().message();
  auto b = parse(v4);
  ASSERT_TRUE(b.has_value()) << b.status().message();
  expect_same(*a, *b);
  EXPECT_EQ(a->architecture, Architecture::kQwen2);
  EXPECT_TRUE(a->attention_bias);
  EXPECT_TRUE(a->tie_word_embeddings);
  EXPECT_EQ(a->head_dim, 16);  // 96 / 6
  EXPECT_EQ(a->num_kv_heads, 1);
  EXPECT_EQ(a->rope.theta, 1e6);
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->eos_token_ids, (std::vector<int64_t>{0}));
  EXPECT_EQ(a->bos_token_id, -1);
}

TEST(ModelConfig, MistralExplicitHeadDim) {
  auto c = parse(mistral_v5());
  ASSERT_TRUE(c.has_value()) << c.status().message();
  EXPECT_EQ(c->architecture, Architecture::kMistral);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->q_dim(), 256);  // != hidden_size
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->dtype, DType::kF16);
}

TEST(ModelConfig, Defaults) {
  Json config = llama_v5();
  for (const char* key :
       {"rope_parameters", "dtype", "head_dim", "num_key_value_heads", "attention_bias", "mlp_bias",
        "hidden_act", "bos_token_id", "eos_token_id", "tie_word_embeddings", "rms_norm_eps",
        "max_position_embeddings"}) {
    config.erase(key);
  }
  auto c = parse(config);
  ASSERT_TRUE(c.has_value()) << c.status().message();
  EXPECT_EQ(c->rope.type, RopeType::kDefault);
  EXPECT_EQ(c->rope.theta, 10000.0);
  EXPECT_EQ(c->dtype, DType::kF32);
  EXPECT_EQ(c->head_dim, 32);  // 128 / 4
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_TRUE(c->eos_token_ids.empty());
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_EQ(c->max_position_embeddings, 2048);  // LlamaConfig's default

  // Null means "not given" too.
  config = llama_v5();
  config["head_dim"] = nullptr;
  config["num_key_value_heads"] = nullptr;
  config["dtype"] = nullptr;
  config["eos_token_id"] = nullptr;
  c = parse(config);
  ASSERT_TRUE(c.has_value()) << c.status().message();
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->dtype, DType::kF32);
  EXPECT_TRUE(c->eos_token_ids.empty());
}

// Absent num_key_value_heads means what transformers' config class says for each architecture.
TEST(ModelConfig, KvHeadDefaultsFollowTransformers) {
  Json mistral = mistral_v5();
  mistral["num_attention_heads"] = 16;
  mistral["head_dim"] = 8;
  mistral.erase("num_key_value_heads");
  EXPECT_EQ(parse(mistral)->num_kv_heads, 8);
  mistral["num_key_value_heads"] = nullptr;
  EXPECT_EQ(parse(mistral)->num_kv_heads, 16);

  Json qwen = qwen2_v5();
  qwen["num_attention_heads"] = 32;
  qwen["hidden_size"] = 256;
  qwen.erase("num_key_value_heads");
  EXPECT_EQ(parse(qwen)->num_kv_heads, 32);

  mistral = mistral_v5();  // 4 heads: the absent default of 8 cannot serve them
  mistral.erase("num_key_value_heads");
  expect_refused(mistral, {"num_key_value_heads", "8", "default", "MistralForCausalLM"});
}

TEST(ModelConfig, ArchitectureFromModelType) {
  Json config = qwen2_v5();
  config.erase("architectures");
  auto c = parse(config);
  ASSERT_TRUE(c.has_value()) << c.status().message();
  EXPECT_EQ(c->architecture, Architecture::kQwen2);
  EXPECT_EQ(c->architecture_name, "Qwen2ForCausalLM");
}

TEST(ModelConfig, DTypeSpellings) {
  Json config = llama_v5();
  config["dtype"] = "float16";
  EXPECT_EQ(parse(config)->dtype, DType::kF16);
  config["dtype"] = "torch.bfloat16";
  EXPECT_EQ(parse(config)->dtype, DType::kBF16);
  config["dtype"] = "float32";
  config["torch_dtype"] = "float16";  // 5.x's key wins when both are present
  EXPECT_EQ(parse(config)->dtype, DType::kF32);
}

TEST(ModelConfig, SlidingWindowsThatCoverTheContextAreFine) {
  Json mistral = mistral_v5();
  mistral["sliding_window"] = 512;  // == max_position_embeddings
  EXPECT_TRUE(parse(mistral).has_value());
  mistral["sliding_window"] = 4096;
  EXPECT_TRUE(parse(mistral).has_value());
  mistral.erase("sliding_window");  // transformers' default 4096 >= 512
  EXPECT_TRUE(parse(mistral).has_value());

  Json qwen = qwen2_v5();
  qwen["use_sliding_window"] = true;
  qwen["sliding_window"] = 64;
  qwen.erase("layer_types");  // max_window_layers 28 >= 2 layers: no layer slides
  EXPECT_TRUE(parse(qwen).has_value()) << parse(qwen).status().message();
  qwen["layer_types"] = {"full_attention", "full_attention"};
  EXPECT_TRUE(parse(qwen).has_value());
  qwen["use_sliding_window"] = false;
  qwen["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_TRUE(parse(qwen).has_value());
}

TEST(ModelConfig, LoadFromDirectory) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("slimkv_cfg_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << llama_v5().dump(2);
  auto c = load_model_config(dir.string());
  ASSERT_TRUE(c.has_value()) << c.status().message();
  EXPECT_EQ(c->num_layers, 3);
  std::filesystem::remove_all(dir);

  auto missing = load_model_config(dir.string());
  ASSERT_FALSE(missing.has_value());
  EXPECT_THAT(missing.status().message(), HasSubstr((dir / "config.json").string()));
}

// --- refusals
// ---------------------------------------------------------------------------------------

TEST(ModelConfig, RefusesBadJson) {
  auto r = parse_model_config("{\"hidden_size\": ", kSource);
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr(kSource), HasSubstr("not valid JSON")));
  r = parse_model_config("[1]", kSource);
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr(kSource), HasSubstr("array")));
  r = parse_model_config("", kSource);
  EXPECT_FALSE(r.has_value());
}

TEST(ModelConfig, RefusesArchitectures) {
  Json config = llama_v5();
  config["architectures"] = {"GPT2LMHeadModel"};
  expect_refused(config, {"architectures", "GPT2LMHeadModel", "LlamaForCausalLM",
                          "MistralForCausalLM", "Qwen2ForCausalLM"});
  config["architectures"] = Json::array();
  expect_refused(config, {"architectures", "[]"});
  config["architectures"] = "LlamaForCausalLM";
  expect_refused(config, {"architectures", "\"LlamaForCausalLM\""});
  config.erase("architectures");
  config["model_type"] = "gpt2";
  expect_refused(config, {"model_type", "gpt2"});
  config.erase("model_type");
  expect_refused(config, {"architectures"});
}

TEST(ModelConfig, RefusesUnsupportedLayers) {
  Json config = llama_v5();
  config["hidden_act"] = "gelu";
  expect_refused(config, {"hidden_act", "gelu", "silu"});
  config = llama_v5();
  config["mlp_bias"] = true;
  expect_refused(config, {"mlp_bias", "true"});
  config = llama_v5();
  config["quantization_config"] = {{"quant_method", "gptq"}};
  expect_refused(config, {"quantization_config"});
  config = llama_v5();
  config["attention_bias"] = "yes";
  expect_refused(config, {"attention_bias", "\"yes\"", "true or false"});
}

TEST(ModelConfig, RefusesRopeTypes) {
  for (const char* type : {"dynamic", "yarn", "longrope", "su", "mrope"}) {
    Json v5 = llama_v5();
    v5["rope_parameters"]["rope_type"] = type;
    expect_refused(v5, {"rope_parameters.rope_type", type, "default, linear, llama3"});
    Json v4 = llama_v4();
    v4["rope_scaling"] = {{"type", type}, {"factor", 2.0}};
    expect_refused(v4, {"rope_scaling.type", type});
  }
  Json config = llama_v5();
  config["rope_parameters"].erase("low_freq_factor");
  expect_refused(config, {"rope_parameters.low_freq_factor", "missing", "llama3"});
  config = llama_v4();
  config["rope_scaling"]["high_freq_factor"] = 0.5;
  expect_refused(config, {"rope_scaling.high_freq_factor", "0.5"});
  config = llama_v5();
  config["rope_parameters"]["factor"] = 0.5;
  expect_refused(config, {"rope_parameters.factor", "0.5"});
  config = llama_v5();
  config["rope_parameters"]["rope_theta"] = -1;
  expect_refused(config, {"rope_parameters.rope_theta", "-1"});
  config = llama_v4();
  config["rope_theta"] = "big";
  expect_refused(config, {"rope_theta", "big"});
  config = llama_v5();
  config["rope_parameters"] = "llama3";
  expect_refused(config, {"rope_parameters", "llama3"});
  config = llama_v5();
  config["partial_rotary_factor"] = 0.5;
  expect_refused(config, {"partial_rotary_factor", "0.5"});
}

// Gemma 3 as transformers 5.x writes it (rope_parameters per layer type), and its 4.x spelling
// (rope_theta, rope_scaling and rope_local_base_freq at the top level).
Json gemma3_v5() {
  return Json::parse(R"({
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "dtype": "bfloat16",
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640, "intermediate_size": 2048,
    "head_dim": 256, "num_attention_heads": 4, "num_key_value_heads": 1, "num_hidden_layers": 7,
    "max_position_embeddings": 32768, "query_pre_attn_scalar": 256, "sliding_window": 512,
    "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
                    "sliding_attention", "full_attention", "sliding_attention"],
    "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
    "final_logit_softcapping": null, "attn_logit_softcapping": null, "rms_norm_eps": 1e-06,
    "use_bidirectional_attention": false, "vocab_size": 262144, "eos_token_id": [1, 106], "bos_token_id": 2
  })");
}

Json gemma3_v4() {
  Json config = gemma3_v5();
  config.erase("rope_parameters");
  config.erase("dtype");
  config["rope_theta"] = 1000000.0;
  config["rope_local_base_freq"] = 10000.0;
  config["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  config["torch_dtype"] = "bfloat16";
  return config;
}

TEST(ModelConfig, Gemma3BothLayoutsAndItsFeatures) {
  auto v5 = parse(gemma3_v5());
  auto v4 = parse(gemma3_v4());
  ASSERT_TRUE(v5) << v5.status().message();
  ASSERT_TRUE(v4) << v4.status().message();
  expect_same(*v5, *v4);
  EXPECT_EQ(v5->architecture, Architecture::kGemma3);
  EXPECT_EQ(v5->sliding_layers, v4->sliding_layers);
  EXPECT_EQ(v5->sliding_layers, (std::vector<bool>{true, true, true, true, true, false, true}));
  EXPECT_EQ(v5->sliding_window, 512);
  EXPECT_EQ(v5->rope.type, RopeType::kLinear);
  EXPECT_EQ(v5->rope.factor, 8.0);
  EXPECT_EQ(v4->sliding_rope.type, RopeType::kDefault);
  EXPECT_EQ(v5->sliding_rope.theta, 10000.0);
  EXPECT_EQ(v4->sliding_rope.theta, 10000.0);
  EXPECT_EQ(v5->attention_scale, 1.0 / 16.0);
  EXPECT_TRUE(v5->tie_word_embeddings) << "Gemma ties by default";
  EXPECT_EQ(v5->features_beyond_llama(),
            "q/k norms, Gemma's norms, scaled embeddings, GeGLU, sliding-window layers");

  // Absent fields take transformers' defaults: every 6th layer global, head_dim 256, window 4096.
  Json bare = gemma3_v4();
  for (const char* key : {"layer_types", "head_dim", "sliding_window", "query_pre_attn_scalar", "rope_scaling",
                          "rope_local_base_freq", "rope_theta"}) {
    bare.erase(key);
  }
  auto defaults = parse(bare);
  ASSERT_TRUE(defaults) << defaults.status().message();
  EXPECT_EQ(defaults->sliding_layers, (std::vector<bool>{true, true, true, true, true, false, true}));
  EXPECT_EQ(defaults->head_dim, 256);
  EXPECT_EQ(defaults->sliding_window, 4096);
  EXPECT_EQ(defaults->rope.theta, 1000000.0);
  EXPECT_EQ(defaults->sliding_rope.theta, 10000.0);
  EXPECT_EQ(defaults->attention_scale, 1.0 / 16.0);

  Json capped = gemma3_v5();
  capped["final_logit_softcapping"] = 30.0;
  EXPECT_EQ(parse(capped)->final_logit_softcap, 30.0);
}

TEST(ModelConfig, RefusesWhatGemma3DoesNotRun) {
  Json config = gemma3_v5();
  config["hidden_activation"] = "gelu";
  expect_refused(config, {"hidden_activation", "gelu", "gelu_pytorch_tanh"});
  config = gemma3_v5();
  config["attn_logit_softcapping"] = 50.0;
  expect_refused(config, {"attn_logit_softcapping", "50", "null"});
  config = gemma3_v5();
  config["use_bidirectional_attention"] = true;
  expect_refused(config, {"use_bidirectional_attention", "causal"});
  config = gemma3_v5();
  config["layer_types"][2] = "chunked_attention";
  expect_refused(config, {"layer_types", "chunked_attention"});
  config = gemma3_v5();
  config["layer_types"].erase(0);
  expect_refused(config, {"layer_types", "7"});
  config = gemma3_v5();
  config["rope_parameters"]["sliding_attention"] = 10000;
  expect_refused(config, {"rope_parameters.sliding_attention", "10000"});
  config = gemma3_v5();
  config["rope_parameters"]["full_attention"]["rope_type"] = "yarn";
  expect_refused(config, {"rope_parameters.full_attention.rope_type", "yarn"});
  config = gemma3_v5();
  config["attention_bias"] = true;
  expect_refused(config, {"attention_bias", "Gemma3ForCausalLM"});
  config = gemma3_v5();
  config["query_pre_attn_scalar"] = 0;
  expect_refused(config, {"query_pre_attn_scalar", "0"});
}

Json qwen3_moe_v5() {
  return Json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_act": "silu",
    "dtype": "bfloat16", "hidden_size": 64, "intermediate_size": 160, "head_dim": 32,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4,
    "max_position_embeddings": 512, "moe_intermediate_size": 48, "num_local_experts": 8,
    "num_experts_per_tok": 2, "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [2],
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "sliding_window": null,
    "use_sliding_window": false, "vocab_size": 320
  })");
}

TEST(ModelConfig, Qwen3MoeExpertsAndTheirLayers) {
  auto v5 = parse(qwen3_moe_v5());
  ASSERT_TRUE(v5) << v5.status().message();
  Json v4_json = qwen3_moe_v5();
  v4_json.erase("num_local_experts");
  v4_json["num_experts"] = 8;  // the 4.x name
  auto v4 = parse(v4_json);
  ASSERT_TRUE(v4) << v4.status().message();
  expect_same(*v5, *v4);
  EXPECT_EQ(v4->moe.num_experts, 8);
  EXPECT_EQ(v5->moe.sparse_layers, (std::vector<bool>{true, true, false, true}));
  EXPECT_TRUE(v5->qk_norm);
  Json step = qwen3_moe_v5();
  step["decoder_sparse_step"] = 2;
  step["mlp_only_layers"] = Json::array();
  EXPECT_EQ(parse(step)->moe.sparse_layers, (std::vector<bool>{false, true, false, true}));

  Json config = qwen3_moe_v5();
  config["num_experts_per_tok"] = 9;
  expect_refused(config, {"num_experts_per_tok", "9", "num_local_experts (8)"});
  config = qwen3_moe_v5();
  config["mlp_only_layers"] = {4};
  expect_refused(config, {"mlp_only_layers", "4", "0 to 3"});
  config = qwen3_moe_v5();
  config["decoder_sparse_step"] = 0;
  expect_refused(config, {"decoder_sparse_step", "0"});
  config = qwen3_moe_v5();
  config["use_sliding_window"] = true;
  config["sliding_window"] = 64;
  config["max_window_layers"] = 0;
  expect_refused(config, {"use_sliding_window", "not implemented"});
}

TEST(ModelConfig, RefusesSlidingWindows) {
  Json mistral = mistral_v5();
  mistral["sliding_window"] = 128;
  expect_refused(mistral, {"sliding_window", "128", "512", "not implemented"});
  mistral.erase("sliding_window");
  mistral["max_position_embeddings"] = 32768;  // the absent default 4096 is now shorter
  expect_refused(mistral, {"sliding_window", "4096", "default"});
  mistral["sliding_window"] = -5;
  expect_refused(mistral, {"sliding_window", "-5"});

  Json qwen = qwen2_v5();
  qwen["use_sliding_window"] = true;
  qwen["sliding_window"] = 64;
  qwen["layer_types"] = {"full_attention", "sliding_attention"};
  expect_refused(qwen, {"use_sliding_window", "64", "not implemented"});
  qwen.erase("layer_types");
  qwen["max_window_layers"] = 0;
  expect_refused(qwen, {"use_sliding_window", "2 of 2 layers"});
  qwen["layer_types"] = {"full_attention"};
  expect_refused(qwen, {"layer_types"});
  qwen["layer_types"] = {"full_attention", "chunked_attention"};
  expect_refused(qwen, {"layer_types", "chunked_attention"});
}

TEST(ModelConfig, RefusesBadSizes) {
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads"}) {
    Json config = llama_v5();
    config[key] = 0;
    expect_refused(config, {key, "0", "positive integer"});
    config[key] = -3;
    expect_refused(config, {key, "-3"});
    config[key] = "128";
    expect_refused(config, {key, "\"128\""});
    config[key] = 128.5;
    expect_refused(config, {key, "128.5"});
    config[key] = 1e30;
    expect_refused(config, {key});
    config[key] = uint64_t(18446744073709551615ull);
    expect_refused(config, {key, "18446744073709551615"});
    config.erase(key);
    expect_refused(config, {key, "missing"});
  }
  Json config = llama_v5();
  config["num_key_value_heads"] = 3;
  expect_refused(config, {"num_key_value_heads", "3", "does not divide", "4"});
  config = llama_v5();
  config.erase("head_dim");
  config["hidden_size"] = 130;
  expect_refused(config, {"hidden_size", "130", "num_attention_heads", "4", "head_dim"});
  config = llama_v5();
  config["head_dim"] = 33;
  expect_refused(config, {"head_dim", "33", "even"});
  config = llama_v5();
  config["head_dim"] = 0;
  expect_refused(config, {"head_dim", "0"});
  config = llama_v5();
  config["rms_norm_eps"] = 0;
  expect_refused(config, {"rms_norm_eps", "0"});
  config = llama_v5();
  config["max_position_embeddings"] = -1;
  expect_refused(config, {"max_position_embeddings", "-1"});
}

TEST(ModelConfig, RefusesBadDTypesAndTokenIds) {
  Json config = llama_v5();
  config["dtype"] = "float64";
  expect_refused(config, {"dtype", "float64", "bfloat16"});
  config = llama_v4();
  config["torch_dtype"] = "int8";
  expect_refused(config, {"torch_dtype", "int8"});
  config = llama_v5();
  config["dtype"] = 16;
  expect_refused(config, {"dtype", "16"});
  config = llama_v5();
  config["eos_token_id"] = {2, "x"};
  expect_refused(config, {"eos_token_id[1]", "\"x\""});
  config["eos_token_id"] = -2;
  expect_refused(config, {"eos_token_id", "-2"});
  config = llama_v5();
  config["bos_token_id"] = 1.5;
  expect_refused(config, {"bos_token_id", "1.5"});
}

}  // namespace
}  // namespace slimkv
