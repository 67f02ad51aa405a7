// The retrieval tasks' prompts and scoring, held to what a perfect reader of the prompt would answer,
// and (on the bundled model) to what the model itself answers.
#include <algorithm>
#include <fstream>
#include <regex>
#include <set>

#include <gtest/gtest.h>

#include "eval/retrieval_task.h"
#include "slimkv/engine.h"
#include "source_dir.h"

namespace slimkv {
namespace {

const std::string kModel = slimkv::test::source_dir() + "/models/slimkv-llama-15m";

class RetrievalTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto tokenizer = Tokenizer::load(kModel + "/tokenizer.json");
    ASSERT_TRUE(tokenizer.has_value()) << tokenizer.status().message();
    tokenizer_ = new Tokenizer(std::move(*tokenizer));
  }
  static void TearDownTestSuite() { delete tokenizer_; }
  static Tokenizer* tokenizer_;
};
Tokenizer* RetrievalTest::tokenizer_ = nullptr;

// Reads the prompt's text the way a perfect memory would: finds the one fact the question asks about.
Expected<std::string> perfect_reader(const Tokenizer& tokenizer, const RetrievalSample& sample) {
  const std::string text = tokenizer.decode(sample.prompt, /*skip_special_tokens=*/true);
  std::smatch match;
  if (std::regex_search(text, match, std::regex("The pass key is (\\d+)\\. Remember it\\."))) return " " + match[1].str() + ".";
  if (std::regex_search(text, match, std::regex("The value of (\\w+) is$"))) {
    std::smatch record;
    const std::string key = match[1].str();
    if (std::regex_search(text, record, std::regex("\n" + key + " = (\\d+)\n"))) return " " + record[1].str() + "\n";
  }
  return std::string(" none");
}

double overall_accuracy(const EvalResults& results) {
  for (const ResultRow& row : results.rows()) {
    if (row.is_overall() && !row.placement) return row.value;
  }
  return -1.0;
}

TEST_F(RetrievalTest, PerfectReaderGetsEveryPasskeyAndRecord) {
  const RetrievalPrompts prompts(*tokenizer_, 0);
  const RetrievalAnswerer reader = [&](const RetrievalSample& sample) { return perfect_reader(*tokenizer_, sample); };
  Progress quiet = Progress::silent();
  for (const auto& cases : {passkey_cases(prompts, 1024, 2, 7), kvret_cases(prompts, 1024, 3, 7)}) {
    ASSERT_FALSE(cases.empty());
    EvalResults results;
    ASSERT_TRUE(score_retrieval(cases, "t", "s", reader, quiet, results).is_ok());
    EXPECT_EQ(overall_accuracy(results), 1.0);
  }
}

TEST_F(RetrievalTest, PromptsHaveTheGridLengthAndTheKeyWhereAsked) {
  const RetrievalPrompts prompts(*tokenizer_, 0);
  const auto cases = passkey_cases(prompts, 1024, 1, 3);
  ASSERT_EQ(cases.size(), 2u * 4u * 5u);  // placements x lengths x depths
  for (const RetrievalCase& c : cases) {
    EXPECT_EQ(int(c.sample.prompt.size()) + c.sample.answer_tokens, c.length);
    EXPECT_EQ(c.sample.prompt[0], 0);  // BOS
    // The needle's place within the filler: between the header and the closing question.
    const std::string text = tokenizer_->decode(c.sample.prompt, true);
    const size_t needle = text.find("The pass key is " + c.sample.answer + ".");
    const size_t filler_start = text.find("pass key.\n\n") + 11, filler_end = text.rfind("\n\n");
    ASSERT_NE(needle, std::string::npos);
    const size_t needle_bytes = text.find("is the pass key.", needle) + 16 - needle;
    EXPECT_NEAR(double(needle - filler_start) / double(filler_end - filler_start - needle_bytes), *c.depth, 0.05);
  }
  for (const RetrievalCase& c : kvret_cases(prompts, 1024, 2, 3)) {
    EXPECT_LE(int(c.sample.prompt.size()) + c.sample.answer_tokens, c.length);
    EXPECT_GT(int(c.sample.prompt.size()) + c.sample.answer_tokens, c.length - 40);  // records fill the length
  }
}

// Natural filler: a span of the evaluation text at a random offset per prompt, the needle inside it.
TEST_F(RetrievalTest, NaturalFillerIsASpanOfTheTextAtItsOwnOffsetPerPrompt) {
  std::ifstream file(kModel + "/heldout.txt");
  std::string text(200'000, '\0');
  file.read(text.data(), std::streamsize(text.size()));
  const std::vector<int32_t> ids = tokenizer_->encode(text.substr(0, size_t(file.gcount())), false);
  const RetrievalPrompts prompts(*tokenizer_, 0, ids);
  const RetrievalAnswerer reader = [&](const RetrievalSample& sample) { return perfect_reader(*tokenizer_, sample); };
  const auto cases = passkey_cases(prompts, 1024, 1, 5);
  EvalResults results;
  Progress quiet = Progress::silent();
  ASSERT_TRUE(score_retrieval(cases, "t", "s", reader, quiet, results).is_ok());
  EXPECT_EQ(overall_accuracy(results), 1.0);
  const size_t header = tokenizer_->encode("There is an important pass key hidden inside a lot of irrelevant text. Find it and "
                                           "memorize it. I will quiz you about the pass key.\n\n", false).size();
  std::set<std::vector<int32_t>> openings;
  for (const RetrievalCase& c : cases) {
    EXPECT_EQ(int(c.sample.prompt.size()) + c.sample.answer_tokens, c.length);
    if (c.placement != QuestionPlacement::kAfter || *c.depth < 0.5) continue;
    // With the needle in the second half, the first 64 filler tokens come straight from the text.
    const std::vector<int32_t> opening(c.sample.prompt.begin() + ptrdiff_t(1 + header), c.sample.prompt.begin() + ptrdiff_t(1 + header + 64));
    EXPECT_NE(std::search(ids.begin(), ids.end(), opening.begin(), opening.end()), ids.end());
    openings.insert(opening);
  }
  EXPECT_GT(openings.size(), 5u);  // 2 depths x 4 lengths: each prompt cut from its own place
}

TEST_F(RetrievalTest, SameSeedSamePromptsOtherSeedOthers) {
  const RetrievalPrompts prompts(*tokenizer_, 0);
  const auto a = kvret_cases(prompts, 512, 2, 11), b = kvret_cases(prompts, 512, 2, 11), c = kvret_cases(prompts, 512, 2, 12);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].sample.prompt, b[i].sample.prompt);
  EXPECT_NE(a[0].sample.prompt, c[0].sample.prompt);
}

TEST(AnswerScoring, KeyMustBeWholeAndFirst) {
  EXPECT_TRUE(answer_is_correct(" 52445.", "52445"));
  EXPECT_TRUE(answer_is_correct("52445", "52445"));
  EXPECT_TRUE(answer_is_correct("\n 52445\n", "52445"));
  EXPECT_FALSE(answer_is_correct(" 524459", "52445"));
  EXPECT_FALSE(answer_is_correct(" 5244", "52445"));
  EXPECT_FALSE(answer_is_correct(" the key 52445", "52445"));
  EXPECT_TRUE(answer_still_possible(" ", "52445"));
  EXPECT_TRUE(answer_still_possible(" 524", "52445"));
  EXPECT_FALSE(answer_still_possible(" 525", "52445"));
}

}  // namespace
}  // namespace slimkv
