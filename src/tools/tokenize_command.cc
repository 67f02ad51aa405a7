// slimkv tokenize --model DIR|FILE.gguf (--text T | --file F): prints the token ids, comma-separated.
#include <cstdio>

#include "slimkv/tokenizer.h"
#include "tools/commands.h"
#include "slimkv/files.h"

namespace slimkv {

CommandRunner add_tokenize_command(CLI::App& app) {
  struct Options {
    std::string model_dir, text, file;
    bool no_special = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* command = app.add_subcommand("tokenize", "Print the token ids of a text (needs only DIR/tokenizer.json, or a GGUF file)");
  command->add_option("--model", options->model_dir, "directory holding tokenizer.json, or a GGUF file")->required();
  auto* text = command->add_option("--text", options->text, "the text");
  auto* file = command->add_option("--file", options->file, "a file holding the text");
  text->excludes(file);
  command->add_flag("--no-special-tokens", options->no_special, "do not add BOS/template tokens");
  return [options, text, file]() -> Status {
    if (text->count() == 0 && file->count() == 0) return error("give the text with --text or --file");
    std::string input = options->text;
    if (file->count()) {
      SLIMKV_ASSIGN_OR_RETURN(input, read_text_file(options->file));
    }
    SLIMKV_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::load_for_model(options->model_dir));
    const std::vector<int32_t> ids = tokenizer.encode(input, !options->no_special);
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) line += (i ? "," : "") + std::to_string(ids[i]);
    std::printf("%s\n", line.c_str());
    return Status::ok();
  };
}

}  // namespace slimkv
