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

// --device: cpu, cuda or cuda:N (visible GPU N), refused as the command line is parsed (under --dry-parse
// too) with slimkv/device_name.h's message; whether GPU N is there the engine asks before loading.
CLI::Option* add_device_option(CLI::App& command, std::string& device, const std::string& help);

using CommandRunner = std::function<Status()>;

CommandRunner add_calibrate_command(CLI::App& app);
CommandRunner add_generate_command(CLI::App& app);
CommandRunner add_logits_command(CLI::App& app);
CommandRunner add_tokenize_command(CLI::App& app);
CommandRunner add_eval_command(CLI::App& app);
CommandRunner add_serve_command(CLI::App& app);
CommandRunner add_router_command(CLI::App& app);

}  // namespace slimkv
