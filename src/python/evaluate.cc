// slimkv.evaluate (what `slimkv eval` runs, slimkv/evaluation.h) and slimkv.KvSpec (slimkv/kv_config.h).
#include <cstdio>
#include <map>
#include <variant>

#include <pybind11/stl.h>

#include "python/binding.h"
#include "slimkv/evaluation.h"
#include "slimkv/kv_config.h"

namespace slimkv::python {
namespace {

// A str is one item (one KV spec: specs hold commas themselves), or for tasks a comma-separated list as
// the CLI takes them; otherwise a sequence of str.
std::vector<std::string> as_list(const std::variant<std::string, std::vector<std::string>>& value, bool split_commas) {
  if (const auto* list = std::get_if<std::vector<std::string>>(&value)) return *list;
  const std::string& text = std::get<std::string>(value);
  if (!split_commas) return {text};
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    items.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return items;
}

// samples as `slimkv eval --samples` takes it (an int, {task: int}, or the CLI's own text such as "2,ppl=8"
// for a default and per-task counts), read by the CLI's parser: the same rules and messages.
using SamplesArgument = std::variant<int, std::string, std::map<std::string, int>>;

void parse_samples(const SamplesArgument& samples, EvalSettings& settings) {
  std::string text;
  if (const int* count = std::get_if<int>(&samples)) text = std::to_string(*count);
  if (const std::string* cli_text = std::get_if<std::string>(&samples)) text = *cli_text;
  if (const auto* counts = std::get_if<std::map<std::string, int>>(&samples)) {
    if (counts->empty()) return;  // no task named: every task's default
    for (const auto& [task, count] : *counts) {
      if (task.find_first_of(",=") != std::string::npos) {
        throw py::value_error("samples: '" + task + "' is not a task name");
      }
      text += (text.empty() ? "" : ",") + task + "=" + std::to_string(count);
    }
  }
  const Status parsed = parse_eval_samples(text, settings);
  if (!parsed.is_ok()) throw py::value_error(parsed.with_context("samples").message());
}

py::object to_python(const ResultRow& row) {
  py::dict out;  // every key present (None when the row has no such grid key): one DataFrame column each
  out["spec"] = row.spec;
  out["task"] = row.task;
  out["metric"] = row.metric;
  out["value"] = row.value;
  out["length"] = row.length ? py::object(py::int_(*row.length)) : py::none();
  out["depth"] = row.depth ? py::object(py::float_(*row.depth)) : py::none();
  out["layer"] = row.layer ? py::object(py::int_(*row.layer)) : py::none();
  out["placement"] = row.placement ? py::object(py::str(*row.placement)) : py::none();
  out["tier"] = row.tier ? py::object(py::str(*row.tier)) : py::none();
  return out;
}

// The progress bar on Python's sys.stderr, so that a notebook shows it (C's stderr goes to the kernel's
// log): a FILE whose writes take the GIL and call sys.stderr.write. Redrawn in place on a terminal or
// in a notebook (its output area takes carriage returns); plain lines elsewhere, as the CLI's.
class PythonStderr {
 public:
  PythonStderr() {
    cookie_io_functions_t io{};
    io.write = [](void*, const char* data, size_t size) -> ssize_t {
      py::gil_scoped_acquire gil;
      try {
        py::object stderr_ = py::module_::import("sys").attr("stderr");
        stderr_.attr("write")(py::str(data, size));
        stderr_.attr("flush")();
        return ssize_t(size);
      } catch (const py::error_already_set&) {
        return -1;  // sys.stderr closed or replaced by something without write(): the bar is lost, not the run
      }
    };
    file_ = fopencookie(nullptr, "w", io);
    const py::module_ sys = py::module_::import("sys");
    interactive_ = sys.attr("modules").contains("ipykernel") || sys.attr("stderr").attr("isatty")().cast<bool>();
  }
  ~PythonStderr() {
    if (file_) std::fclose(file_);
  }
  PythonStderr(const PythonStderr&) = delete;
  PythonStderr& operator=(const PythonStderr&) = delete;
  Progress progress() const { return file_ ? Progress(file_, interactive_) : Progress::for_stderr(); }

