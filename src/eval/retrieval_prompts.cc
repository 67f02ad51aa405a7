#include "eval/retrieval_prompts.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

namespace slimkv {
namespace {

constexpr std::string_view kClassicFiller =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";
constexpr std::string_view kPasskeyHeader =
    "There is an important pass key hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz "
    "you about the pass key.\n\n";
constexpr std::string_view kRecordsHeader = "Here is a list of records. Each line gives a key and its value.\n";

// A key or value: uniform in [10^e, 10^7) with e uniform in 2..6, as the bundled model's training
// draws them (mostly 7 digits; a model that learned that length answers shorter numbers with more).
std::string random_number(SeededRng& rng) {
  int64_t low = 1;
  for (int64_t e = rng.uniform_int(2, 6); e > 0; --e) low *= 10;
  return std::to_string(rng.uniform_int(low, 9'999'999));
}

std::string random_record_key(SeededRng& rng) {
  constexpr std::string_view kAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::string key(size_t(rng.uniform_int(5, 8)), ' ');
  for (char& c : key) c = kAlphabet[size_t(rng.uniform_int(0, int64_t(kAlphabet.size()) - 1))];
  return key;
}

void append(std::vector<int32_t>& out, const std::vector<int32_t>& piece) { out.insert(out.end(), piece.begin(), piece.end()); }

size_t skip_space(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  return i;
}

}  // namespace

const char* placement_name(QuestionPlacement placement) {
  return placement == QuestionPlacement::kAfter ? "after" : "before";
}

RetrievalPrompts::RetrievalPrompts(const Tokenizer& tokenizer, std::optional<int32_t> bos,
                                   std::span<const int32_t> natural_filler)
    : tokenizer_(tokenizer), bos_(bos), classic_(encode(kClassicFiller)), natural_(natural_filler) {}

std::vector<int32_t> RetrievalPrompts::filler(size_t tokens, SeededRng& rng) const {
  const std::span<const int32_t> source = natural_.empty() ? std::span<const int32_t>(classic_) : natural_;
  // Natural text starts anywhere (wrapping at its end); the classic period starts at its beginning.
  size_t offset = natural_.empty() ? 0 : size_t(rng.uniform_int(0, int64_t(source.size()) - 1));
  std::vector<int32_t> fill(tokens);
  for (int32_t& token : fill) token = source[offset++ % source.size()];
  return fill;
}

std::vector<int32_t> RetrievalPrompts::start() const { return bos_ ? std::vector<int32_t>{*bos_} : std::vector<int32_t>{}; }

int RetrievalPrompts::min_length() const {
  const std::string key = "1234567";
  return int(start().size() + encode("Question: What is the pass key? Read the text below, then answer.\n\n").size() +
             encode(kPasskeyHeader).size() + encode(" The pass key is " + key + ". Remember it. " + key + " is the pass key. ").size() +
             encode("\n\nWhat is the pass key? The pass key is").size() + encode(" " + key).size() + 16);
}

RetrievalSample RetrievalPrompts::passkey(int length, double depth, QuestionPlacement placement, SeededRng& rng) const {
  RetrievalSample sample;
  sample.answer = random_number(rng);
  const std::string& key = sample.answer;
  const auto needle = encode(" The pass key is " + key + ". Remember it. " + key + " is the pass key. ");
  std::vector<int32_t> head = start();
  std::vector<int32_t> question;
  if (placement == QuestionPlacement::kAfter) {
    append(head, encode(kPasskeyHeader));
    question = encode("\n\nWhat is the pass key? The pass key is");
  } else {
    append(head, encode("Question: What is the pass key? Read the text below, then answer.\n\n"));
    append(head, encode(kPasskeyHeader));
    question = encode("\n\nThe pass key is");
  }
  sample.answer_tokens = int(encode(" " + key).size());
  const int fill_tokens = std::max(16, length - int(head.size() + needle.size() + question.size()) - sample.answer_tokens);
  const std::vector<int32_t> fill = filler(size_t(fill_tokens), rng);
  const auto cut = fill.begin() + std::lround(std::clamp(depth, 0.0, 1.0) * double(fill.size()));

  sample.prompt = std::move(head);
  sample.prompt.insert(sample.prompt.end(), fill.begin(), cut);
  append(sample.prompt, needle);
  sample.prompt.insert(sample.prompt.end(), cut, fill.end());
  append(sample.prompt, question);
  return sample;
}

RetrievalSample RetrievalPrompts::kvret(int length, QuestionPlacement placement, SeededRng& rng) const {
  const auto question = [&](const std::string& key) {
    std::vector<int32_t> before, after;
    if (placement == QuestionPlacement::kBefore) before = encode("Look up " + key + ".\n");
    after = encode(placement == QuestionPlacement::kAfter ? "\nLook up " + key + ". The value of " + key + " is"
                                                          : "\nThe value of " + key + " is");
    return std::pair(before, after);
  };
  // Records fill what the header and the question leave, then the last ones (never the one asked
  // about) go until the question fits.
  const auto header = encode(kRecordsHeader);
  const int base = int(start().size() + header.size());
  std::vector<std::pair<std::string, std::string>> records;
  std::vector<std::vector<int32_t>> lines;
  std::set<std::string> keys;
  int used = base;
  while (true) {
    std::string key = random_record_key(rng);
    if (!keys.insert(key).second) continue;
    std::string value = random_number(rng);
    auto line = encode(key + " = " + value + "\n");
    if (used + int(line.size()) > length) break;
    used += int(line.size());
    lines.push_back(std::move(line));
    records.emplace_back(std::move(key), std::move(value));
  }
  if (records.empty()) records.emplace_back("abcde", "1234567"), lines.push_back(encode("abcde = 1234567\n"));  // below min_length()
  size_t asked = size_t(rng.uniform_int(0, int64_t(records.size()) - 1));
  const auto [key, value] = records[asked];
  RetrievalSample sample;
  sample.answer = value;
  sample.answer_tokens = int(encode(" " + value).size());
  const auto [before, after] = question(key);
  while (lines.size() > 1 && used + int(before.size() + after.size()) + sample.answer_tokens > length) {
    const size_t drop = lines.size() - 1 == asked ? asked - 1 : lines.size() - 1;
    used -= int(lines[drop].size());
    lines.erase(lines.begin() + ptrdiff_t(drop));
    if (drop < asked) --asked;
  }
  sample.prompt = start();
  append(sample.prompt, before);
  append(sample.prompt, header);
  for (const auto& line : lines) append(sample.prompt, line);
  append(sample.prompt, after);
  return sample;
}

bool answer_is_correct(std::string_view generated, std::string_view answer) {
  const std::string_view text = generated.substr(skip_space(generated));
  if (text.substr(0, answer.size()) != answer) return false;
  return text.size() == answer.size() || !std::isalnum(static_cast<unsigned char>(text[answer.size()]));
}

bool answer_still_possible(std::string_view generated, std::string_view answer) {
  const std::string_view text = generated.substr(skip_space(generated));
  if (text.size() < answer.size()) return answer.substr(0, text.size()) == text;
  return answer_is_correct(generated, answer);
}

}  // namespace slimkv
