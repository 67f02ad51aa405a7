// Holds the tokenizer to Hugging Face tokenizers: every tests/data/tokenizers/<name>/golden.json
// entry (made by scripts/golden/make_golden.py) must encode and decode exactly as HF did.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "slimkv/tokenizer.h"
#include "util/mapped_file.h"
#include "source_dir.h"

namespace slimkv {
namespace {

namespace fs = std::filesystem;

const fs::path kTokenizerData = fs::path(slimkv::test::source_dir()) / "tests/data/tokenizers";

std::vector<fs::path> golden_dirs() {
  std::vector<fs::path> dirs;
  if (!fs::is_directory(kTokenizerData)) return dirs;
  for (const auto& entry : fs::directory_iterator(kTokenizerData)) {
    if (fs::exists(entry.path() / "golden.json") && fs::exists(entry.path() / "tokenizer.json")) {
      dirs.push_back(entry.path());
    }
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

// "ids differ at position 3 (of 10 vs 11): expected 42, got 17".
std::string describe_id_mismatch(const std::vector<int32_t>& expected, const std::vector<int32_t>& actual) {
  size_t i = 0;
  while (i < expected.size() && i < actual.size() && expected[i] == actual[i]) ++i;
  std::ostringstream out;
  out << "ids differ at position " << i << " (lengths " << expected.size() << " expected, " << actual.size()
      << " got)";
  if (i < expected.size()) out << ": expected " << expected[i];
  if (i < actual.size()) out << ", got " << actual[i];
  return out.str();
}

std::string describe_text_mismatch(const std::string& expected, const std::string& actual) {
  size_t i = 0;
  while (i < expected.size() && i < actual.size() && expected[i] == actual[i]) ++i;
  std::ostringstream out;
  out << "text differs at byte " << i << ": expected \"" << expected.substr(i, 40) << "\", got \""
      << actual.substr(i, 40) << "\"";
  return out.str();
}

std::string excerpt(const std::string& text) {
  return text.size() <= 120 ? text : text.substr(0, 120) + "...";
}

class GoldenTest : public ::testing::TestWithParam<fs::path> {};

TEST_P(GoldenTest, MatchesHuggingFace) {
  const fs::path dir = GetParam();
  Expected<Tokenizer> tokenizer = Tokenizer::load((dir / "tokenizer.json").string());
  ASSERT_TRUE(tokenizer.has_value()) << tokenizer.status().message();
  Expected<std::string> golden_text = read_text_file((dir / "golden.json").string());
  ASSERT_TRUE(golden_text.has_value()) << golden_text.status().message();
  const nlohmann::json golden = nlohmann::json::parse(*golden_text);
  ASSERT_TRUE(golden.is_array());
  size_t failures = 0;
  for (size_t i = 0; i < golden.size(); ++i) {
    const auto& row = golden[i];
    const std::string text = row["text"].get<std::string>();
    const auto ids = row["ids"].get<std::vector<int32_t>>();
    const auto ids_no_special = row["ids_no_special"].get<std::vector<int32_t>>();
    const std::string where = "entry " + std::to_string(i) + " text \"" + excerpt(text) + "\": ";

    const std::vector<int32_t> got = tokenizer->encode(text, /*add_special_tokens=*/true);
    if (got != ids) {
      ADD_FAILURE() << where << "encode: " << describe_id_mismatch(ids, got);
      ++failures;
    }
    const std::vector<int32_t> got_no_special = tokenizer->encode(text, /*add_special_tokens=*/false);
    if (got_no_special != ids_no_special) {
      ADD_FAILURE() << where << "encode(add_special_tokens=false): "
                    << describe_id_mismatch(ids_no_special, got_no_special);
      ++failures;
    }
    const std::string decoded = tokenizer->decode(ids, /*skip_special_tokens=*/false);
    if (decoded != row["decoded"].get<std::string>()) {
      ADD_FAILURE() << where << "decode: " << describe_text_mismatch(row["decoded"].get<std::string>(), decoded);
      ++failures;
    }
    const std::string decoded_skip = tokenizer->decode(ids, /*skip_special_tokens=*/true);
    if (decoded_skip != row["decoded_skip"].get<std::string>()) {
      ADD_FAILURE() << where << "decode(skip_special_tokens=true): "
                    << describe_text_mismatch(row["decoded_skip"].get<std::string>(), decoded_skip);
      ++failures;
    }
    if (failures > 20) FAIL() << "too many mismatches; stopping";
  }
}

// Streaming the golden ids one at a time must give the same text as decoding them at once, for
// every tokenizer (HF's DecodeStream guarantees this when no chunk ends inside a character).
TEST_P(GoldenTest, StreamingDecodeConcatenatesToDecode) {
  const fs::path dir = GetParam();
  Expected<Tokenizer> tokenizer = Tokenizer::load((dir / "tokenizer.json").string());
  ASSERT_TRUE(tokenizer.has_value()) << tokenizer.status().message();
  Expected<std::string> golden_text = read_text_file((dir / "golden.json").string());
  ASSERT_TRUE(golden_text.has_value());
  const nlohmann::json golden = nlohmann::json::parse(*golden_text);
  for (size_t i = 0; i < golden.size(); ++i) {
    const auto ids = golden[i]["ids"].get<std::vector<int32_t>>();
    StreamingDecoder stream(*tokenizer);
    std::string streamed;
    for (const int32_t id : ids) streamed += stream.push(id);
    streamed += stream.finish();
    EXPECT_EQ(streamed, tokenizer->decode(ids)) << "entry " << i << " text \"" << excerpt(golden[i]["text"].get<std::string>()) << "\"";
  }
}

std::string dir_name(const ::testing::TestParamInfo<fs::path>& info) { return info.param.filename().string(); }

INSTANTIATE_TEST_SUITE_P(Tokenizers, GoldenTest, ::testing::ValuesIn(golden_dirs()), dir_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GoldenTest);

TEST(GoldenData, Present) {
  if (golden_dirs().empty()) GTEST_SKIP() << "no golden files under " << kTokenizerData;
  EXPECT_GE(golden_dirs().size(), 3u);
}

}  // namespace
}  // namespace slimkv