 private:
  std::FILE* file_ = nullptr;
  bool interactive_ = false;
};

py::object evaluate(const std::string& model, const std::variant<std::string, std::vector<std::string>>& specs,
                    const std::variant<std::string, std::vector<std::string>>& tasks, std::optional<int> context,
                    const std::optional<SamplesArgument>& samples,
                    std::optional<std::string> text, const std::string& device, int threads, uint64_t seed,
                    std::optional<std::string> out, bool plots, bool progress, bool dataframe) {
  EvalSettings settings;
  settings.model_dir = model;
  settings.specs = as_list(specs, false);
  settings.tasks = as_list(tasks, true);
  if (context && *context < 0) throw py::value_error("context must be >= 0 (0: the model's), got " + std::to_string(*context));
  settings.context_tokens = context.value_or(0);
  if (samples) parse_samples(*samples, settings);
  settings.text_file = text.value_or("");
  settings.device = device;
  if (threads < 0) throw py::value_error("threads must be >= 0 (0: every core), got " + std::to_string(threads));
  settings.threads = threads;
  settings.seed = seed;
  if (plots && !out) throw py::value_error("plots=True writes PNG files into out: give out a directory");
  settings.plots = plots;
  std::unique_ptr<Evaluation> evaluation;
  const PythonStderr stderr_;
  {
    py::gil_scoped_release release;
    evaluation = value_or_throw(Evaluation::prepare(settings));
    Progress bar = progress ? stderr_.progress() : Progress::silent();
    throw_if_error(evaluation->run(bar));
    if (out) throw_if_error(evaluation->write(*out));
  }
  py::list rows;
  for (const ResultRow& row : evaluation->results().rows()) rows.append(to_python(row));
  if (dataframe) {
    try {
      return py::module_::import("pandas").attr("DataFrame")(rows);
    } catch (const py::error_already_set& missing) {
      if (!missing.matches(PyExc_ImportError)) throw;
    }
  }
  return rows;
}

// slimkv.KvSpec: a spec parsed (the grammar) and checked whole without a model (canonical_kv_spec).
struct KvSpec {
  KvConfig config;
  std::string canonical;
};

}  // namespace

void bind_evaluate(py::module_& module) {
  module.def("evaluate", &evaluate, py::arg("model"), py::arg("specs"), py::arg("tasks"), py::kw_only(),
             py::arg("context") = py::none(), py::arg("samples") = py::none(), py::arg("text") = py::none(),
             py::arg("device") = "cpu", py::arg("threads") = 0, py::arg("seed") = 0, py::arg("out") = py::none(),
             py::arg("plots") = false, py::arg("progress") = true, py::arg("dataframe") = true,
             "Runs `slimkv eval`: every task for every KV spec (dense, the reference, first). Returns the long "
             "table of results (spec, task, metric, value, length, depth, layer, placement, tier) as a pandas "
             "DataFrame when pandas imports and dataframe=True, else a list of dicts. samples: an int for every "
             "task, a dict {task: count}, or the CLI's text ('2,ppl=8': 2 for every task, 8 for ppl); out: a "
             "directory for results.json and results.md (and, with plots=True, the CLI's PNG plots: gnuplot); "
             "progress: the CLI's bar, on sys.stderr.");

  py::class_<KvSpec>(module, "KvSpec", "A KV spec string, parsed and checked (slimkv/kv_config.h)")
      .def(py::init([](const std::string& spec) {
             KvSpec out{value_or_throw(parse_kv_spec(spec)), {}};
             out.canonical = value_or_throw(canonical_kv_spec(spec));
             return out;
           }),
           py::arg("spec"))
      .def_property_readonly("spec", [](const KvSpec& spec) { return spec.config.spec; }, "as written")
      .def_property_readonly("canonical", [](const KvSpec& spec) { return spec.canonical; },
                             "every option spelled out: equal for specs that run the same pipeline")
      .def_property_readonly("stages", [](const KvSpec& spec) {
        py::list stages;
        for (const KvStage& stage : spec.config.stages) {
          py::dict options;
          for (const auto& [key, value] : stage.options) options[py::str(key)] = value;
          stages.append(py::make_tuple(stage.name, options));
        }
        return stages;
      }, "[(name, {option: value}), ...] in the order written")
      .def_property_readonly("tier", [](const KvSpec& spec) { return spec.config.tier.name; })
      .def("__str__", [](const KvSpec& spec) { return spec.canonical; })
      .def("__repr__", [](const KvSpec& spec) { return "KvSpec('" + spec.canonical + "')"; })
      .def("__eq__", [](const KvSpec& a, const KvSpec& b) { return a.canonical == b.canonical; });
}

}  // namespace slimkv::python
