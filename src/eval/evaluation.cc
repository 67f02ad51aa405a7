#include "slimkv/evaluation.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>

#include "eval/plots.h"
#include "eval/retrieval_prompts.h"
#include "eval/tasks.h"
#include "kv/kv_factory.h"
#include "model/model_config.h"
#include "util/atomic_file.h"
#include "util/mapped_file.h"
#include "util/thread_pool.h"

namespace slimkv {
namespace {

struct TaskInfo {
  const char* name;
  Status (*run)(EvalContext&);
  int default_samples;  // what one sample is differs by task: docs/eval.md
  bool needs_text;      // runs on the evaluation text
  bool needs_retrieval_length;
  bool runs_on_gpu;     // fidelity observes the forward pass and memory reads the CPU store: CPU only
};

constexpr TaskInfo kTasks[] = {
    {"ppl", run_ppl_task, 4, true, false, true},              // windows
    {"passkey", run_passkey_task, 2, false, true, true},      // prompts per (length, depth, placement)
    {"kvret", run_kvret_task, 8, false, true, true},          // prompts per (length, placement)
    {"fidelity", run_fidelity_task, 32, true, false, false},  // decode steps after the prefix
    {"memory", run_memory_task, 1, true, false, false},
    {"speed", run_speed_task, 3, true, false, true},  // repetitions (the median is reported)
};

const TaskInfo* find_task(const std::string& name) {
  for (const TaskInfo& task : kTasks) {
    if (name == task.name) return &task;
  }
  return nullptr;
}

bool program_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::string_view rest(path);
  while (!rest.empty()) {
    const size_t colon = rest.find(':');
    const std::filesystem::path candidate = std::filesystem::path(rest.substr(0, colon)) / name;
    std::error_code ignored;
    if (std::filesystem::is_regular_file(candidate, ignored)) return true;
    rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
  }
  return false;
}

std::string join(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (const std::string& part : parts) out += (out.empty() ? "" : separator) + part;
  return out;
}

}  // namespace

std::vector<std::string> eval_task_names() {
  std::vector<std::string> names;
  for (const TaskInfo& task : kTasks) names.emplace_back(task.name);
  return names;
}

Status parse_eval_samples(const std::string& text, EvalSettings& settings) {
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    start = comma + 1;
    const size_t equals = item.find('=');
    const std::string number = equals == std::string::npos ? item : item.substr(equals + 1);
    size_t used = 0;
    int count = -1;
    try {
      count = std::stoi(number, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != number.size() || count < 0) {
      return error("'", item, "' is not N or task=N with N a non-negative integer");
    }
    if (equals == std::string::npos) {
      settings.samples = count;
    } else {
      settings.task_samples[item.substr(0, equals)] = count;
    }
  }
  return Status::ok();
}

std::vector<int32_t> EvalContext::text_prefix(int n) const {
  std::vector<int32_t> ids;
  if (bos) ids.push_back(*bos);
  ids.insert(ids.end(), text.begin(), text.begin() + (n - int(ids.size())));
  return ids;
}

