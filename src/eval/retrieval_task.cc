#include "eval/retrieval_task.h"

#include <map>
#include <span>
#include <tuple>

#include "eval/tasks.h"
#include "slimkv/generation.h"
#include "model/model_config.h"
#include "util/random.h"

namespace slimkv {
namespace {

constexpr QuestionPlacement kPlacements[] = {QuestionPlacement::kAfter, QuestionPlacement::kBefore};

std::vector<int> grid_lengths(const RetrievalPrompts& prompts, int context_tokens) {
  std::vector<int> lengths;
  for (int quarter = 1; quarter <= 4; ++quarter) {
    const int length = context_tokens * quarter / 4;
    if (length >= prompts.min_length() && (lengths.empty() || lengths.back() != length)) lengths.push_back(length);
  }
  return lengths;
}

// The model's greedy continuation (the engine's generation loop), stopped as soon as it cannot be right
// any more, at an end-of-sequence token, or once it is longer than the answer.
Expected<std::string> greedy_answer(Engine& engine, const RetrievalSample& sample) {
  GenerationRequest request;
  request.prompt = sample.prompt;
  request.max_tokens = sample.answer_tokens + 2;
  SLIMKV_ASSIGN_OR_RETURN(Generation generation, Generation::start(engine, std::move(request)));
  SLIMKV_ASSIGN_OR_RETURN(const SequenceId sequence, engine.add_sequence());
  std::string text;
  const Status status = generate(engine, sequence, generation, [&](const Generation::Delta& delta) {
    text += delta.text;
    const size_t leading = text.find_first_not_of(" \t\n\r");
    return answer_still_possible(text, sample.answer) &&
           (leading == std::string::npos || text.size() - leading <= sample.answer.size());
  });
  SLIMKV_RETURN_IF_ERROR(engine.remove_sequence(sequence));
  SLIMKV_RETURN_IF_ERROR(status);
  return text;
}

Status run_retrieval_task(EvalContext& context, const std::string& task, const std::vector<RetrievalCase>& cases) {
  for (const EvalSubject& subject : context.subjects) {
    context.progress.start(str_cat(task, ": ", subject.spec, ", ", cases.size(), " prompts"), int64_t(cases.size()));
    const RetrievalAnswerer answerer = [&](const RetrievalSample& sample) { return greedy_answer(*subject.engine, sample); };
    SLIMKV_RETURN_IF_ERROR(score_retrieval(cases, task, subject.spec, answerer, context.progress, context.results));
    context.progress.finish();
  }
  return Status::ok();
}

}  // namespace

std::vector<RetrievalCase> passkey_cases(const RetrievalPrompts& prompts, int context_tokens, int samples, uint64_t seed) {
  SeededRng rng(splitmix64(seed ^ 0x7061737365ull));  // "passe": independent of kvret's stream
  std::vector<RetrievalCase> cases;
  for (QuestionPlacement placement : kPlacements) {
    for (int length : grid_lengths(prompts, context_tokens)) {
      for (int quarter = 0; quarter <= 4; ++quarter) {
        const double depth = quarter / 4.0;
        for (int i = 0; i < samples; ++i) {
          cases.push_back({prompts.passkey(length, depth, placement, rng), length, depth, placement});
        }
      }
    }
  }
  return cases;
}

std::vector<RetrievalCase> kvret_cases(const RetrievalPrompts& prompts, int context_tokens, int samples, uint64_t seed) {
  SeededRng rng(splitmix64(seed ^ 0x6b76726574ull));  // "kvret"
  std::vector<RetrievalCase> cases;
  for (QuestionPlacement placement : kPlacements) {
    for (int length : grid_lengths(prompts, context_tokens)) {
      for (int i = 0; i < samples; ++i) cases.push_back({prompts.kvret(length, placement, rng), length, std::nullopt, placement});
    }
  }
  return cases;
}

Status score_retrieval(const std::vector<RetrievalCase>& cases, const std::string& task, const std::string& spec,
                       const RetrievalAnswerer& answerer, Progress& progress, EvalResults& results) {
  struct Tally {
    int right = 0, total = 0;
    void add(bool correct) { right += correct, total += 1; }
    double accuracy() const { return total ? double(right) / total : 0.0; }
  };
  using CellKey = std::tuple<int, int, double>;  // placement, length, depth (-1: none)
  std::map<CellKey, Tally> cells;
  std::map<int, Tally> by_placement;
  Tally overall;
  for (const RetrievalCase& c : cases) {
    SLIMKV_ASSIGN_OR_RETURN(const std::string answer, answerer(c.sample));
    const bool correct = answer_is_correct(answer, c.sample.answer);
    cells[{int(c.placement), c.length, c.depth.value_or(-1.0)}].add(correct);
    by_placement[int(c.placement)].add(correct);
    overall.add(correct);
    progress.advance();
  }
  for (const auto& [key, tally] : cells) {
    const auto& [placement, length, depth] = key;
    ResultRow& row = results.add(spec, task, "accuracy", tally.accuracy());
    row.length = length;
    if (depth >= 0) row.depth = depth;
    row.placement = placement_name(QuestionPlacement(placement));
  }
  for (const auto& [placement, tally] : by_placement) {
    results.add(spec, task, "accuracy", tally.accuracy()).placement = placement_name(QuestionPlacement(placement));
  }
  results.add(spec, task, "accuracy", overall.accuracy());
  return Status::ok();
}

Status run_passkey_task(EvalContext& context) {
  const bool natural = context.settings.filler == "text";
  const RetrievalPrompts prompts(context.tokenizer, context.bos, natural ? std::span<const int32_t>(context.text) : std::span<const int32_t>());
  return run_retrieval_task(context, "passkey", passkey_cases(prompts, context.context_tokens, context.samples, context.settings.seed));
}

Status run_kvret_task(EvalContext& context) {
  const RetrievalPrompts prompts(context.tokenizer, context.bos);
  return run_retrieval_task(context, "kvret", kvret_cases(prompts, context.context_tokens, context.samples, context.settings.seed));
}

}  // namespace slimkv
