// slimkv eval --model DIR --kv SPEC[,SPEC...] --tasks TASK[,TASK...] [--context N] [--samples N] [--seed S]
//             [--text FILE] [--filler text|classic] [--threads N] [--device cpu|cuda[:N]] [--no-plots] --out DIR
// Runs every task for every KV spec and writes DIR/results.json, DIR/results.md and PNG plots
// (slimkv/evaluation.h; the tasks are documented in docs/eval.md).
#include "slimkv/evaluation.h"
#include "tools/commands.h"
#include "slimkv/files.h"

namespace slimkv {
namespace {

// KV specs contain commas themselves (hack:bits=2,pi=64), so a comma starts a new spec only where the
// next piece has no '=' (a stage name, not an option): "dense,hack:bits=2,pi=64" is two specs.
std::vector<std::string> split_specs(const std::string& text) {
  std::vector<std::string> specs;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string piece = text.substr(start, end - start);
    const size_t next_colon = piece.find(':'), equals = piece.find('=');
    const bool is_option = equals != std::string::npos && (next_colon == std::string::npos || equals < next_colon);
    if (is_option && !specs.empty()) {
      specs.back() += "," + piece;
    } else {
      specs.push_back(piece);
    }
    start = end + 1;
  }
  return specs;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    parts.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

}  // namespace

CommandRunner add_eval_command(CLI::App& app) {
  struct Options {
    EvalSettings settings;
    std::string specs = "dense", tasks, out, samples = "0";
    bool no_plots = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* command = app.add_subcommand("eval", "Measure KV specs' quality, memory and speed: results.json, results.md, plots");
  command->add_option("--model", options->settings.model_dir, "Hugging Face model directory")->required();
  command->add_option("--kv", options->specs, "KV specs separated by commas, e.g. dense,hack:bits=2,pi=64,quant:bits=2")
      ->capture_default_str();
  command->add_option("--tasks", options->tasks, "tasks separated by commas: ppl,passkey,kvret,fidelity,memory,speed")
      ->required();
  command->add_option("--context", options->settings.context_tokens, "context length in tokens (0: the model's)")
      ->capture_default_str();
  command->add_option("--samples", options->samples,
                      "samples per task or grid cell: N for every task, task=N for one (e.g. 2,ppl=8); 0: defaults")
      ->capture_default_str();
  command->add_option("--seed", options->settings.seed, "seed of the retrieval prompts")->capture_default_str();
  command->add_option("--text", options->settings.text_file, "evaluation text (default: MODEL/heldout.txt)");
  command->add_option("--filler", options->settings.filler, "passkey filler: text (cut from --text) or classic")
      ->capture_default_str();
  command->add_option("--threads", options->settings.threads, "worker threads (0 = every core)")->capture_default_str();
  add_device_option(*command, options->settings.device, "cpu, or cuda / cuda:N for visible GPU N (tasks ppl, passkey, kvret, speed)");
  command->add_flag("--no-plots", options->no_plots, "skip the PNG plots (they need gnuplot)");
  command->add_option("--out", options->out, "output directory")->required();
  return [options]() -> Status {
    SLIMKV_RETURN_IF_ERROR(check_output_directory(options->out).with_context("--out"));  // before the work
    EvalSettings settings = options->settings;
    settings.specs = split_specs(options->specs);
    settings.tasks = split_list(options->tasks);
    settings.plots = !options->no_plots;
    SLIMKV_RETURN_IF_ERROR(parse_eval_samples(options->samples, settings).with_context("--samples"));
    SLIMKV_ASSIGN_OR_RETURN(std::unique_ptr<Evaluation> evaluation, Evaluation::prepare(settings));
    Progress progress = Progress::for_stderr();
    SLIMKV_RETURN_IF_ERROR(evaluation->run(progress));
    SLIMKV_RETURN_IF_ERROR(evaluation->write(options->out));
    std::fprintf(stderr, "eval: wrote %s/results.json and results.md\n", options->out.c_str());
    return Status::ok();
  };
}

}  // namespace slimkv
