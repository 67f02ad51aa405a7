// GGUF metadata as a ModelConfig for the families beyond Llama (the fixture files of
// tests/data/gguf, made by llama.cpp's converter), and the refusals of what slimkv does not run, each
// naming the key and its value.
#include "model/gguf_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tokenizer/gguf_tokenizer.h"

namespace slimkv {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

const std::string kDir = std::string(SLIMKV_SOURCE_DIR) + "/tests/data/gguf";

GgufFile open(const std::string& path) {
  auto file = GgufFile::open(path);
  EXPECT_TRUE(file) << file.status().message();
  return file.take();
}

TEST(GgufModel, Gemma3KeysAndLlamaCppsFixedChoices) {
  auto config = gguf_model_config(open(kDir + "/gemma3_tiny-F16.gguf"));
  ASSERT_TRUE(config) << config.status().message();
  EXPECT_EQ(config->architecture, Architecture::kGemma3);
  EXPECT_EQ(config->sliding_window, 8);
  EXPECT_EQ(config->sliding_layers, (std::vector<bool>{true, true, true, true, true, false}));  // every 6th global
  EXPECT_EQ(config->rope.type, RopeType::kLinear);  // the global layers' scaling only
  EXPECT_EQ(config->rope.factor, 8.0);
  EXPECT_EQ(config->rope.theta, 1e6);
  EXPECT_EQ(config->sliding_rope.type, RopeType::kDefault);
  EXPECT_EQ(config->sliding_rope.theta, 1e4);
  EXPECT_DOUBLE_EQ(config->attention_scale, 1.0 / std::sqrt(16.0));
  EXPECT_TRUE(config->qk_norm && config->sandwich_norms && config->scale_embeddings);
  EXPECT_FALSE(config->norm_adds_one);  // the converter stored 1 + w
  EXPECT_FALSE(config->embedding_scale_in_dtype);  // llama.cpp scales by sqrtf(hidden) in F32
  EXPECT_EQ(config->activation, Activation::kGeluTanh);
  EXPECT_TRUE(config->tie_word_embeddings);
}

TEST(GgufModel, Qwen3MoeExpertsAndTheirTensors) {
  auto model = load_gguf_model(kDir + "/qwen3moe_tiny-Q8_0.gguf");
  ASSERT_TRUE(model) << model.status().message();
  const ModelConfig& config = model->config;
  EXPECT_EQ(config.architecture, Architecture::kQwen3Moe);
  EXPECT_TRUE(config.qk_norm);
  EXPECT_EQ(config.moe.num_experts, 4);
  EXPECT_EQ(config.moe.experts_per_token, 2);
  EXPECT_EQ(config.moe.expert_intermediate_size, 32);
  EXPECT_TRUE(config.moe.normalize_top_k);
  EXPECT_EQ(config.moe.sparse_layers, (std::vector<bool>{true, true}));
  // The stacked [experts, rows, cols] tensors as one view per expert, consecutive slices of the stack.
  auto first = model->weights.get("model.layers.1.mlp.experts.0.down_proj.weight", {32, 32});
  auto second = model->weights.get("model.layers.1.mlp.experts.1.down_proj.weight", {32, 32});
  ASSERT_TRUE(first) << first.status().message();
  ASSERT_TRUE(second) << second.status().message();
  EXPECT_EQ(first->quant, BlockQuant::kQ8_0);
  EXPECT_EQ(second->data, first->data + first->size_bytes);
  EXPECT_TRUE(model->weights.get("model.layers.0.mlp.gate.weight", {4, 32}));
}

// A GGUF file of string metadata only.
std::string write_metadata(const std::string& name, const std::vector<std::pair<std::string, std::string>>& keys) {
  std::vector<uint8_t> bytes;
  const auto raw = [&](auto value) {
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes.insert(bytes.end(), p, p + sizeof(value));
  };
  const auto str = [&](const std::string& s) {
    raw(uint64_t(s.size()));
    bytes.insert(bytes.end(), s.begin(), s.end());
  };
  raw(uint32_t(0x46554747));
  raw(uint32_t(3));
  raw(uint64_t(0));
  raw(uint64_t(keys.size()));
  for (const auto& [key, value] : keys) {
    str(key);
    raw(uint32_t(GgufValueType::kString));
    str(value);
  }
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  return path;
}

TEST(GgufModel, RefusesUnsupportedArchitecturesAndTokenizersNamingKeyAndValue) {
  const auto config = gguf_model_config(open(write_metadata("mamba.gguf", {{"general.architecture", "mamba"}})));
  ASSERT_FALSE(config);
  EXPECT_THAT(config.status().message(),
              AllOf(HasSubstr("mamba.gguf"), HasSubstr("'general.architecture'"), HasSubstr("\"mamba\""),
                    HasSubstr("llama, qwen2, qwen3, qwen3moe, gemma3")));
  const auto tokenizer = gguf_tokenizer_json(open(write_metadata("bert.gguf", {{"tokenizer.ggml.model", "bert"}})));
  ASSERT_FALSE(tokenizer);
  EXPECT_THAT(tokenizer.status().message(),
              AllOf(HasSubstr("'tokenizer.ggml.model'"), HasSubstr("\"bert\""), HasSubstr("\"llama\" (SentencePiece)")));
}

}  // namespace
}  // namespace slimkv
