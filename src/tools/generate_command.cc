// slimkv generate --model DIR (--prompt TEXT | --prompt-file F) [--max-tokens N] [--temperature T]
//                 [--top-p P] [--top-k K] [--seed S] [--kv SPEC]
// Streams the continuation to stdout; prompt and decode speed and KV-cache size go to stderr.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "engine/sampler.h"
#include "kv/store.h"
#include "model/model_config.h"
#include "tokenizer/tokenizer.h"
#include "tools/commands.h"
#include "util/mapped_file.h"

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
    const std::vector<int32_t> prompt_ids = tokenizer->encode(text);
    if (prompt_ids.empty()) return error("the prompt encodes to no tokens");
    auto session = engine->new_session();
    if (int64_t(prompt_ids.size()) >= session->context_tokens()) {
      return error("the prompt has ", prompt_ids.size(), " tokens; the model's context holds ", session->context_tokens(),
                   " (prompt plus at least one generated token)");
    }

    const GenerationDefaults& defaults = engine->generation_defaults();
    SamplerConfig sampling;
    sampling.temperature = options->temperature >= 0 ? options->temperature : defaults.temperature;
    sampling.top_k = options->top_k >= 0 ? options->top_k : defaults.top_k;
    sampling.top_p = options->top_p >= 0 ? options->top_p : defaults.top_p;
    sampling.seed = options->seed;
    Sampler sampler(sampling);

    using Clock = std::chrono::steady_clock;
    const auto prefill_start = Clock::now();
    SLIMKV_ASSIGN_OR_RETURN(std::vector<float> logits, session->prefill(prompt_ids));
    const double prefill_s = std::chrono::duration<double>(Clock::now() - prefill_start).count();

    StreamingDecoder stream(*tokenizer);
    const int budget = std::min<int>(options->max_tokens, session->context_tokens() - session->num_tokens());
    int generated = 0;
    const auto decode_start = Clock::now();
    std::string stop_reason = "max tokens";
    while (true) {
      const int32_t next = sampler.sample(logits);
      ++generated;
      const bool eos = std::find(defaults.eos_token_ids.begin(), defaults.eos_token_ids.end(), next) !=
                       defaults.eos_token_ids.end();
      if (eos) {
        stop_reason = "end of sequence";
        break;
      }
      std::fputs(stream.push(next).c_str(), stdout);
      std::fflush(stdout);
      if (generated >= budget) {
        if (budget < options->max_tokens) stop_reason = "context full";
        break;
      }
      SLIMKV_ASSIGN_OR_RETURN(logits, session->decode(next));
    }
    std::fputs(stream.finish().c_str(), stdout);
    std::fputs("\n", stdout);
    const double decode_s = std::chrono::duration<double>(Clock::now() - decode_start).count();
    std::fprintf(stderr, "\n[slimkv] prompt: %zu tokens, %.1f tok/s | decode: %d tokens, %.1f tok/s (%s) | ",
                 prompt_ids.size(), double(prompt_ids.size()) / prefill_s, generated,
                 generated > 1 ? double(generated - 1) / decode_s : 0.0, stop_reason.c_str());
    if (session->on_gpu()) {
      std::fprintf(stderr, "KV %s on the GPU (FP16 blocks)\n", engine->kv_description().c_str());
      return Status::ok();
    }
    const KvMemory memory = session->kv().memory();
    std::fprintf(stderr, "KV %s: %zu bytes sealed + %zu open, %.0f bytes/token sealed\n",
                 engine->kv_description().c_str(), memory.sealed_bytes, memory.open_bytes,
                 memory.sealed_bytes_per_token());
    if (const TierStats tier = session->kv().tier_stats(); tier.hits + tier.misses > 0) {
      std::fprintf(stderr, "[slimkv] offload tier: block cache hit rate %.3f, %zu bytes moved, %zu written\n",
                   tier.hit_rate(), tier.bytes_moved, tier.bytes_written);
    }
    return Status::ok();
  };
}

}  // namespace slimkv
