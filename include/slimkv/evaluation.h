// slimkv eval: every task for every KV spec in one run, the same way for every spec, into one long
// table of results (slimkv/eval_results.h) written as results.json, results.md and PNG plots.
// The tasks and how each is scored: docs/eval.md.
//
//   auto evaluation = Evaluation::prepare(settings);   // checks everything, loads an engine per spec
//   (*evaluation)->run(progress);                      // the work
//   (*evaluation)->write(out_dir);
#pragma once

#include <cstdint>
#include <memory>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "slimkv/eval_progress.h"
#include "slimkv/eval_results.h"
#include "slimkv/engine.h"
#include "slimkv/tokenizer.h"

namespace slimkv {

struct EvalSettings {
  std::string model_dir;
  std::vector<std::string> specs;  // KV specs; "dense", the reference, is added first when absent
  std::vector<std::string> tasks;  // names from eval_task_names()
  int context_tokens = 0;          // 0: the model's context length
  int samples = 0;                 // every task's sample count; 0: each task's default (docs/eval.md)
  std::map<std::string, int> task_samples;  // per-task counts, over `samples`
  uint64_t seed = 0;
  std::string text_file;           // ppl/fidelity/memory/speed text, passkey's filler; "": MODEL/heldout.txt
  std::string filler = "text";     // passkey filler: "text" (cut from the text) or "classic" (repeated sentences)
  int threads = 0;                 // 0: every core
  bool plots = true;               // PNG plots (needs gnuplot)
  std::string device = "cpu";      // or "cuda": every spec's engine on the GPU (ppl, passkey, kvret, speed)
};

std::vector<std::string> eval_task_names();

// `slimkv eval --samples`' text into settings.samples and settings.task_samples: "N" for every task,
// "task=N" for one, or a comma-separated mix ("2,ppl=8"). Errors name the item that is neither.
Status parse_eval_samples(const std::string& text, EvalSettings& settings);

struct EvalSubject {
  std::string spec;  // as written
  std::unique_ptr<Engine> engine;
};

// What a task works with. subjects[0] is the reference (dense); tasks run every subject on the same
// inputs and add their rows to `results`.
struct EvalContext {
  const EvalSettings& settings;
  const std::vector<EvalSubject>& subjects;
  const Tokenizer& tokenizer;
  std::optional<int32_t> bos;       // prepended to every sequence when the model has one
  const std::vector<int32_t>& text;  // the evaluation text, encoded without special tokens
  int context_tokens;
  int samples;                      // this task's count: task_samples, samples, or the task's default
  Progress& progress;
  EvalResults& results;

  // The first `n` tokens of the text, after BOS: a prefix every subject runs the same way.
  std::vector<int32_t> text_prefix(int n) const;
};

class Evaluation {
 public:
  // Checks the settings (specs, tasks, context, text, gnuplot) and loads an engine per spec: every
  // error comes here, before any work, naming the bad part.
  static Expected<std::unique_ptr<Evaluation>> prepare(const EvalSettings& settings);

  Status run(Progress& progress);
  // results.json, results.md and, with settings.plots, the PNG plots.
  Status write(const std::string& out_dir) const;

  const EvalResults& results() const { return results_; }
  const std::vector<EvalSubject>& subjects() const { return subjects_; }

 private:
  explicit Evaluation(EvalSettings settings) : settings_(std::move(settings)) {}
  nlohmann::json to_json() const;

  int samples_of(const std::string& task) const;

  EvalSettings settings_;
  std::vector<EvalSubject> subjects_;
  std::vector<int32_t> text_;
  int context_tokens_ = 0;
  EvalResults results_;
};

}  // namespace slimkv
