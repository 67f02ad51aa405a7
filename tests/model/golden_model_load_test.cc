// The golden model directories made by HF transformers (scripts/golden/make_golden.py): both config
// layouts give the same ModelConfig, and every Llama-family weight is there with the shape the
// config implies, in the dtype it declares, single-file and sharded alike.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/weight_store.h"
#include "util/mapped_file.h"

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
  return std::string(SLIMKV_SOURCE_DIR) + "/tests/data/models/" + model.name;
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
  for (int64_t layer = 0; layer < config->num_layers; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    expected.push_back({prefix + "input_layernorm.weight", {hidden}});
    expected.push_back({prefix + "post_attention_layernorm.weight", {hidden}});
    expected.push_back({prefix + "self_attn.q_proj.weight", {config->q_dim(), hidden}});
    expected.push_back({prefix + "self_attn.k_proj.weight", {config->kv_dim(), hidden}});
    expected.push_back({prefix + "self_attn.v_proj.weight", {config->kv_dim(), hidden}});
    expected.push_back({prefix + "self_attn.o_proj.weight", {hidden, config->q_dim()}});
    expected.push_back({prefix + "mlp.gate_proj.weight", {inter, hidden}});
    expected.push_back({prefix + "mlp.up_proj.weight", {inter, hidden}});
    expected.push_back({prefix + "mlp.down_proj.weight", {hidden, inter}});
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
        GoldenModel{"mistral_f16", Architecture::kMistral, DType::kF16, false, false}),
    [](const ::testing::TestParamInfo<GoldenModel>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace slimkv
