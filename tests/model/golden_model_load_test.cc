// The golden model directories made by HF transformers (scripts/golden/make_golden.py): both config
// layouts give the same ModelConfig (Gemma 3's per-layer-type RoPE and Qwen3-MoE's num_local_experts
// included), and every weight of the family is there with the shape the config implies, in the dtype it
// declares, single-file and sharded alike.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/weight_store.h"
#include "util/mapped_file.h"
#include "source_dir.h"

namespace slimkv {
namespace {

struct GoldenModel {
  const char* name;
  Architecture architecture;
  DType dtype;
  bool sharded;
  bool tied;
};

std::string model_dir(const GoldenModel& model) {
  return slimkv::test::source_dir() + "/tests/data/models/" + model.name;
}

class GoldenModelLoad : public ::testing::TestWithParam<GoldenModel> {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(model_dir(GetParam()) + "/config.json")) {
      GTEST_SKIP() << "no golden model at " << model_dir(GetParam());
    }
  }
};

TEST_P(GoldenModelLoad, ConfigLayoutsAgree) {
  const GoldenModel& model = GetParam();
  auto v5 = load_model_config(model_dir(model));
  ASSERT_TRUE(v5.has_value()) << v5.status().message();
  const std::string v4_path = model_dir(model) + "/config.v4.json";
  auto v4_text = read_text_file(v4_path);
  ASSERT_TRUE(v4_text.has_value()) << v4_text.status().message();
  auto v4 = parse_model_config(*v4_text, v4_path);
  ASSERT_TRUE(v4.has_value()) << v4.status().message();

  EXPECT_EQ(v5->architecture, model.architecture);
  EXPECT_EQ(v5->dtype, model.dtype);
  EXPECT_EQ(v5->tie_word_embeddings, model.tied);
  EXPECT_EQ(v5->attention_bias, model.architecture == Architecture::kQwen2);

  EXPECT_EQ(v5->architecture, v4->architecture);
  EXPECT_EQ(v5->architecture_name, v4->architecture_name);
  EXPECT_EQ(v5->vocab_size, v4->vocab_size);
  EXPECT_EQ(v5->hidden_size, v4->hidden_size);
  EXPECT_EQ(v5->intermediate_size, v4->intermediate_size);
  EXPECT_EQ(v5->num_layers, v4->num_layers);
  EXPECT_EQ(v5->num_heads, v4->num_heads);
  EXPECT_EQ(v5->num_kv_heads, v4->num_kv_heads);
  EXPECT_EQ(v5->head_dim, v4->head_dim);
  EXPECT_EQ(v5->max_position_embeddings, v4->max_position_embeddings);
  EXPECT_EQ(v5->rms_norm_eps, v4->rms_norm_eps);
  EXPECT_EQ(v5->rope.type, v4->rope.type);
  EXPECT_EQ(v5->rope.theta, v4->rope.theta);
  EXPECT_EQ(v5->rope.factor, v4->rope.factor);
  EXPECT_EQ(v5->rope.low_freq_factor, v4->rope.low_freq_factor);
  EXPECT_EQ(v5->rope.high_freq_factor, v4->rope.high_freq_factor);
  EXPECT_EQ(v5->rope.original_max_position_embeddings, v4->rope.original_max_position_embeddings);
  EXPECT_EQ(v5->tie_word_embeddings, v4->tie_word_embeddings);
  EXPECT_EQ(v5->attention_bias, v4->attention_bias);
  EXPECT_EQ(v5->dtype, v4->dtype);
  EXPECT_EQ(v5->eos_token_ids, v4->eos_token_ids);
  EXPECT_EQ(v5->bos_token_id, v4->bos_token_id);
  EXPECT_EQ(v5->qk_norm, v4->qk_norm);
  EXPECT_EQ(v5->norm_adds_one, v4->norm_adds_one);
  EXPECT_EQ(v5->sandwich_norms, v4->sandwich_norms);
  EXPECT_EQ(v5->scale_embeddings, v4->scale_embeddings);
  EXPECT_EQ(v5->activation, v4->activation);
  EXPECT_EQ(v5->attention_scale, v4->attention_scale);
  EXPECT_EQ(v5->final_logit_softcap, v4->final_logit_softcap);
  EXPECT_EQ(v5->sliding_layers, v4->sliding_layers);
  EXPECT_EQ(v5->sliding_window, v4->sliding_window);
  EXPECT_EQ(v5->sliding_rope.type, v4->sliding_rope.type);
  EXPECT_EQ(v5->sliding_rope.theta, v4->sliding_rope.theta);
  EXPECT_EQ(v5->sliding_rope.factor, v4->sliding_rope.factor);
  EXPECT_EQ(v5->moe.num_experts, v4->moe.num_experts);
  EXPECT_EQ(v5->moe.experts_per_token, v4->moe.experts_per_token);
  EXPECT_EQ(v5->moe.expert_intermediate_size, v4->moe.expert_intermediate_size);
  EXPECT_EQ(v5->moe.normalize_top_k, v4->moe.normalize_top_k);
  EXPECT_EQ(v5->moe.sparse_layers, v4->moe.sparse_layers);
}

