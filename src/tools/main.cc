// slimkv: an LLM inference engine whose KV cache is compressed, tiered and transferable.
#include <cstdio>
#include <string>
#include <vector>

#include "slimkv/untrusted_text.h"
#include "tools/commands.h"

namespace slimkv {

void CommonOptions::add_to(CLI::App& command) {
  command.add_option("--model", model_dir, "Hugging Face model directory (config.json, *.safetensors)")->required();
  command.add_option("--kv", kv_spec, "KV cache spec, e.g. dense, dense:dtype=f16, hack:bits=4, zack:r=0.05+hack:bits=4")->capture_default_str();
  command.add_option("--device", device, "cpu, or cuda (a build with the CUDA backend and a usable GPU)")->capture_default_str();
  command.add_option("--threads", threads, "worker threads (0 = every core)")->capture_default_str();
}

EngineConfig CommonOptions::engine_config() const {
  EngineConfig config;
  config.model_dir = model_dir;
  config.kv_spec = kv_spec;
  config.device = device;
  config.threads = threads;
  return config;
}

}  // namespace slimkv

int main(int argc, char** argv) {
  CLI::App app{"slimkv: LLM inference with a compressed, tiered, transferable KV cache"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("slimkv ") + SLIMKV_VERSION);
  std::vector<std::pair<CLI::App*, slimkv::CommandRunner>> commands;
  const auto add = [&](slimkv::CommandRunner (*adder)(CLI::App&)) {
    const size_t before = app.get_subcommands({}).size();
    slimkv::CommandRunner runner = adder(app);
    commands.emplace_back(app.get_subcommands({})[before], std::move(runner));
  };
  add(slimkv::add_calibrate_command);
  add(slimkv::add_generate_command);
  add(slimkv::add_logits_command);
  add(slimkv::add_tokenize_command);
  add(slimkv::add_eval_command);
  add(slimkv::add_serve_command);
  add(slimkv::add_router_command);
  // CLI11 reports a mistyped command as "A subcommand is required"; name it and list the commands.
  bool known = false;
  std::string names;
  for (const auto& [command, run] : commands) {
    known = known || (argc > 1 && command->check_name(argv[1]));
    names += (names.empty() ? "" : ", ") + command->get_name();
  }
  if (argc > 1 && argv[1][0] != '-' && !known) {
    std::fprintf(stderr, "slimkv: unknown command %s (commands: %s; slimkv --help lists them)\n",
                 slimkv::quote_untrusted(argv[1]).c_str(), names.c_str());
    return 106;  // CLI11's exit code for a parse error
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& [command, run] : commands) {
    if (!command->parsed()) continue;
    const slimkv::Status status = run();
    if (!status.is_ok()) {
      std::fprintf(stderr, "slimkv %s: error: %s\n", command->get_name().c_str(), status.message().c_str());
      return 1;
    }
  }
  return 0;
}
