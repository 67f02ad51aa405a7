// passkey and kvret: retrieval prompts (eval/retrieval_prompts.h) on a grid of lengths (and depths),
// with the question after the context and, separately, before it; a prompt counts as answered when the
// greedy continuation gives the key (answer_is_correct). The prompts are built once from the seed, so
// every spec answers the same ones.
#pragma once

#include <functional>

#include "slimkv/evaluation.h"
#include "eval/retrieval_prompts.h"

namespace slimkv {

struct RetrievalCase {
  RetrievalSample sample;
  int length = 0;
  std::optional<double> depth;  // passkey only
  QuestionPlacement placement = QuestionPlacement::kAfter;
};

// The grid: lengths context/4, /2, 3/4 and all of it (those that fit a prompt), depths 0..1 in
// quarters (passkey), both placements, `samples` prompts per cell (kvret: per length and placement).
std::vector<RetrievalCase> passkey_cases(const RetrievalPrompts& prompts, int context_tokens, int samples, uint64_t seed);
std::vector<RetrievalCase> kvret_cases(const RetrievalPrompts& prompts, int context_tokens, int samples, uint64_t seed);

// Whatever answers a prompt: returns the text it continues it with.
using RetrievalAnswerer = std::function<Expected<std::string>(const RetrievalSample&)>;

// Scores the cases with one answerer and adds the accuracy rows of `spec`: one per grid cell, one per
// placement and the overall mean.
Status score_retrieval(const std::vector<RetrievalCase>& cases, const std::string& task, const std::string& spec,
                       const RetrievalAnswerer& answerer, Progress& progress, EvalResults& results);

}  // namespace slimkv
