// Each tokenizer stage on hand-made tokenizer.json documents, with the results Hugging Face
// tokenizers gives for them, and the load errors for bad files.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/regex.h"
#include "slimkv/tokenizer.h"
#include "tokenizer/utf8.h"
#include "util/mapped_file.h"
#include "source_dir.h"

namespace slimkv {
namespace {

using Json = nlohmann::json;
using Ids = std::vector<int32_t>;

// ---------------------------------------------------------------------------------------------
// Hand-made tokenizer.json documents
// ---------------------------------------------------------------------------------------------

// A BPE tokenizer.json whose vocab is `tokens` (ids in order) with `merges`; no other stages.
Json bpe_spec(const std::vector<std::string>& tokens, const std::vector<std::string>& merges) {
  Json vocab = Json::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = static_cast<int>(i);
  Json spec = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr},
               {"added_tokens", Json::array()}, {"normalizer", nullptr}, {"pre_tokenizer", nullptr},
               {"post_processor", nullptr}, {"decoder", nullptr}};
  spec["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                   {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                   {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                   {"vocab", vocab}, {"merges", merges}};
  return spec;
}

Json added_token(int id, const std::string& content, bool special, bool normalized = false) {
  return {{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", normalized}, {"special", special}};
}

Tokenizer load(const Json& spec) {
  Expected<Tokenizer> tokenizer = Tokenizer::from_json(spec.dump(), "<test>");
  if (!tokenizer.has_value()) {
    ADD_FAILURE() << "load failed: " << tokenizer.status().message();
    std::abort();
  }
  return tokenizer.take();
}

std::string load_error(const Json& spec) {
  Expected<Tokenizer> tokenizer = Tokenizer::from_json(spec.dump(), "tok.json");
  return tokenizer.has_value() ? std::string("<loaded without error>") : tokenizer.status().message();
}

// Letters and a few spaces/punctuation as single-character tokens.
std::vector<std::string> letters() {
  std::vector<std::string> tokens;
  for (char c = 'a'; c <= 'z'; ++c) tokens.emplace_back(1, c);
  for (const char* t : {" ", "!", "H", "W", "\xE2\x96\x81"}) tokens.emplace_back(t);  // 26..30; 30 = ▁
  return tokens;
}

// ---------------------------------------------------------------------------------------------
// Regex: Oniguruma semantics on PCRE2
// ---------------------------------------------------------------------------------------------

std::vector<std::string> find_all(const std::string& pattern, const std::string& text) {
  Expected<Regex> regex = Regex::compile(pattern);
  EXPECT_TRUE(regex.has_value()) << regex.status().message();
  std::vector<Regex::Match> matches;
  regex->find_all(text, matches);
  std::vector<std::string> out;
  for (const auto& m : matches) out.push_back(text.substr(m.begin, m.end - m.begin));
  return out;
}

TEST(TokenizerRegex, WhitespaceClassIsUnicodeWhiteSpace) {
  // U+3000 (ideographic space) is White_Space; U+180E (Mongolian vowel separator) is not, though
  // PCRE2's own \s would match it.
  EXPECT_EQ(find_all(R"(\s+)", "a\xE3\x80\x80" "b"), std::vector<std::string>{"\xE3\x80\x80"});
  EXPECT_TRUE(find_all(R"(\s)", "\xE1\xA0\x8E").empty());
  EXPECT_EQ(find_all(R"([^\s\p{L}]+)", "ab 12"), std::vector<std::string>{"12"});
}

TEST(TokenizerRegex, EmptyMatchesFollowOnigFindIter) {
  // An empty match right after the previous match is skipped; others are kept.
  EXPECT_EQ(find_all("a*", "baa"), (std::vector<std::string>{"", "aa"}));
}

TEST(TokenizerRegex, Gpt2PatternSplitsAsHf) {
  const std::string pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  EXPECT_EQ(find_all(pattern, "Hello world  !! it's 42"),
            (std::vector<std::string>{"Hello", " world", " ", " !!", " it", "'s", " 42"}));
}

TEST(TokenizerRegex, CaseInsensitiveContractions) {
  const std::string pattern = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  EXPECT_EQ(find_all(pattern, "WE'LL 12345\r\n x"),
            (std::vector<std::string>{"WE", "'LL", " ", "123", "45", "\r\n", " x"}));
}

TEST(TokenizerRegex, InvalidPatternIsAnError) {
  Expected<Regex> regex = Regex::compile("(unclosed");
  ASSERT_FALSE(regex.has_value());
  EXPECT_NE(regex.status().message().find("(unclosed"), std::string::npos) << regex.status().message();
}

// ---------------------------------------------------------------------------------------------
// UTF-8
// ---------------------------------------------------------------------------------------------

TEST(TokenizerUtf8, LossyRepairMatchesRust) {
  // from_utf8_lossy: one U+FFFD per maximal invalid subpart.
  EXPECT_EQ(utf8::make_valid_utf8("a\xF0\x9F\x98" "b"), "a\xEF\xBF\xBD" "b");  // truncated 4-byte
  EXPECT_EQ(utf8::make_valid_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");    // overlong: 2
  EXPECT_EQ(utf8::make_valid_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(utf8::make_valid_utf8("ok \xE6\x97\xA5"), "ok \xE6\x97\xA5");
}

// ---------------------------------------------------------------------------------------------
// BPE model
// ---------------------------------------------------------------------------------------------

TEST(TokenizerBpe, MergesApplyInRankOrder) {
  // bc (rank 0) before ab (rank 1): "abc" -> a + bc -> abc.
  Tokenizer by_bc = load(bpe_spec({"a", "b", "c", "ab", "bc", "abc"}, {"b c", "a b", "a bc"}));
  EXPECT_EQ(by_bc.encode("abc"), (Ids{5}));
  EXPECT_EQ(by_bc.encode("ab"), (Ids{3}));
  // Without the a+bc merge the word stops at [a, bc].
  Tokenizer partial = load(bpe_spec({"a", "b", "c", "ab", "bc"}, {"b c", "a b"}));
  EXPECT_EQ(partial.encode("abc"), (Ids{0, 4}));
}

TEST(TokenizerBpe, EqualRanksMergeLeftmostFirst) {
  Tokenizer tokenizer = load(bpe_spec({"a", "aa"}, {"a a"}));
  EXPECT_EQ(tokenizer.encode("aaa"), (Ids{1, 0}));
  EXPECT_EQ(tokenizer.encode("aaaa"), (Ids{1, 1}));
}

TEST(TokenizerBpe, MergeRanksOfEqualValueMergeLeftmostFirst) {
  // "abc": bc and ab tie, so the leftmost pair (ab) merges first, then ab + c: as SentencePiece merges
  // pieces of equal score. In list order bc would go first and a + bc is no merge.
  Json spec = bpe_spec({"a", "b", "c", "ab", "bc", "abc"}, {"b c", "a b", "ab c"});
  EXPECT_EQ(load(spec).encode("abc"), (Ids{0, 4}));
  spec["model"]["merge_ranks"] = Json::array({0, 0, 1});
  EXPECT_EQ(load(spec).encode("abc"), (Ids{5}));
  EXPECT_EQ(load(spec).encode("bcab"), (Ids{4, 3}));
  // Ranks order merges against the list: a b (rank 1) before b c (rank 2).
  spec["model"]["merge_ranks"] = Json::array({2, 1, 0});
  EXPECT_EQ(load(spec).encode("abc"), (Ids{5}));
}

TEST(TokenizerBpe, MergesAsPairsEqualMergesAsStrings) {
  Json spec = bpe_spec({"a", "b", "c", "ab", "abc"}, {});
  spec["model"]["merges"] = Json::array({Json::array({"a", "b"}), Json::array({"ab", "c"})});
  EXPECT_EQ(load(spec).encode("abcab"), (Ids{4, 3}));
}

TEST(TokenizerBpe, IgnoreMergesTakesWholeWordsFromVocab) {
  // "abc" is in the vocab but no merge path leads to it.
  Json spec = bpe_spec({"a", "b", "c", "ab", "abc"}, {"a b"});
  EXPECT_EQ(load(spec).encode("abc"), (Ids{3, 2}));
  spec["model"]["ignore_merges"] = true;
  EXPECT_EQ(load(spec).encode("abc"), (Ids{4}));
}

TEST(TokenizerBpe, ByteFallbackAndUnknown) {
  std::vector<std::string> tokens = {"<unk>", "a", "<0xC3>", "<0xA9>"};
  Json spec = bpe_spec(tokens, {});
  spec["model"]["unk_token"] = "<unk>";
  spec["model"]["byte_fallback"] = true;
  // é = C3 A9 falls back to bytes; 日 has no byte tokens and becomes <unk>.
  EXPECT_EQ(load(spec).encode("a\xC3\xA9" "a"), (Ids{1, 2, 3, 1}));
  EXPECT_EQ(load(spec).encode("\xE6\x97\xA5\xE6\x97\xA5" "a"), (Ids{0, 0, 1}));
  spec["model"]["fuse_unk"] = true;
  EXPECT_EQ(load(spec).encode("\xE6\x97\xA5\xE6\x97\xA5" "a"), (Ids{0, 1}));
  spec["model"]["unk_token"] = nullptr;  // no unk token: unknown characters are dropped
  EXPECT_EQ(load(spec).encode("\xE6\x97\xA5" "a"), (Ids{1}));
}

TEST(TokenizerBpe, SubwordPrefixAndSuffix) {
  Json spec = bpe_spec({"a", "##b", "##c</w>", "ab", "c</w>"}, {});  // HF merges a + ##b into "ab"
  spec["model"]["continuing_subword_prefix"] = "##";
  spec["model"]["end_of_word_suffix"] = "</w>";
  spec["model"]["merges"] = Json::array({"a ##b"});
  EXPECT_EQ(load(spec).encode("abc"), (Ids{3, 2}));
  EXPECT_EQ(load(spec).encode("c"), (Ids{4}));
}

// ---------------------------------------------------------------------------------------------
// Normalizers and pre-tokenizers
// ---------------------------------------------------------------------------------------------

TEST(TokenizerNormalizer, SequenceOfLowercaseStripReplacePrepend) {
  Json spec = bpe_spec(letters(), {});
  spec["normalizer"] = {{"type", "Sequence"}, {"normalizers", {
      {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
      {{"type", "Lowercase"}},
      {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}},
      {{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}}}}};
  EXPECT_EQ(load(spec).encode("  Hi Yo \t"), (Ids{30, 7, 8, 30, 24, 14}));
  EXPECT_EQ(load(spec).encode("   "), (Ids{}));  // Prepend does nothing to an empty string
}

TEST(TokenizerNormalizer, NfcComposesAndNfdDecomposes) {
  Json spec = bpe_spec({"e", "\xCC\x81", "\xC3\xA9"}, {});
  spec["normalizer"] = {{"type", "NFC"}};
  EXPECT_EQ(load(spec).encode("e\xCC\x81"), (Ids{2}));
  spec["normalizer"] = {{"type", "NFD"}};
  EXPECT_EQ(load(spec).encode("\xC3\xA9"), (Ids{0, 1}));
  Json ligature = bpe_spec({"f", "i"}, {});
  ligature["normalizer"] = {{"type", "NFKC"}};
  EXPECT_EQ(load(ligature).encode("\xEF\xAC\x81"), (Ids{0, 1}));  // U+FB01 LATIN SMALL LIGATURE FI
}

TEST(TokenizerPreTokenizer, MetaspaceFirstOnlyAtTextStart) {
  Json spec = bpe_spec(letters(), {});
  spec["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}, {"split", true}};
  spec["added_tokens"] = Json::array({added_token(31, "<s>", true)});
  Tokenizer tokenizer = load(spec);
  EXPECT_EQ(tokenizer.encode("ab c"), (Ids{30, 0, 1, 30, 2}));
  // After an added token the text no longer starts at offset 0: no ▁ is prepended.
  EXPECT_EQ(tokenizer.encode("<s>ab"), (Ids{31, 0, 1}));
  spec["pre_tokenizer"]["prepend_scheme"] = "always";
  EXPECT_EQ(load(spec).encode("<s>ab"), (Ids{31, 30, 0, 1}));
  spec["pre_tokenizer"]["prepend_scheme"] = "never";
  EXPECT_EQ(load(spec).encode("ab"), (Ids{0, 1}));
}

TEST(TokenizerPreTokenizer, SplitBehaviors) {
  // Merges would join "a-" / "-b" / "a-b" if the split left them together.
  Json spec = bpe_spec({"a", "b", "-", "a-", "-b", "a-b"}, {"a -", "- b", "a- b"});
  auto split = [&](const std::string& behavior, bool invert = false) {
    spec["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
    return load(spec).encode("a-b");
  };
  EXPECT_EQ(split("Removed"), (Ids{0, 1}));
  EXPECT_EQ(split("Isolated"), (Ids{0, 2, 1}));
  EXPECT_EQ(split("MergedWithPrevious"), (Ids{3, 1}));
  EXPECT_EQ(split("MergedWithNext"), (Ids{0, 4}));
  EXPECT_EQ(split("Contiguous"), (Ids{0, 2, 1}));
  EXPECT_EQ(split("Removed", /*invert=*/true), (Ids{2}));
}

TEST(TokenizerPreTokenizer, DigitsPunctuationWhitespace) {
  Json spec = bpe_spec({"1", "2", "12", "a", "!", "a!", " "}, {"1 2", "a !"});
  spec["pre_tokenizer"] = {{"type", "Digits"}, {"individual_digits", true}};
  EXPECT_EQ(load(spec).encode("12"), (Ids{0, 1}));
  spec["pre_tokenizer"]["individual_digits"] = false;
  EXPECT_EQ(load(spec).encode("12a!"), (Ids{2, 5}));
  spec["pre_tokenizer"] = {{"type", "Punctuation"}, {"behavior", "Isolated"}};
  EXPECT_EQ(load(spec).encode("a!"), (Ids{3, 4}));
  spec["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_EQ(load(spec).encode(" a! 12 "), (Ids{3, 4, 2}));
  spec["pre_tokenizer"] = {{"type", "WhitespaceSplit"}};
  EXPECT_EQ(load(spec).encode(" a! 12 "), (Ids{5, 2}));
}

TEST(TokenizerPreTokenizer, ByteLevelAddsPrefixSpacePerPiece) {
  // Ġ (U+0120) stands for the space byte.
  Json spec = bpe_spec({"\xC4\xA0", "a", "b", "\xC4\xA0" "a"}, {"\xC4\xA0 a"});
  spec["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  spec["added_tokens"] = Json::array({added_token(4, "<x>", true)});
  EXPECT_EQ(load(spec).encode("a<x>a"), (Ids{3, 4, 3}));
  spec["pre_tokenizer"]["add_prefix_space"] = false;
  EXPECT_EQ(load(spec).encode("a<x> a"), (Ids{1, 4, 3}));
}

// ---------------------------------------------------------------------------------------------
// Added tokens
// ---------------------------------------------------------------------------------------------

TEST(TokenizerAddedTokens, LongestMatchWinsAndSpecialTokensInTextAreRecognised) {
  Json spec = bpe_spec(letters(), {});
  spec["added_tokens"] = Json::array({added_token(31, "<a>", true), added_token(32, "<a><a>", false)});
  Tokenizer tokenizer = load(spec);
  EXPECT_EQ(tokenizer.encode("x<a><a><a>y"), (Ids{23, 32, 31, 24}));
  EXPECT_TRUE(tokenizer.is_special(31));
  EXPECT_FALSE(tokenizer.is_special(32));
  EXPECT_FALSE(tokenizer.is_special(0));
  EXPECT_EQ(tokenizer.vocab_size(), 33);
  EXPECT_EQ(tokenizer.token_id("<a><a>"), 32);
  EXPECT_EQ(tokenizer.token_id("q"), 16);
  EXPECT_FALSE(tokenizer.token_id("zz").has_value());
}

TEST(TokenizerAddedTokens, StripAndSingleWord) {
  Json spec = bpe_spec(letters(), {});
  Json mask = added_token(31, "<m>", true);
  mask["lstrip"] = true;
  mask["rstrip"] = true;
  Json word = added_token(32, "yo", false);
  word["single_word"] = true;
  spec["added_tokens"] = Json::array({mask, word});
  Tokenizer tokenizer = load(spec);
  EXPECT_EQ(tokenizer.encode("a  <m>  b"), (Ids{0, 31, 1}));
  EXPECT_EQ(tokenizer.encode("yo ayo"), (Ids{32, 26, 0, 24, 14}));
}

TEST(TokenizerAddedTokens, NormalizedTokensMatchAfterNormalization) {
  Json spec = bpe_spec(letters(), {});
  spec["normalizer"] = {{"type", "Lowercase"}};
  spec["added_tokens"] = Json::array({added_token(31, "HEY", false, /*normalized=*/true),
                                      added_token(32, "RAW", false, /*normalized=*/false)});
  Tokenizer tokenizer = load(spec);
  EXPECT_EQ(tokenizer.encode("xHeY"), (Ids{23, 31}));
  EXPECT_EQ(tokenizer.encode("RAW raw"), (Ids{32, 26, 17, 0, 22}));
  // Decoding gives the normalized text of a normalized added token, as HF does.
  EXPECT_EQ(tokenizer.decode(Ids{31, 32}), "hey RAW");
}

TEST(TokenizerAddedTokens, TokensAlreadyInTheVocabKeepTheirIds) {
  Json spec = bpe_spec({"<s>", "a"}, {});
  spec["added_tokens"] = Json::array({added_token(0, "<s>", true), added_token(2, "<new>", true)});
  Tokenizer tokenizer = load(spec);
  EXPECT_EQ(tokenizer.encode("a<s><new>"), (Ids{1, 0, 2}));
  EXPECT_EQ(tokenizer.decode(Ids{0, 1, 2}, /*skip_special_tokens=*/true), "a");
}

// ---------------------------------------------------------------------------------------------
// Post-processors
// ---------------------------------------------------------------------------------------------

TEST(TokenizerPostProcessor, TemplateOnlyWithSpecialTokens) {
  Json spec = bpe_spec(letters(), {});
  spec["added_tokens"] = Json::array({added_token(31, "<s>", true), added_token(32, "</s>", true)});
  spec["post_processor"] = {{"type", "Sequence"}, {"processors", {
      {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}},
      {{"type", "TemplateProcessing"},
       {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                   {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
       {"pair", Json::array()},
       {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {31}}, {"tokens", {"<s>"}}}},
                           {"</s>", {{"id", "</s>"}, {"ids", {32}}, {"tokens", {"</s>"}}}}}}}}}};
  Tokenizer tokenizer = load(spec);
  EXPECT_EQ(tokenizer.encode("ab"), (Ids{31, 0, 1, 32}));
  EXPECT_EQ(tokenizer.encode("ab", /*add_special_tokens=*/false), (Ids{0, 1}));
  EXPECT_EQ(tokenizer.encode(""), (Ids{31, 32}));
}

TEST(TokenizerPostProcessor, RobertaAddsClsAndSep) {
  Json spec = bpe_spec(letters(), {});
  spec["post_processor"] = {{"type", "RobertaProcessing"}, {"sep", {"!", 27}}, {"cls", {"H", 28}},
                            {"trim_offsets", true}, {"add_prefix_space", false}};
  EXPECT_EQ(load(spec).encode("a"), (Ids{28, 0, 27}));
  EXPECT_EQ(load(spec).encode("a", false), (Ids{0}));
}

// ---------------------------------------------------------------------------------------------
// Decoders and streaming
// ---------------------------------------------------------------------------------------------

Json spm_decoder() {
  return {{"type", "Sequence"}, {"decoders", {
      {{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
      {{"type", "ByteFallback"}}, {{"type", "Fuse"}}, {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
}

TEST(TokenizerDecoder, SentencePieceStyleChain) {
  Json spec = bpe_spec({"\xE2\x96\x81hi", "\xE2\x96\x81" "a", "<0xE6>", "<0x97>", "<0xA5>", "<0xFF>", "<s>"}, {});
  spec["decoder"] = spm_decoder();
  spec["added_tokens"] = Json::array({added_token(6, "<s>", true)});
  Tokenizer tokenizer = load(spec);
  EXPECT_EQ(tokenizer.decode(Ids{6, 0, 2, 3, 4, 1}), "<s> hi\xE6\x97\xA5 a");
  EXPECT_EQ(tokenizer.decode(Ids{6, 0, 2, 3, 4, 1}, /*skip_special_tokens=*/true), "hi\xE6\x97\xA5 a");
  // An invalid byte run becomes one U+FFFD per byte.
  EXPECT_EQ(tokenizer.decode(Ids{0, 2, 5}), "hi\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(tokenizer.decode(Ids{0, 999, -5}), "hi");  // unknown ids are skipped
}

TEST(TokenizerDecoder, MetaspaceDecoderDropsReplacementsOfFirstToken) {
  Json spec = bpe_spec({"\xE2\x96\x81hi", "\xE2\x96\x81" "a\xE2\x96\x81"}, {});
  spec["decoder"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}, {"split", true}};
  EXPECT_EQ(load(spec).decode(Ids{0, 1}), "hi a ");
  EXPECT_EQ(load(spec).decode(Ids{1, 0}), "a hi");
}

TEST(TokenizerDecoder, NoDecoderJoinsWithSpaces) {
  EXPECT_EQ(load(bpe_spec({"ab", "c"}, {})).decode(Ids{0, 1, 0}), "ab c ab");
}

TEST(TokenizerDecoder, ByteLevelInvalidUtf8BecomesReplacement) {
  Json spec = bpe_spec({"\xC3\xA6", "a"}, {});
  spec["decoder"] = {{"type", "ByteLevel"}};
  // 'æ' (U+00E6) stands for byte 0xE6: alone it is an incomplete sequence.
  EXPECT_EQ(load(spec).decode(Ids{0, 1}), "\xEF\xBF\xBD" "a");
}

TEST(TokenizerStreaming, HoldsBackIncompleteCharacters) {
  Json spec = bpe_spec({"\xE2\x96\x81hi", "\xE2\x96\x81" "a", "<0xE6>", "<0x97>", "<0xA5>"}, {});
  spec["decoder"] = spm_decoder();
  Tokenizer tokenizer = load(spec);
  StreamingDecoder stream(tokenizer);
  EXPECT_EQ(stream.push(0), "hi");
  EXPECT_EQ(stream.push(1), " a");  // the Strip decoder does not eat this space: context is kept
  EXPECT_EQ(stream.push(2), "");
  EXPECT_EQ(stream.push(3), "");
  EXPECT_EQ(stream.push(4), "\xE6\x97\xA5");
  EXPECT_EQ(stream.push(2), "");
  EXPECT_EQ(stream.finish(), "\xEF\xBF\xBD");
}

// ---------------------------------------------------------------------------------------------
// Input that is not valid UTF-8
// ---------------------------------------------------------------------------------------------

TEST(TokenizerEncode, InvalidUtf8IsReplacedNotFatal) {
  Json spec = bpe_spec({"a", "\xEF\xBF\xBD"}, {});
  EXPECT_EQ(load(spec).encode("a\xFF\xFE" "a"), (Ids{0, 1, 1, 0}));
  EXPECT_EQ(load(spec).encode(std::string("a\0a", 3)), (Ids{0, 0}));  // NUL has no token: dropped
}

// ---------------------------------------------------------------------------------------------
// Load errors name the field and what was expected
// ---------------------------------------------------------------------------------------------

void expect_error_mentions(const Json& spec, const std::vector<std::string>& fragments) {
  const std::string message = load_error(spec);
  for (const std::string& fragment : fragments) {
    EXPECT_NE(message.find(fragment), std::string::npos) << "message: " << message << "\nmissing: " << fragment;
  }
}

TEST(TokenizerLoadErrors, InvalidJsonNamesTheSource) {
  Expected<Tokenizer> tokenizer = Tokenizer::from_json("{\"model\": ", "tok.json");
  ASSERT_FALSE(tokenizer.has_value());
  EXPECT_NE(tokenizer.status().message().find("tok.json:1:11: not valid JSON"), std::string::npos);
  Expected<Tokenizer> missing = Tokenizer::load("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.status().message().find("/nonexistent/tokenizer.json"), std::string::npos);
}

TEST(TokenizerLoadErrors, MissingOrUnsupportedModel) {
  Json spec = bpe_spec({"a"}, {});
  spec.erase("model");
  expect_error_mentions(spec, {"tok.json", "model: missing"});
  spec = bpe_spec({"a"}, {});
  spec["model"]["type"] = "WordPiece";
  expect_error_mentions(spec, {"model.type", "\"WordPiece\"", "only BPE"});
  spec = bpe_spec({"a"}, {});
  spec["model"]["dropout"] = 0.1;
  expect_error_mentions(spec, {"model.dropout", "not supported"});
  spec = bpe_spec({"a"}, {});
  spec["model"].erase("merges");
  expect_error_mentions(spec, {"model.merges: missing"});
}

TEST(TokenizerLoadErrors, UnknownStageTypesNameTheField) {
  Json spec = bpe_spec({"a"}, {});
  spec["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "BertNormalizer"}}}}};
  expect_error_mentions(spec, {"normalizer.normalizers[1].type", "\"BertNormalizer\""});
  spec = bpe_spec({"a"}, {});
  spec["pre_tokenizer"] = {{"type", "UnicodeScripts"}};
  expect_error_mentions(spec, {"pre_tokenizer.type", "\"UnicodeScripts\""});
  spec = bpe_spec({"a"}, {});
  spec["decoder"] = {{"type", "WordPiece"}, {"prefix", "##"}};
  expect_error_mentions(spec, {"decoder.type", "\"WordPiece\""});
  spec = bpe_spec({"a"}, {});
  spec["post_processor"] = {{"type", "Mystery"}};
  expect_error_mentions(spec, {"post_processor.type", "\"Mystery\""});
  spec = bpe_spec({"a"}, {});
  spec["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(a"}}}, {"behavior", "Isolated"}, {"invert", false}};
  expect_error_mentions(spec, {"pre_tokenizer.pattern.Regex", "(a"});
  spec["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", "a"}}}, {"behavior", "Sideways"}, {"invert", false}};
  expect_error_mentions(spec, {"pre_tokenizer.behavior", "Sideways"});
}

TEST(TokenizerLoadErrors, BadVocabAndMerges) {
  expect_error_mentions(bpe_spec({"a", "b"}, {"a c"}), {"model.merges[0]", "\"c\" is not in model.vocab"});
  Json ranks = bpe_spec({"a", "b", "ab"}, {"a b"});
  ranks["model"]["merge_ranks"] = Json::array({0, 1});
  expect_error_mentions(ranks, {"model.merge_ranks", "one rank per merge (1)"});
  ranks["model"]["merge_ranks"] = Json::array({-1});
  expect_error_mentions(ranks, {"model.merge_ranks[0]", "expected a rank"});
  expect_error_mentions(bpe_spec({"a", "b"}, {"a b"}), {"model.merges[0]", "merged token \"ab\""});
  expect_error_mentions(bpe_spec({"a", "b"}, {"a b c"}), {"model.merges[0]", "two tokens"});
  Json spec = bpe_spec({"a", "b"}, {});
  spec["model"]["vocab"]["b"] = 0;
  expect_error_mentions(spec, {"model.vocab", "id 0", "\"a\"", "\"b\""});
  spec = bpe_spec({"a"}, {});
  spec["model"]["vocab"]["a"] = -1;
  expect_error_mentions(spec, {"model.vocab.\"a\"", "out of range"});
  spec["model"]["vocab"]["a"] = "zero";
  expect_error_mentions(spec, {"model.vocab.\"a\"", "expected an integer"});
}

TEST(TokenizerLoadErrors, AddedTokenIdsThatCollide) {
  Json spec = bpe_spec({"a", "b"}, {});
  spec["added_tokens"] = Json::array({added_token(1, "<x>", true)});  // 1 is "b"
  expect_error_mentions(spec, {"added_tokens[0].id", "\"<x>\"", "id 1", "id 2"});
  spec["added_tokens"] = Json::array({added_token(2, "<x>", true), added_token(2, "<y>", true)});
  expect_error_mentions(spec, {"added_tokens[1].id", "\"<y>\""});
  spec["added_tokens"] = Json::array({added_token(0, "b", true)});  // "b" is id 1 in the vocab
  expect_error_mentions(spec, {"added_tokens[0].id", "\"b\""});
  spec["added_tokens"] = Json::array({{{"id", 2}, {"special", true}}});
  expect_error_mentions(spec, {"added_tokens[0].content: missing"});
}

TEST(TokenizerLoadErrors, UnsupportedTopLevelOptionsAndNesting) {
  Json spec = bpe_spec({"a"}, {});
  spec["truncation"] = {{"max_length", 8}};
  expect_error_mentions(spec, {"truncation", "must be null"});
  spec = bpe_spec({"a"}, {});
  Json nested = {{"type", "Lowercase"}};
  for (int i = 0; i < 100; ++i) nested = {{"type", "Sequence"}, {"normalizers", Json::array({nested})}};
  spec["normalizer"] = nested;
  expect_error_mentions(spec, {"nested deeper"});
  expect_error_mentions(Json::array({1, 2}), {"top level"});
}

// The fuzzer's seeds must be valid tokenizers, or the fuzzer never gets past loading.
TEST(TokenizerFuzzSeeds, AllLoad) {
  const std::filesystem::path seeds = std::filesystem::path(slimkv::test::source_dir()) / "fuzz/corpus/tokenizer_json_fuzz";
  if (!std::filesystem::is_directory(seeds)) GTEST_SKIP() << "no seeds at " << seeds;
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(seeds)) {
    Expected<Tokenizer> tokenizer = Tokenizer::load(entry.path().string());
    EXPECT_TRUE(tokenizer.has_value()) << tokenizer.status().message();
    if (tokenizer.has_value()) {
      EXPECT_FALSE(tokenizer->encode("Hello the world 12!").empty()) << entry.path();
    }
    ++count;
  }
  EXPECT_GE(count, 4);
}

}  // namespace
}  // namespace slimkv
