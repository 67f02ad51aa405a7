// The engine against Hugging Face transformers: golden logits (FP32 eager attention over the stored
// weights) and greedy continuations made by scripts/golden/make_golden.py, for every model under
// tests/data/models/. Both the prefill path and the incremental (decode) path must match.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/model_config.h"
#include "slimkv/engine.h"
#include "slimkv/npy.h"
#include "golden_models.h"

namespace slimkv {
namespace {

const std::string& kModels = kGoldenModels;

std::unique_ptr<Engine> load(const std::string& dir, const std::string& kv = "dense", int chunk = 512) {
  EngineConfig config;
  config.model_dir = dir;
  config.kv_spec = kv;
  config.threads = 2;
  config.prefill_chunk_tokens = chunk;
  auto engine = Engine::load(config);
  EXPECT_TRUE(engine) << engine.status().message();
  return engine ? engine.take() : nullptr;
}

TEST(HfParity, LogitsMatchTransformersInPrefillAndIncrementalModes) {
  const auto dirs = golden_models();
  ASSERT_GE(dirs.size(), 3u) << "golden models missing under " << kModels;
  for (const std::string& dir : dirs) {
    SCOPED_TRACE(dir);
    auto golden = read_npy_f32(dir + "/golden_logits.npy");
    ASSERT_TRUE(golden) << golden.status().message();
    const auto tokens = golden_tokens(dir);
    auto engine = load(dir);
    ASSERT_TRUE(engine);
    ASSERT_EQ(golden->shape, (std::vector<int64_t>{int64_t(tokens.size()), engine->model_config().vocab_size}));
    // The golden logits are FP32 over the stored weights, as ours: only summation order differs. The
    // issue's bar is 1e-3 (FP32 checkpoints) and 2e-2 (BF16) of max |logit|; we hold to 1e-4.
    const double tolerance = 1e-4;

    auto prefill = engine->new_session()->prefill(tokens, /*all_logits=*/true);
    ASSERT_TRUE(prefill) << prefill.status().message();
    const double prefill_error = relative_max_error(*prefill, golden->values);
    EXPECT_LT(prefill_error, tolerance) << "prefill";

    auto session = engine->new_session();
    std::vector<float> incremental;
    for (int32_t id : tokens) {
      auto row = session->decode(id);
      ASSERT_TRUE(row) << row.status().message();
      incremental.insert(incremental.end(), row->begin(), row->end());
    }
    const double incremental_error = relative_max_error(incremental, golden->values);
    EXPECT_LT(incremental_error, tolerance) << "incremental";

    // Prefill in uneven chunks (blocks seal mid-chunk) gives the same logits.
    auto chunked_engine = load(dir, "dense", 7);
    auto chunked = chunked_engine->new_session()->prefill(tokens, true);
    ASSERT_TRUE(chunked) << chunked.status().message();
    EXPECT_LT(relative_max_error(*chunked, golden->values), tolerance) << "chunked prefill";
    std::printf("%s: max error / max|logit|: prefill %.2e, incremental %.2e\n",
                std::filesystem::path(dir).filename().c_str(), prefill_error, incremental_error);
  }
}

TEST(HfParity, GreedyContinuationMatchesTransformers) {
  for (const std::string& dir : golden_models()) {
    SCOPED_TRACE(dir);
    const GoldenGreedy golden = golden_greedy(dir);
    auto engine = load(dir);
    ASSERT_TRUE(engine);
    auto generated = greedy_continuation(*engine->new_session(), golden.prompt, golden.generated.size());
    ASSERT_TRUE(generated) << generated.status().message();
    EXPECT_EQ(*generated, golden.generated);
  }
}

TEST(HfParity, HalfPrecisionKvStaysClose) {
  // FP16/BF16 storage of sealed blocks rounds K/V; logits move by about that rounding, no more.
  const std::string dir = kModels + "/llama_gqa_bf16";
  auto golden = read_npy_f32(dir + "/golden_logits.npy");
  ASSERT_TRUE(golden);
  const auto tokens = golden_tokens(dir);
  for (const char* spec : {"dense:dtype=f16", "dense:dtype=bf16", "dense:block=16"}) {
    auto engine = load(dir, spec);
    ASSERT_TRUE(engine);
    auto logits = engine->new_session()->prefill(tokens, true);
    ASSERT_TRUE(logits);
    const double bound = std::string(spec).find("bf16") != std::string::npos ? 3e-2 : 5e-3;
    EXPECT_LT(relative_max_error(*logits, golden->values), std::string(spec) == "dense:block=16" ? 1e-4 : bound)
        << spec;
  }
}

// A batched decode step equals each session's own decode; a refused one changes no session.
TEST(Session, DecodeBatchMatchesEachSessionAlone) {
  auto engine = load(kModels + "/llama_gqa_bf16");
  ASSERT_TRUE(engine);
  const auto tokens = golden_tokens(kModels + "/llama_gqa_bf16");
  std::vector<std::unique_ptr<Session>> batched, alone;
  for (size_t length : {size_t(1), size_t(9), size_t(70)}) {
    for (auto* sessions : {&batched, &alone}) {
      sessions->push_back(engine->new_session());
      ASSERT_TRUE(sessions->back()->prefill(std::vector<int32_t>(tokens.begin(), tokens.begin() + ptrdiff_t(length))));
    }
  }
  std::vector<Session*> step = {batched[0].get(), batched[1].get(), batched[2].get()};
  const std::vector<int32_t> next = {5, 6, 7};
  auto logits = Session::decode_batch(step, next);
  ASSERT_TRUE(logits) << logits.status().message();
  const size_t vocab = size_t(engine->model_config().vocab_size);
  for (size_t i = 0; i < step.size(); ++i) {
    auto row = alone[i]->decode(next[i]);
    ASSERT_TRUE(row);
    EXPECT_EQ(std::vector<float>(logits->begin() + ptrdiff_t(i * vocab), logits->begin() + ptrdiff_t((i + 1) * vocab)), *row);
  }
  const auto refused = [&](std::vector<Session*> sessions, std::vector<int32_t> ids, const char* expected) {
    auto result = Session::decode_batch(sessions, ids);
    ASSERT_FALSE(result);
    EXPECT_NE(result.status().message().find(expected), std::string::npos) << result.status().message();
    for (size_t i = 0; i < batched.size(); ++i) EXPECT_EQ(batched[i]->num_tokens(), alone[i]->num_tokens());
  };
  refused({step[0], step[0]}, {1, 2}, "twice");
  refused({step[0], step[1]}, {1, 99999}, "outside the vocabulary");
  refused({step[0]}, {1, 2}, "1 sessions and 2 tokens");
  auto other = load(kModels + "/llama_gqa_bf16");
  auto stranger = other->new_session();
  refused({step[0], stranger.get()}, {1, 2}, "one engine");
}

TEST(Session, RefusesBadInputWithClearErrors) {
  auto engine = load(kModels + "/qwen2_bias_tied");
  ASSERT_TRUE(engine);
  auto session = engine->new_session();
  auto empty = session->prefill({});
  ASSERT_FALSE(empty);
  EXPECT_NE(empty.status().message().find("empty"), std::string::npos);

  const std::vector<int32_t> bad_id = {1, 2, int32_t(engine->model_config().vocab_size)};
  auto out_of_vocab = session->prefill(bad_id);
  ASSERT_FALSE(out_of_vocab);
  EXPECT_NE(out_of_vocab.status().message().find("outside the vocabulary"), std::string::npos);
  EXPECT_EQ(session->num_tokens(), 0) << "a refused call must not change the sequence";

  const std::vector<int32_t> too_long(size_t(session->context_tokens()) + 1, 1);
  auto long_prompt = session->prefill(too_long);
  ASSERT_FALSE(long_prompt);
  EXPECT_NE(long_prompt.status().message().find("context"), std::string::npos) << long_prompt.status().message();

  EngineConfig config;
  config.model_dir = kModels + "/qwen2_bias_tied";
  config.kv_spec = "dense:dtype=f12";
  auto bad_spec = Engine::load(config);
  ASSERT_FALSE(bad_spec);
  EXPECT_NE(bad_spec.status().message().find("dtype=f12"), std::string::npos);
  config.kv_spec = "dense";
  config.device = "tpu";
  auto bad_device = Engine::load(config);
  ASSERT_FALSE(bad_device);
  EXPECT_NE(bad_device.status().message().find("tpu"), std::string::npos);
  // device "cuda" runs where the build has the backend and a GPU is usable; elsewhere it says why.
  config.device = "cuda";
  if (auto gpu = Engine::load(config); !gpu) {
    EXPECT_NE(gpu.status().message().find("CUDA"), std::string::npos) << gpu.status().message();
  }
  config.device = "cpu";
  config.model_dir = kModels + "/does_not_exist";
  auto missing = Engine::load(config);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.status().message().find("does_not_exist"), std::string::npos);
}

}  // namespace
}  // namespace slimkv
