// slimkv calibrate --model DIR --text FILE [--tokens N] --out FILE [--compare FILE]
// Runs the model over the first N tokens of the text in windows of its context and writes the ZACK
// calibration (slimkv/zack_calibration.h): per layer and KV head, the Q–K and V–W_O rotations and singular
// values. --compare prints how far the rotations are from another calibration's (δ/ε, ZACK §4.3).
#include <algorithm>
#include <cstdio>

#include "slimkv/zack_calibration_run.h"
#include "slimkv/zack_ranks.h"
#include "slimkv/tokenizer.h"
#include "tools/commands.h"
#include "slimkv/files.h"

namespace slimkv {

CommandRunner add_calibrate_command(CLI::App& app) {
  struct Options {
    std::string model_dir, text, out, compare;
    int64_t tokens = 16384;
    int threads = 0;
  };
  auto options = std::make_shared<Options>();
  CLI::App* command = app.add_subcommand("calibrate", "Compute the ZACK calibration (SVD rotations) of a model");
  command->add_option("--model", options->model_dir, "Hugging Face model directory")->required();
  command->add_option("--text", options->text, "calibration text (plain UTF-8)")->required();
  command->add_option("--tokens", options->tokens, "tokens of the text to run (ZACK §6.6: >= 16K)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30))
      ->capture_default_str();
  command->add_option("--out", options->out, "the calibration file to write (safetensors)")->required();
  command->add_option("--compare", options->compare, "another calibration: print the rotations' δ/ε against it");
  command->add_option("--threads", options->threads, "worker threads (0 = every core)")->capture_default_str();
  return [options]() -> Status {
    // Input and output paths first: a bad one is reported before the model loads and the work runs.
    SLIMKV_RETURN_IF_ERROR(check_output_file(options->out).with_context("--out"));
    SLIMKV_ASSIGN_OR_RETURN(std::string text, read_text_file(options->text));
    SLIMKV_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                            Engine::load({.model_dir = options->model_dir, .threads = options->threads}));
    if (!engine->tokenizer()) return error(options->model_dir, ": no tokenizer.json to tokenize the text with");
    std::vector<int32_t> ids = engine->tokenizer()->encode(text);
    if (int64_t(ids.size()) < options->tokens) {
      return error(options->text, " has ", ids.size(), " tokens, fewer than --tokens ", options->tokens);
    }
    ids.resize(size_t(options->tokens));
    ZackCalibrationRun run;
    run.source = str_cat(options->text, " (first ", ids.size(), " tokens)");
    run.progress = [](int64_t done, int64_t all) {
      const int width = 40, filled = int(width * done / all);
      std::fprintf(stderr, "\rcalibrate [%.*s%*s] %lld / %lld tokens", filled, "########################################",
                   width - filled, "", static_cast<long long>(done), static_cast<long long>(all));
      if (done == all) std::fprintf(stderr, "\n");
    };
    SLIMKV_ASSIGN_OR_RETURN(ZackCalibration calibration, run_zack_calibration(*engine, ids, run));
    SLIMKV_RETURN_IF_ERROR(calibration.write(options->out));
    std::printf("wrote %s: %d layers x %d KV heads, head_dim %d, %lld tokens\n", options->out.c_str(),
                calibration.num_layers, calibration.num_kv_heads, calibration.head_dim,
                static_cast<long long>(calibration.calibration_tokens));
    // What r (Eq. 6) will give: the ranks' spread and the KV compression, before any quantization.
    std::printf("%8s %16s %16s %14s\n", "r", "K ranks min-max", "V ranks min-max", "compression");
    for (const double r : {0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5}) {
      const ZackRanks ranks = select_zack_ranks(calibration, r, r, 1);
      const auto [k_min, k_max] = std::minmax_element(ranks.k_ranks.begin(), ranks.k_ranks.end());
      const auto [v_min, v_max] = std::minmax_element(ranks.v_ranks.begin(), ranks.v_ranks.end());
      std::printf("%8.2f %9d - %4d %9d - %4d %14.3f\n", r, *k_min, *k_max, *v_min, *v_max, ranks.kv_compression());
    }
    if (!options->compare.empty()) {
      SLIMKV_ASSIGN_OR_RETURN(ZackCalibration other, ZackCalibration::load(options->compare));
      SLIMKV_ASSIGN_OR_RETURN(RotationAgreement agreement, compare_rotations(other, calibration));
      std::printf("against %s:\n  Q-K   eps %.4g delta %.4g (delta/eps %.1f%%), energy captured %.4f\n"
                  "  V-W_O eps %.4g delta %.4g (delta/eps %.1f%%), energy captured %.4f\n",
                  options->compare.c_str(), agreement.qk_epsilon, agreement.qk_delta,
                  100 * agreement.qk_delta / agreement.qk_epsilon, agreement.qk_energy_captured,
                  agreement.vw_epsilon, agreement.vw_delta, 100 * agreement.vw_delta / agreement.vw_epsilon,
                  agreement.vw_energy_captured);
    }
    return Status::ok();
  };
}

}  // namespace slimkv
