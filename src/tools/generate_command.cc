// slimkv generate --model DIR (--prompt TEXT | --prompt-file F) [--max-tokens N] [--temperature T]
//                 [--top-p P] [--top-k K] [--seed S] [--kv SPEC]
// Streams the continuation to stdout; prompt and decode speed and KV-cache size go to stderr.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "slimkv/generation.h"
#include "slimkv/tokenizer.h"
#include "tools/commands.h"
#include "slimkv/files.h"

namespace slimkv {

CommandRunner add_generate_command(CLI::App& app) {
  struct Options {
    CommonOptions common;
    std::string prompt, prompt_file;
    int max_tokens = 128;
    float temperature = -1.0f, top_p = -1.0f;  // negative: from generation_config.json, else greedy / 1
    int top_k = -1;
    uint64_t seed = 0;
  };
  auto options = std::make_shared<Options>();
  CLI::App* command = app.add_subcommand("generate", "Generate a continuation of a prompt");
  options->common.add_to(*command);
  auto* prompt = command->add_option("--prompt", options->prompt, "the prompt text");
  auto* prompt_file = command->add_option("--prompt-file", options->prompt_file, "a file holding the prompt");
  prompt->excludes(prompt_file);
  command->add_option("--max-tokens", options->max_tokens, "tokens to generate")
      ->check(CLI::Range(1, 1 << 24))->capture_default_str();
  command->add_option("--temperature", options->temperature, "0 = greedy (default: generation_config.json, else 0)")
      ->check(CLI::Range(0.0f, 100.0f));
  command->add_option("--top-p", options->top_p, "nucleus sampling mass (default: generation_config.json, else 1)")
      ->check(CLI::Range(0.0f, 1.0f));
  command->add_option("--top-k", options->top_k, "sample among the k most likely (0 = all)")->check(CLI::Range(0, 1 << 30));
  command->add_option("--seed", options->seed, "sampling seed")->capture_default_str();

  return [options, prompt, prompt_file]() -> Status {
    std::string text = options->prompt;
    if (prompt_file->count()) {
      SLIMKV_ASSIGN_OR_RETURN(text, read_text_file(options->prompt_file));
    } else if (!prompt->count()) {
      return error("give the prompt with --prompt or --prompt-file");
    }
    if (text.empty()) return error("the prompt is empty");
    SLIMKV_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::load(options->common.engine_config()));
    const Tokenizer* tokenizer = engine->tokenizer();
    if (!tokenizer) return error(options->common.model_dir, " has no tokenizer.json; generate needs one (logits takes ids)");
    GenerationRequest request;
    request.prompt = tokenizer->encode(text);
    if (request.prompt.empty()) return error("the prompt encodes to no tokens");
    request.max_tokens = options->max_tokens;
    const GenerationDefaults& defaults = engine->generation_defaults();
    request.sampling.temperature = options->temperature >= 0 ? options->temperature : defaults.temperature;
    request.sampling.top_k = options->top_k >= 0 ? options->top_k : defaults.top_k;
    request.sampling.top_p = options->top_p >= 0 ? options->top_p : defaults.top_p;
    request.sampling.seed = options->seed;
    SLIMKV_ASSIGN_OR_RETURN(Generation generation, Generation::start(*engine, std::move(request)));

    using Clock = std::chrono::steady_clock;
    const auto prefill_start = Clock::now();
    double prefill_s = 0;
    SLIMKV_ASSIGN_OR_RETURN(const SequenceId sequence, engine->add_sequence(generation.request().sampling));
    const Status status = generate(*engine, sequence, generation, [&](const Generation::Delta& delta) {
      if (prefill_s == 0) prefill_s = std::chrono::duration<double>(Clock::now() - prefill_start).count();
      std::fputs(delta.text.c_str(), stdout);
      std::fflush(stdout);
      return true;
    });
    SLIMKV_RETURN_IF_ERROR(status);
    std::fputs("\n", stdout);
    const double decode_s = std::chrono::duration<double>(Clock::now() - prefill_start).count() - prefill_s;
    const int generated = int(generation.generated().size());
    const FinishReason finish = *generation.finish_reason();
    const char* stop_reason = finish == FinishReason::kStop ? "end of sequence"
                              : generated < options->max_tokens ? "context full" : "max tokens";
    std::fprintf(stderr, "\n[slimkv] prompt: %zu tokens, %.1f tok/s | decode: %d tokens, %.1f tok/s (%s) | ",
                 generation.request().prompt.size(), double(generation.request().prompt.size()) / prefill_s, generated,
                 generated > 1 ? double(generated - 1) / decode_s : 0.0, stop_reason);
    if (engine->on_gpu()) {
      std::fprintf(stderr, "KV %s on the GPU\n", engine->kv_description().c_str());
      return Status::ok();
    }
    SLIMKV_ASSIGN_OR_RETURN(const KvMemory memory, engine->kv_memory(sequence));
    std::fprintf(stderr, "KV %s: %zu bytes sealed + %zu open, %.0f bytes/token sealed\n",
                 engine->kv_description().c_str(), memory.sealed_bytes, memory.open_bytes,
                 memory.sealed_bytes_per_token());
    if (const TierStats& tier = memory.tier; tier.hits + tier.misses > 0) {
      std::fprintf(stderr, "[slimkv] offload tier: block cache hit rate %.3f, %zu bytes moved, %zu written\n",
                   tier.hit_rate(), tier.bytes_moved, tier.bytes_written);
    }
    return Status::ok();
  };
}

}  // namespace slimkv
