// The one generation loop (include/slimkv/generation.h): stop strings cut exactly (also when they
// arrive across tokens, and never shown in part), end-of-sequence ids, max_tokens and the context,
// and a request's checks. Tokens are fed by hand, so every rule is tested on known text.
#include <gtest/gtest.h>

#include "slimkv/generation.h"
#include "slimkv/tokenizer.h"
#include "source_dir.h"

namespace slimkv {
namespace {

const std::string kModel = slimkv::test::source_dir() + "/models/slimkv-llama-15m";

class GenerationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto loaded = Engine::load({.model_dir = kModel, .threads = 1});
    ASSERT_TRUE(loaded) << loaded.status().message();
    engine_ = std::move(*loaded).release();
  }
  static void TearDownTestSuite() { delete engine_; }

  std::vector<int32_t> ids(const std::string& text) { return engine_->tokenizer()->encode(text, false); }

  GenerationRequest request(std::vector<std::string> stop = {}, int max_tokens = 64) {
    GenerationRequest r;
    r.prompt = ids("Once upon a time");
    r.max_tokens = max_tokens;
    r.stop = std::move(stop);
    return r;
  }

  // Feeds the tokens of `text` one by one; returns the visible text and the finish reason.
  std::pair<std::string, std::optional<FinishReason>> feed(Generation& generation, const std::string& text) {
    std::string shown;
    for (int32_t id : ids(text)) {
      const Generation::Delta delta = generation.accept(id);
      shown += delta.text;
      if (delta.finish) return {shown, delta.finish};
    }
    return {shown, std::nullopt};
  }

  static Engine* engine_;
};
Engine* GenerationTest::engine_ = nullptr;

TEST_F(GenerationTest, TextStreamsAsTheTokenizerDecodesIt) {
  auto generation = Generation::start(*engine_, request());
  ASSERT_TRUE(generation);
  const std::string text = " the quick brown fox jumps over the lazy dog.";
  auto [shown, finish] = feed(*generation, text);
  EXPECT_FALSE(finish);
  shown += generation->finish(FinishReason::kCancelled).text;
  EXPECT_EQ(shown, engine_->tokenizer()->decode(ids(text), true));
  EXPECT_EQ(generation->finish_reason(), FinishReason::kCancelled);
}

TEST_F(GenerationTest, StopStringsCutExactlyEvenAcrossTokens) {
  auto generation = Generation::start(*engine_, request({"lazy dog", "fox j"}));
  ASSERT_TRUE(generation);
  auto [shown, finish] = feed(*generation, " the quick brown fox jumps over the lazy dog.");
  EXPECT_EQ(finish, FinishReason::kStop);
  EXPECT_EQ(shown, " the quick brown ");  // the earliest stop string wins; nothing of it is shown
}

TEST_F(GenerationTest, APartialStopStringIsHeldBackThenReleased) {
  auto generation = Generation::start(*engine_, request({"brown cow"}));
  ASSERT_TRUE(generation);
  std::string shown;
  for (int32_t id : ids(" the quick brown")) shown += generation->accept(id).text;
  EXPECT_EQ(shown.find("brown"), std::string::npos) << "'brown' may begin the stop string";
  auto [rest, finish] = feed(*generation, " fox");
  EXPECT_FALSE(finish);
  EXPECT_EQ(shown + rest, engine_->tokenizer()->decode(ids(" the quick brown fox"), true));
}

TEST_F(GenerationTest, EndOfSequenceAndLengthFinish) {
  auto generation = Generation::start(*engine_, request({}, 3));
  ASSERT_TRUE(generation);
  const int64_t eos = engine_->generation_defaults().eos_token_ids.at(0);
  EXPECT_EQ(generation->accept(int32_t(eos)).finish, FinishReason::kStop);
  EXPECT_EQ(generation->generated().size(), 1u);
  auto limited = Generation::start(*engine_, request({}, 3));
  auto [shown, finish] = feed(*limited, " one two three four five");
  EXPECT_EQ(finish, FinishReason::kLength);
  EXPECT_EQ(limited->generated().size(), 3u);
  // Resuming replays the prompt and every accepted token but the last.
  EXPECT_EQ(limited->tokens_to_resume().size(), limited->request().prompt.size() + 2);
  GenerationRequest ignoring = request({}, 2);
  ignoring.ignore_eos = true;
  auto no_eos = Generation::start(*engine_, ignoring);
  EXPECT_FALSE(no_eos->accept(int32_t(eos)).finish);
}

TEST_F(GenerationTest, TheContextBoundsTheTokens) {
  GenerationRequest r = request({}, 1000);
  r.prompt.assign(size_t(engine_->context_tokens() - 2), r.prompt[0]);
  auto generation = Generation::start(*engine_, r);
  ASSERT_TRUE(generation);
  auto [shown, finish] = feed(*generation, " a b c d");
  EXPECT_EQ(finish, FinishReason::kLength);
  EXPECT_EQ(generation->generated().size(), 2u);
}

TEST_F(GenerationTest, BadRequestsNameTheField) {
  auto message = [&](GenerationRequest r) { return Generation::start(*engine_, r).status().message(); };
  GenerationRequest empty = request();
  empty.prompt.clear();
  EXPECT_NE(message(empty).find("prompt"), std::string::npos);
  GenerationRequest outside = request();
  outside.prompt.push_back(1 << 20);
  EXPECT_NE(message(outside).find("outside the vocabulary"), std::string::npos);
  GenerationRequest zero = request({}, 0);
  EXPECT_NE(message(zero).find("max_tokens"), std::string::npos);
  EXPECT_NE(message(request({""})).find("stop"), std::string::npos);
  GenerationRequest full = request();
  full.prompt.assign(size_t(engine_->context_tokens()), 5);
  EXPECT_NE(message(full).find("context"), std::string::npos);
}

TEST_F(GenerationTest, GenerateRunsTheLoopOnASequenceAndHonoursCancellation) {
  GenerationRequest r = request({}, 12);
  auto generation = Generation::start(*engine_, r);
  ASSERT_TRUE(generation);
  const SequenceId sequence = *engine_->add_sequence();
  std::string text;
  int calls = 0;
  ASSERT_TRUE(generate(*engine_, sequence, *generation, [&](const Generation::Delta& delta) {
                text += delta.text;
                return ++calls < 3;  // stop after the third piece of text
              }).is_ok());
  EXPECT_EQ(generation->finish_reason(), FinishReason::kCancelled);
  EXPECT_EQ(*engine_->num_tokens(sequence), int(r.prompt.size() + generation->generated().size() - 1));
  EXPECT_TRUE(engine_->remove_sequence(sequence).is_ok());
}

}  // namespace
}  // namespace slimkv
