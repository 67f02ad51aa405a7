// slimkv: an LLM inference engine whose KV cache is compressed, tiered and transferable.
#include <cstdio>
#include <string>
#include <vector>

#include "slimkv/device_name.h"
#include "slimkv/untrusted_text.h"
#include "tools/commands.h"

namespace slimkv {

void CommonOptions::add_to(CLI::App& command) {
  command.add_option("--model", model_dir, "Hugging Face model directory (config.json, *.safetensors)")->required();
  command.add_option("--kv", kv_spec, "KV cache spec, e.g. dense, dense:dtype=f16, hack:bits=4, zack:r=0.05+hack:bits=4")->capture_default_str();
  add_device_option(command, device, "cpu, or cuda / cuda:N for visible GPU N (a build with the CUDA backend)");
  command.add_option("--threads", threads, "worker threads (0 = every core)")->capture_default_str();
}

CLI::Option* add_device_option(CLI::App& command, std::string& device, const std::string& help) {
  return command.add_option("--device", device, help)
      ->check([](const std::string& name) {
        const Expected<DeviceName> parsed = parse_device_name(name);
        return parsed ? std::string() : parsed.status().message();
      })
      ->capture_default_str();
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
  // --dry-parse: check a command line against the options and stop before any work. The docs check
  // (scripts/check_docs.py) runs every command the docs quote this way, so a renamed flag fails a test.
  bool dry_parse = false;
  app.add_flag("--dry-parse", dry_parse, "parse and validate the command line, then exit without running it")
      ->group("");
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
  const int first = argc > 1 && std::string(argv[1]) == "--dry-parse" ? 2 : 1;  // the command's argv index
  bool known = false;
  std::string names;
  for (const auto& [command, run] : commands) {
    known = known || (argc > first && command->check_name(argv[first]));
    names += (names.empty() ? "" : ", ") + command->get_name();
  }
  if (argc > first && argv[first][0] != '-' && !known) {
    std::fprintf(stderr, "slimkv: unknown command %s (commands: %s; slimkv --help lists them)\n",
                 slimkv::quote_untrusted(argv[first]).c_str(), names.c_str());
    return 106;  // CLI11's exit code for a parse error
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& [command, run] : commands) {
    if (!command->parsed()) continue;
    if (dry_parse) return 0;
    const slimkv::Status status = run();
    if (!status.is_ok()) {
      std::fprintf(stderr, "slimkv %s: error: %s\n", command->get_name().c_str(), status.message().c_str());
      return 1;
    }
  }
  return 0;
}
