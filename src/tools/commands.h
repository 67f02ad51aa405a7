// The `slimkv` subcommands. Each registers its options on the app and returns the function that runs
// it; options shared by several are declared once in CommonOptions.
#pragma once

#include <functional>
#include <string>

#include <CLI/CLI.hpp>

#include "slimkv/engine.h"

namespace slimkv {

struct CommonOptions {
  std::string model_dir;
  std::string kv_spec = "dense";
  std::string device = "cpu";
  int threads = 0;

  void add_to(CLI::App& command);
  EngineConfig engine_config() const;
};

using CommandRunner = std::function<Status()>;

CommandRunner add_calibrate_command(CLI::App& app);
CommandRunner add_generate_command(CLI::App& app);
CommandRunner add_logits_command(CLI::App& app);
CommandRunner add_tokenize_command(CLI::App& app);
CommandRunner add_eval_command(CLI::App& app);
CommandRunner add_serve_command(CLI::App& app);
CommandRunner add_router_command(CLI::App& app);

}  // namespace slimkv