Expected<std::unique_ptr<Evaluation>> Evaluation::prepare(const EvalSettings& settings) {
  std::unique_ptr<Evaluation> evaluation(new Evaluation(settings));
  EvalSettings& s = evaluation->settings_;

  // Tasks and specs first: they need no model.
  if (s.tasks.empty()) return error("no tasks: give --tasks (known: ", join(eval_task_names(), ","), ")");
  bool needs_text = false, needs_retrieval_length = false;
  for (const std::string& name : s.tasks) {
    const TaskInfo* task = find_task(name);
    if (!task) return error("unknown task '", name, "' (known: ", join(eval_task_names(), ","), ")");
    if (std::count(s.tasks.begin(), s.tasks.end(), name) > 1) return error("task '", name, "' is given twice");
    if (s.device != "cpu" && !task->runs_on_gpu) {
      return error("task '", name, "' runs on --device cpu only (the GPU runs ppl, passkey, kvret and speed)");
    }
    needs_text |= task->needs_text;
    needs_retrieval_length |= task->needs_retrieval_length;
  }
  if (s.specs.empty()) return error("no KV specs: give --kv");
  SLIMKV_ASSIGN_OR_RETURN(const KvPipeline reference_pipeline, make_kv_pipeline("dense"));
  int reference = -1;
  for (size_t i = 0; i < s.specs.size(); ++i) {
    auto pipeline = make_kv_pipeline(s.specs[i]);
    if (!pipeline.has_value()) return error("--kv: ", pipeline.status().message());
    if (std::count(s.specs.begin(), s.specs.end(), s.specs[i]) > 1) return error("KV spec '", s.specs[i], "' is given twice");
    if (reference < 0 && pipeline->describe() == reference_pipeline.describe()) reference = int(i);
  }
  // The reference runs first: tasks compare every other spec with it.
  if (reference < 0) {
    s.specs.insert(s.specs.begin(), "dense");
  } else {
    std::rotate(s.specs.begin(), s.specs.begin() + reference, s.specs.begin() + reference + 1);
  }
  if (s.filler != "text" && s.filler != "classic") return error("--filler must be text or classic, got '", s.filler, "'");
  if (s.filler == "text" && std::count(s.tasks.begin(), s.tasks.end(), "passkey") > 0) needs_text = true;
  if (s.samples < 0) return error("--samples must be >= 0 (0: each task's default), got ", s.samples);
  for (const auto& [task, count] : s.task_samples) {
    if (std::count(s.tasks.begin(), s.tasks.end(), task) == 0) {
      return error("--samples names task '", task, "', which is not among --tasks (", join(s.tasks, ","), ")");
    }
    if (count < 1) return error("--samples ", task, "=", count, ": a task needs at least 1 sample");
  }
  if (s.threads < 0) return error("--threads must be >= 0 (0: every core), got ", s.threads);
  if (s.plots && !program_on_path("gnuplot")) {
    return error("the PNG plots need gnuplot, which is not on PATH: install it (Debian: apt-get install gnuplot-nox, "
                 "or `make deps`) or pass --no-plots");
  }

  // One engine per spec, all on one pool of workers: they run one at a time.
  const int threads = s.threads > 0 ? s.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  s.threads = threads;
  auto pool = std::make_shared<ThreadPool>(threads);
  for (const std::string& spec : s.specs) {
    EngineConfig config;
    config.model_dir = s.model_dir;
    config.kv_spec = spec;
    config.pool = pool;
    config.device = s.device;
    SLIMKV_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::load(config));
    if (!engine->tokenizer()) return error(s.model_dir, ": no tokenizer.json; slimkv eval needs the model's tokenizer");
    evaluation->subjects_.push_back({spec, std::move(engine)});
  }
  const Engine& engine = *evaluation->subjects_[0].engine;
  const int model_context = int(engine.model_config().max_position_embeddings);
  if (s.context_tokens < 0 || s.context_tokens > model_context) {
    return error("--context ", s.context_tokens, " is outside the model's context [1, ", model_context, "] (0: all of it)");
  }
  evaluation->context_tokens_ = s.context_tokens > 0 ? s.context_tokens : model_context;
  const int context = evaluation->context_tokens_;
  if (needs_retrieval_length) {
    const int min_length = RetrievalPrompts(*engine.tokenizer(), std::nullopt).min_length() + 1;
    if (context < min_length) {
      return error("--context ", context, " is too short for passkey/kvret prompts (at least ", min_length, " tokens)");
    }
  }
  if (context < 2) return error("--context must be at least 2 tokens, got ", context);

  if (needs_text) {
    if (s.text_file.empty()) s.text_file = s.model_dir + "/heldout.txt";
    SLIMKV_ASSIGN_OR_RETURN(const std::string text, read_text_file(s.text_file));
    evaluation->text_ = engine.tokenizer()->encode(text, /*add_special_tokens=*/false);
    if (int(evaluation->text_.size()) < context) {
      return error(s.text_file, ": ", evaluation->text_.size(), " tokens, fewer than the --context of ", context,
                   " that ppl/fidelity/memory/speed and passkey's filler use (give a longer --text or a shorter --context)");
    }
  }
  return evaluation;
}

