// Loading and decoding a model on the CPU, for GGUF files beside safetensors directories (issue 29):
// per model, in this process (so run one model per process for a clean resident-memory figure):
// load time (Engine::load: map, validate, check every weight finite), resident memory after load and
// after decoding (VmRSS; mapped weight pages count once touched), and decode tokens/s of one sequence
// after a short prompt (`--threads`, default 2). One row per model; `--json` adds a JSON line.
//   bench_gguf --model FILE.gguf [--model DIR ...] [--prompt 16] [--decode 32] [--threads 2]
// bench/gguf_speed.sh runs it beside llama.cpp's llama-bench on the same files.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "model/model_config.h"
#include "slimkv/engine.h"

namespace {

using namespace slimkv;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// This process's resident set in GiB (VmRSS of /proc/self/status).
double resident_gib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / (1024.0 * 1024.0);
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("slimkv GGUF / safetensors load and CPU decode");
  std::vector<std::string> models;
  int prompt = 16, decode = 32, threads = 2;
  bool json = false;
  app.add_option("--model", models, "GGUF file or model directory (repeatable)")->required();
  app.add_option("--prompt", prompt, "prompt tokens before decoding");
  app.add_option("--decode", decode, "decode steps timed");
  app.add_option("--threads", threads, "CPU threads");
  app.add_flag("--json", json, "also print a JSON line per model");
  CLI11_PARSE(app, argc, argv);

  std::printf("| model | load s | RSS after load GiB | RSS after decode GiB | decode tok/s (%d threads) |\n", threads);
  std::printf("|---|---:|---:|---:|---:|\n");
  for (const std::string& model : models) {
    EngineConfig config;
    config.model_dir = model;
    config.threads = threads;
    const auto start = Clock::now();
    auto engine = Engine::load(config);
    if (!engine) {
      std::fprintf(stderr, "bench_gguf: %s\n", engine.status().message().c_str());
      return 1;
    }
    const double load_seconds = seconds_since(start);
    const double rss_load = resident_gib();
    const int64_t vocab = (*engine)->model_config().vocab_size;
    std::vector<int32_t> tokens(static_cast<size_t>(prompt));
    for (int i = 0; i < prompt; ++i) tokens[size_t(i)] = int32_t((i * 7919 + 13) % vocab);
    auto session = (*engine)->new_session();
    if (auto logits = session->prefill(tokens, false); !logits) {
      std::fprintf(stderr, "bench_gguf: %s\n", logits.status().message().c_str());
      return 1;
    }
    // One untimed step, then `decode` timed ones (each feeds the previous position's token id).
    if (auto row = session->decode(1); !row) return 1;
    const auto decode_start = Clock::now();
    for (int i = 0; i < decode; ++i) {
      if (auto row = session->decode(int32_t((i * 31 + 5) % vocab)); !row) return 1;
    }
    const double rate = decode / seconds_since(decode_start);
    const double rss_decode = resident_gib();
    std::printf("| %s | %.2f | %.2f | %.2f | %.2f |\n", model.c_str(), load_seconds, rss_load, rss_decode, rate);
    if (json) {
      std::printf("{\"model\": \"%s\", \"load_s\": %.3f, \"rss_load_gib\": %.3f, \"rss_decode_gib\": %.3f, "
                  "\"decode_tok_s\": %.3f, \"threads\": %d}\n",
                  model.c_str(), load_seconds, rss_load, rss_decode, rate, threads);
    }
    std::fflush(stdout);
  }
  return 0;
}
