// The engine's step API on the CPU (issue 21): B sequences decoding at a context depth, run as one
// batched step (every row through each weight matrix together, then each sequence's attention over its
// own KV) vs B steps of one sequence each (what Session::decode_batch did before the step API). Both
// sides decode the same tokens from the same prefilled KV; the table prints tokens/s and the ratio.
//   bench_step --model DIR [--specs "dense;hack:bits=2,pi=64"] [--batches 1,4,16] [--depth 1024]
//              [--steps 16] [--threads 2] [--sides both|batched|one-by-one]
// --sides picks one side alone (for a profile of its decode: the other side's prefill then is not run).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <CLI/CLI.hpp>

#include "slimkv/engine.h"
#include "slimkv/tokenizer.h"

namespace {

using namespace slimkv;
using Clock = std::chrono::steady_clock;

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, separator);) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "bench_step: %s\n", message.c_str());
  std::exit(1);
}

// Decode tokens/s of `batch` sequences at `depth`, batched (one step of all) or one step per sequence.
double decode_rate(Engine& engine, const std::vector<int32_t>& text, int batch, int depth, int steps, bool batched) {
  std::vector<SequenceId> ids;
  StepResult result;
  for (int b = 0; b < batch; ++b) {
    auto id = engine.add_sequence();
    if (!id) fail(id.status().message());
    ids.push_back(*id);
    // Each sequence a different window of the text, prefilled in chunks.
    const auto prompt = std::span(text).subspan(size_t(b * 37), size_t(depth));
    for (size_t first = 0; first < prompt.size(); first += size_t(engine.config().prefill_chunk_tokens)) {
      const auto part = prompt.subspan(first, std::min(size_t(engine.config().prefill_chunk_tokens), prompt.size() - first));
      const StepItem item{*id, part, StepOutput::kNone};
      if (Status status = engine.step(std::span(&item, 1), result); !status) fail(status.message());
    }
  }
  std::vector<int32_t> next(static_cast<size_t>(batch));
  for (int b = 0; b < batch; ++b) next[size_t(b)] = text[size_t(b * 37 + depth)];
  const auto start = Clock::now();
  for (int s = 0; s < steps; ++s) {
    std::vector<StepItem> items;
    for (int b = 0; b < batch; ++b) items.push_back({ids[size_t(b)], std::span(&next[size_t(b)], 1), StepOutput::kSample});
    if (batched) {
      if (Status status = engine.step(items, result); !status) fail(status.message());
      for (int b = 0; b < batch; ++b) next[size_t(b)] = result.tokens[size_t(b)];
    } else {
      for (int b = 0; b < batch; ++b) {
        if (Status status = engine.step(std::span(&items[size_t(b)], 1), result); !status) fail(status.message());
        next[size_t(b)] = result.tokens[0];
      }
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (SequenceId id : ids) (void)engine.remove_sequence(id);
  return double(batch) * steps / seconds;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("decode tokens/s of B sequences: one batched step vs one step per sequence");
  std::string model_dir, specs = "dense;hack:bits=2,pi=64", batches = "1,4,16";
  std::string sides = "both";
  int depth = 1024, steps = 16, threads = 2;
  app.add_option("--model", model_dir, "model directory (its heldout.txt or passkey_prompt.txt is the text)")->required();
  app.add_option("--specs", specs, "KV specs, ';'-separated")->capture_default_str();
  app.add_option("--batches", batches, "sequences decoding together, ','-separated")->capture_default_str();
  app.add_option("--depth", depth, "tokens each sequence holds before decoding")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--steps", steps, "decode steps timed")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  app.add_option("--threads", threads, "worker threads")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--sides", sides, "which sides to run")
      ->check(CLI::IsMember({"both", "batched", "one-by-one"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::printf("%-22s %6s %6s %14s %14s %8s\n", "spec", "batch", "depth", "batched tok/s", "one-by-one", "ratio");
  for (const std::string& spec : split(specs, ';')) {
    EngineConfig config;
    config.model_dir = model_dir;
    config.kv_spec = spec;
    config.threads = threads;
    config.max_sequences = 64;
    auto engine = Engine::load(config);
    if (!engine) fail(engine.status().message());
    std::ifstream in(model_dir + "/heldout.txt");
    if (!in) in.open(model_dir + "/passkey_prompt.txt");
    std::stringstream text;
    text << in.rdbuf();
    const std::vector<int32_t> ids = (*engine)->tokenizer()->encode(text.str());
    for (const std::string& batch_text : split(batches, ',')) {
      const int batch = std::stoi(batch_text);
      if (size_t(batch * 37 + depth + 1) > ids.size()) fail(str_cat("the text has ", ids.size(), " tokens: too few for batch ", batch, " at depth ", depth));
      // Alternating, so that neither side runs on a warmer machine.
      const double one_by_one = sides == "batched" ? 0.0 : decode_rate(**engine, ids, batch, depth, steps, false);
      const double batched = sides == "one-by-one" ? 0.0 : decode_rate(**engine, ids, batch, depth, steps, true);
      std::printf("%-22s %6d %6d %14.1f %14.1f %7.2fx\n", spec.c_str(), batch, depth, batched, one_by_one, batched / one_by_one);
      std::fflush(stdout);
    }
  }
  return 0;
}