Status Evaluation::run(Progress& progress) {
  const Engine& reference = *subjects_[0].engine;
  std::optional<int32_t> bos;
  if (reference.model_config().bos_token_id >= 0) bos = int32_t(reference.model_config().bos_token_id);
  for (const std::string& name : settings_.tasks) {
    const TaskInfo& task = *find_task(name);
    EvalContext context{settings_,
                        subjects_,
                        *reference.tokenizer(),
                        bos,
                        text_,
                        context_tokens_,
                        samples_of(name),
                        progress,
                        results_};
    SLIMKV_RETURN_IF_ERROR(task.run(context).with_context(str_cat("task ", name)));
  }
  return Status::ok();
}

int Evaluation::samples_of(const std::string& task) const {
  const auto found = settings_.task_samples.find(task);
  if (found != settings_.task_samples.end()) return found->second;
  return settings_.samples > 0 ? settings_.samples : find_task(task)->default_samples;
}

nlohmann::json Evaluation::to_json() const {
  nlohmann::json specs = nlohmann::json::array(), canonical = nlohmann::json::array(), rows = nlohmann::json::array();
  for (const EvalSubject& subject : subjects_) {
    specs.push_back(subject.spec);
    canonical.push_back(subject.engine->kv_description());
  }
  for (const ResultRow& row : results_.rows()) rows.push_back(row_to_json(row));
  nlohmann::json samples = nlohmann::json::object();
  for (const std::string& task : settings_.tasks) samples[task] = samples_of(task);
  const ModelConfig& model = subjects_[0].engine->model_config();
  return {{"model", settings_.model_dir},
          {"architecture", model.architecture_name},
          {"specs", specs},
          {"specs_canonical", canonical},
          {"reference", subjects_[0].spec},
          {"tasks", settings_.tasks},
          {"seed", settings_.seed},
          {"version", SLIMKV_VERSION},
          {"settings",
           {{"context", context_tokens_},
            {"samples", samples},
            {"text", settings_.text_file},
            {"filler", settings_.filler},
            {"threads", settings_.threads},
            {"device", settings_.device}}},
          {"results", rows}};
}

Status Evaluation::write(const std::string& out_dir) const {
  std::error_code failure;
  std::filesystem::create_directories(out_dir, failure);
  if (failure) return error(out_dir, ": cannot create the output directory: ", failure.message());
  const auto write_text = [](const std::string& path, const std::string& text) {
    return write_file_atomically(path, {std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size())});
  };
  SLIMKV_RETURN_IF_ERROR(write_text(out_dir + "/results.json", to_json().dump(1) + "\n"));

  std::vector<std::string> specs;
  for (const EvalSubject& subject : subjects_) specs.push_back(subject.spec);
  std::string samples;
  for (const std::string& task : settings_.tasks) samples += str_cat(samples.empty() ? "" : " ", task, "=", samples_of(task));
  const std::string markdown = str_cat(
      "# slimkv eval: ", settings_.model_dir, "\n\n", "Context ", context_tokens_, " tokens, seed ", settings_.seed,
      ", samples ", samples, ", slimkv ", SLIMKV_VERSION, ". Deltas in parentheses are against `", subjects_[0].spec,
      "` (percent; points for accuracy and ratios). Tasks and scoring: docs/eval.md.\n\n",
      results_markdown(results_, specs, subjects_[0].spec));
  SLIMKV_RETURN_IF_ERROR(write_text(out_dir + "/results.md", markdown));
  if (settings_.plots) SLIMKV_RETURN_IF_ERROR(write_plots(results_, specs, out_dir));
  return Status::ok();
}

}  // namespace slimkv
