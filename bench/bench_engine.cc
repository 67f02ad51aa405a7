// End-to-end benchmark: prefill and decode tokens/s of the engine on a model, for several KV specs
// side by side (ratios against the first).
//   bench_engine --model DIR [--kv dense,dense:dtype=f16] [--prompt-tokens 512] [--decode-tokens 64]
#include <chrono>
#include <cstdio>
#include <random>

#include <CLI/CLI.hpp>

#include "kv/store.h"
#include "model/model_config.h"
#include "slimkv/engine.h"

int main(int argc, char** argv) {
  CLI::App app{"slimkv end-to-end benchmark: prefill and decode tokens/s per KV spec"};
  std::string model_dir;
  std::vector<std::string> specs = {"dense", "dense:dtype=f16"};
  int prompt_tokens = 512, decode_tokens = 64, threads = 2, repeats = 3;
  app.add_option("--model", model_dir, "model directory")->required();
  app.add_option("--kv", specs, "KV specs to compare, separated by ; (specs contain commas)")->delimiter(';')->capture_default_str();
  app.add_option("--prompt-tokens", prompt_tokens, "prompt length")->capture_default_str();
  app.add_option("--decode-tokens", decode_tokens, "tokens decoded after the prompt")->capture_default_str();
  app.add_option("--threads", threads, "threads")->capture_default_str();
  app.add_option("--repeats", repeats, "runs per spec; the best is reported")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::printf("%-28s %14s %14s %16s %10s %10s\n", "kv spec", "prefill tok/s", "decode tok/s", "KV bytes/token",
              "prefill x", "decode x");
  double base_prefill = 0, base_decode = 0;
  for (const std::string& spec : specs) {
    slimkv::EngineConfig config;
    config.model_dir = model_dir;
    config.kv_spec = spec;
    config.threads = threads;
    auto engine = slimkv::Engine::load(config);
    if (!engine) {
      std::fprintf(stderr, "bench_engine: %s\n", engine.status().message().c_str());
      return 1;
    }
    const int64_t vocab = (*engine)->model_config().vocab_size;
    std::mt19937 rng(1);
    std::vector<int32_t> prompt(static_cast<size_t>(prompt_tokens));
    for (int32_t& id : prompt) id = int32_t(rng() % uint64_t(vocab));
    double best_prefill = 0, best_decode = 0, bytes_per_token = 0;
    for (int r = 0; r < repeats; ++r) {
      auto session = (*engine)->new_session();
      using Clock = std::chrono::steady_clock;
      const auto t0 = Clock::now();
      auto logits = session->prefill(prompt);
      const auto t1 = Clock::now();
      for (int i = 0; i < decode_tokens && logits; ++i) logits = session->decode(int32_t(i % vocab));
      const auto t2 = Clock::now();
      if (!logits) {
        std::fprintf(stderr, "bench_engine: %s\n", logits.status().message().c_str());
        return 1;
      }
      best_prefill = std::max(best_prefill, prompt_tokens / std::chrono::duration<double>(t1 - t0).count());
      best_decode = std::max(best_decode, decode_tokens / std::chrono::duration<double>(t2 - t1).count());
      bytes_per_token = session->kv().memory().sealed_bytes_per_token();
    }
    if (base_prefill == 0) {
      base_prefill = best_prefill;
      base_decode = best_decode;
    }
    std::printf("%-28s %14.1f %14.1f %16.0f %10.2f %10.2f\n", spec.c_str(), best_prefill, best_decode, bytes_per_token,
                best_prefill / base_prefill, best_decode / base_decode);
  }
  return 0;
}