// What each family's config says, read as transformers reads it (the values make_golden.py gave).
TEST(GoldenModelFamilies, ConfigsSayWhatTheGoldenScriptMade) {
  const std::string dir = slimkv::test::source_dir() + "/tests/data/models/";
  auto qwen3 = load_model_config(dir + "qwen3_bf16_tied");
  ASSERT_TRUE(qwen3) << qwen3.status().message();
  EXPECT_TRUE(qwen3->qk_norm);
  EXPECT_EQ(qwen3->head_dim, 48);
  EXPECT_EQ(qwen3->q_dim(), 192);  // != hidden_size 96
  EXPECT_EQ(qwen3->features_beyond_llama(), "q/k norms");

  auto moe = load_model_config(dir + "qwen3_moe");
  ASSERT_TRUE(moe) << moe.status().message();
  EXPECT_EQ(moe->moe.num_experts, 8);
  EXPECT_EQ(moe->moe.experts_per_token, 2);
  EXPECT_EQ(moe->moe.expert_intermediate_size, 48);
  EXPECT_TRUE(moe->moe.normalize_top_k);
  EXPECT_EQ(moe->moe.sparse_layers, (std::vector<bool>{true, true, false, true}));  // mlp_only_layers [2]
  auto step2 = load_model_config(dir + "qwen3_moe_step2");
  ASSERT_TRUE(step2) << step2.status().message();
  EXPECT_EQ(step2->moe.sparse_layers, (std::vector<bool>{false, true, false, true}));  // decoder_sparse_step 2
  EXPECT_FALSE(step2->moe.normalize_top_k);

  auto gemma = load_model_config(dir + "gemma3_sliding");
  ASSERT_TRUE(gemma) << gemma.status().message();
  EXPECT_EQ(gemma->sliding_layers, (std::vector<bool>{true, true, false, true, false}));
  EXPECT_EQ(gemma->sliding_window, 40);
  EXPECT_EQ(gemma->rope.type, RopeType::kLinear);
  EXPECT_EQ(gemma->rope.factor, 8.0);
  EXPECT_EQ(gemma->rope.theta, 1000000.0);
  EXPECT_EQ(gemma->sliding_rope.type, RopeType::kDefault);
  EXPECT_EQ(gemma->sliding_rope.theta, 10000.0);
  EXPECT_DOUBLE_EQ(gemma->attention_scale, 1.0 / std::sqrt(24.0));
  EXPECT_EQ(gemma->activation, Activation::kGeluTanh);
  EXPECT_TRUE(gemma->norm_adds_one && gemma->sandwich_norms && gemma->scale_embeddings && gemma->qk_norm);
  EXPECT_TRUE(gemma->tie_word_embeddings);
}

