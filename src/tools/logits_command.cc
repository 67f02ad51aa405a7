// slimkv logits --model DIR (--tokens 1,2,3 | --tokens-file F) --out FILE.npy [--mode prefill|incremental]
// Writes float32 logits [n_tokens, vocab]. `prefill` runs every token in one call; `incremental` feeds
// them one at a time through the KV cache, the decode path.
#include "tools/commands.h"
#include "slimkv/files.h"
#include "slimkv/npy.h"
#include "slimkv/token_ids.h"

namespace slimkv {

CommandRunner add_logits_command(CLI::App& app) {
  struct Options {
    CommonOptions common;
    std::string tokens, tokens_file, out, mode = "prefill";
  };
  auto options = std::make_shared<Options>();
  CLI::App* command = app.add_subcommand("logits", "Write the logits of a token sequence as float32 .npy [n, vocab]");
  options->common.add_to(*command);
  auto* tokens = command->add_option("--tokens", options->tokens, "token ids, e.g. 1,2,3");
  auto* tokens_file = command->add_option("--tokens-file", options->tokens_file, "file of token ids (commas/whitespace)");
  tokens->excludes(tokens_file);
  command->add_option("--out", options->out, "output .npy file")->required();
  command->add_option("--mode", options->mode, "prefill: all tokens at once; incremental: one by one through the KV cache")
      ->check(CLI::IsMember({"prefill", "incremental"}))
      ->capture_default_str();
  return [options, tokens, tokens_file]() -> Status {
    SLIMKV_RETURN_IF_ERROR(check_output_file(options->out).with_context("--out"));  // before the work
    std::vector<int32_t> ids;
    if (tokens->count()) {
      SLIMKV_ASSIGN_OR_RETURN(ids, parse_token_ids(options->tokens, "--tokens"));
    } else if (tokens_file->count()) {
      SLIMKV_ASSIGN_OR_RETURN(std::string text, read_text_file(options->tokens_file));
      SLIMKV_ASSIGN_OR_RETURN(ids, parse_token_ids(text, options->tokens_file));
    } else {
      return error("give the token ids with --tokens or --tokens-file");
    }
    SLIMKV_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::load(options->common.engine_config()));
    const int64_t vocab = engine->vocab_size();
    auto session = engine->new_session();
    std::vector<float> logits;
    if (options->mode == "prefill") {
      SLIMKV_ASSIGN_OR_RETURN(logits, session->prefill(ids, /*all_logits=*/true));
    } else {
      for (int32_t id : ids) {
        SLIMKV_ASSIGN_OR_RETURN(std::vector<float> row, session->decode(id));
        logits.insert(logits.end(), row.begin(), row.end());
      }
    }
    return write_npy_f32(options->out, logits.data(), {int64_t(ids.size()), vocab});
  };
}

}  // namespace slimkv
