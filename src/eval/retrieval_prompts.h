// The prompts of the retrieval tasks, built from token pieces exactly as the bundled model's training
// samples are (scripts/train/train.py, SyntheticSamples), so the tasks measure what the model learned:
//
// passkey  [BOS] header | filler ... " The pass key is N. Remember it. N is the pass key. " ... filler |
//          "\n\nWhat is the pass key? The pass key is"                       -> " N"
// kvret    [BOS] "Here is a list of records. Each line gives a key and its value.\n"
//          "k3j9x = 48213\n" ... (records until the length is used) |
//          "\nLook up k3j9x. The value of k3j9x is"                          -> " 48213"
//
// With the question placed "before", the question opens the prompt and only the cue that starts the
// answer ("The pass key is", "The value of KEY is") ends it. Prompt plus answer take `length` tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <span>
#include <string_view>
#include <vector>

#include "slimkv/tokenizer.h"
#include "util/random.h"

namespace slimkv {

enum class QuestionPlacement { kAfter, kBefore };
const char* placement_name(QuestionPlacement placement);

struct RetrievalSample {
  std::vector<int32_t> prompt;  // ends where the answer starts
  std::string answer;           // the key or value a correct continuation gives first (no space)
  int answer_tokens = 0;        // tokens of " " + answer
};

class RetrievalPrompts {
 public:
  // bos: prepended to every prompt when the model has one. natural_filler: encoded text that pass-key
  // filler is cut from (a span at a random offset per prompt, so the model must find the needle in
  // text it may never have seen); empty: the classic repeated sentences. Must outlive the prompts.
  RetrievalPrompts(const Tokenizer& tokenizer, std::optional<int32_t> bos, std::span<const int32_t> natural_filler = {});

  // depth: where the needle goes, 0 (start of the filler) .. 1 (end).
  RetrievalSample passkey(int length, double depth, QuestionPlacement placement, SeededRng& rng) const;
  RetrievalSample kvret(int length, QuestionPlacement placement, SeededRng& rng) const;

  // Tokens a prompt of `length` needs at least (question, needle, answer): shorter lengths are refused.
  int min_length() const;

 private:
  std::vector<int32_t> encode(std::string_view text) const { return tokenizer_.encode(text, false); }
  std::vector<int32_t> start() const;  // BOS or nothing

  std::vector<int32_t> filler(size_t tokens, SeededRng& rng) const;

  const Tokenizer& tokenizer_;
  std::optional<int32_t> bos_;
  std::vector<int32_t> classic_;  // one period of the classic filler
  std::span<const int32_t> natural_;
};

// Scoring a greedy continuation `generated` (text) against the expected key: leading whitespace is
// skipped, then the key must follow, not followed by another digit or letter ("52445." and
// "52445<eos>" are right, "524459" is wrong).
bool answer_is_correct(std::string_view generated, std::string_view answer);
// Whether more tokens could still make `generated` correct: generation stops early once not.
bool answer_still_possible(std::string_view generated, std::string_view answer);

}  // namespace slimkv