TEST_P(GoldenModelLoad, EveryWeightHasTheConfigShape) {
  const GoldenModel& model = GetParam();
  auto config = load_model_config(model_dir(model));
  ASSERT_TRUE(config.has_value()) << config.status().message();
  auto store = WeightStore::open(model_dir(model));
  ASSERT_TRUE(store.has_value()) << store.status().message();
  EXPECT_EQ(store->is_sharded(), model.sharded);

  const int64_t hidden = config->hidden_size, inter = config->intermediate_size;
  struct Expect {
    std::string name;
    std::vector<int64_t> shape;
  };
  std::vector<Expect> expected = {
      {"model.embed_tokens.weight", {config->vocab_size, hidden}},
      {"model.norm.weight", {hidden}},
  };
  if (!config->tie_word_embeddings)
    expected.push_back({"lm_head.weight", {config->vocab_size, hidden}});
  const auto mlp = [&](const std::string& prefix, int64_t size) {
    expected.push_back({prefix + "gate_proj.weight", {size, hidden}});
    expected.push_back({prefix + "up_proj.weight", {size, hidden}});
    expected.push_back({prefix + "down_proj.weight", {hidden, size}});
  };
  for (int64_t layer = 0; layer < config->num_layers; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    expected.push_back({prefix + "input_layernorm.weight", {hidden}});
    expected.push_back({prefix + "post_attention_layernorm.weight", {hidden}});
    if (config->sandwich_norms) {
      expected.push_back({prefix + "pre_feedforward_layernorm.weight", {hidden}});
      expected.push_back({prefix + "post_feedforward_layernorm.weight", {hidden}});
    }
    expected.push_back({prefix + "self_attn.q_proj.weight", {config->q_dim(), hidden}});
    expected.push_back({prefix + "self_attn.k_proj.weight", {config->kv_dim(), hidden}});
    expected.push_back({prefix + "self_attn.v_proj.weight", {config->kv_dim(), hidden}});
    expected.push_back({prefix + "self_attn.o_proj.weight", {hidden, config->q_dim()}});
    if (config->qk_norm) {
      expected.push_back({prefix + "self_attn.q_norm.weight", {config->head_dim}});
      expected.push_back({prefix + "self_attn.k_norm.weight", {config->head_dim}});
    }
    if (config->is_sparse(layer)) {  // one tensor per expert, as on the Hub
      expected.push_back({prefix + "mlp.gate.weight", {config->moe.num_experts, hidden}});
      for (int64_t e = 0; e < config->moe.num_experts; ++e) {
        mlp(prefix + "mlp.experts." + std::to_string(e) + ".", config->moe.expert_intermediate_size);
      }
    } else {
      mlp(prefix + "mlp.", inter);
    }
    if (config->attention_bias) {
      expected.push_back({prefix + "self_attn.q_proj.bias", {config->q_dim()}});
      expected.push_back({prefix + "self_attn.k_proj.bias", {config->kv_dim()}});
      expected.push_back({prefix + "self_attn.v_proj.bias", {config->kv_dim()}});
    }
  }
  size_t total_bytes = 0;
  for (const Expect& e : expected) {
    auto tensor = store->get(e.name, e.shape);
    ASSERT_TRUE(tensor.has_value()) << tensor.status().message();
    EXPECT_EQ(tensor->dtype, config->dtype) << e.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(tensor->data) % dtype_size_bytes(tensor->dtype), 0u);
    total_bytes += tensor->size_bytes;
  }
  EXPECT_EQ(store->size(), expected.size()) << "unexpected extra tensors";
  EXPECT_EQ(store->total_bytes(), total_bytes);
}

INSTANTIATE_TEST_SUITE_P(
    Models, GoldenModelLoad,
    ::testing::Values(
        GoldenModel{"llama_gqa_bf16", Architecture::kLlama, DType::kBF16, true, false},
        GoldenModel{"qwen2_bias_tied", Architecture::kQwen2, DType::kF32, false, true},
        GoldenModel{"mistral_f16", Architecture::kMistral, DType::kF16, false, false},
        GoldenModel{"qwen3_bf16_tied", Architecture::kQwen3, DType::kBF16, false, true},
        GoldenModel{"qwen3_moe", Architecture::kQwen3Moe, DType::kF32, false, false},
        GoldenModel{"qwen3_moe_step2", Architecture::kQwen3Moe, DType::kF16, false, true},
        GoldenModel{"gemma3_sliding", Architecture::kGemma3, DType::kF32, false, true}),
    [](const ::testing::TestParamInfo<GoldenModel>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace slimkv
