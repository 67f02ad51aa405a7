// Disaggregated serving's overlap of the KV transfer with the prefill (issue 23): a prompt longer than
// one engine step is prefilled in chunks (--chunk tokens a step) by a prefill worker's engine while a
// second thread sends its KV pieces over the KV stream (loopback TCP, token-bucket cap) to a receiver,
// as `slimkv serve --role prefill` does. Two ways, side by side:
//   last-chunk:  only the step that finishes the prompt streams (each layer as computed, with every
//                earlier chunk's KV of that layer), as slimkv did before chunk streaming;
//   every-chunk: each step sends the blocks it sealed, layer by layer as computed (Engine::stream_sealed_kv).
// Prints, per spec, prompt length and cap, the median over --repeats of the prefill time and of the time
// from the prefill's end (its last step returned) to the receiver's DONE: what a decode worker waits
// after the prefill before it can start, with the ratio every-chunk / last-chunk.
//   bench_kv_stream_overlap --model DIR [--specs "dense:dtype=f16;hack:bits=2,pi=64"]
//                           [--prompt-tokens 4096,8192] [--chunk 512] [--gbps 1] [--repeats 3] [--threads 1]
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>

#include "slimkv/engine.h"
#include "slimkv/tokenizer.h"
#include "transfer/kv_stream.h"

namespace {

using namespace slimkv;
using Clock = std::chrono::steady_clock;

[[noreturn]] void stop_with(const std::string& message) {
  std::fprintf(stderr, "bench_kv_stream_overlap: %s\n", message.c_str());
  std::exit(1);
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// The pieces from the engine's thread to the sender's, then the end.
struct PieceQueue {
  std::mutex mutex;
  std::condition_variable ready;
  std::deque<KvTransferPiece> pieces;
  bool ended = false;
};

struct Timing {
  double prefill_s = 0, after_prefill_s = 0;
};

// One prompt through one engine: chunked prefill, KV streamed to `receiver` at `gbps`.
Timing run_once(Engine& engine, const KvStreamIdentity& identity, KvStreamReceiver& receiver,
                const std::vector<int32_t>& prompt, int chunk, double gbps, bool every_chunk, const std::string& id) {
  bool refused = false;
  auto sender = KvStreamSender::open("127.0.0.1:" + std::to_string(receiver.port()), identity, id, 0,
                                     {.bandwidth_gbps = gbps}, &refused);
  if (!sender) stop_with(sender.status().message());
  PieceQueue queue;
  Clock::time_point done;
  std::thread sending([&] {
    for (;;) {
      std::unique_lock lock(queue.mutex);
      queue.ready.wait(lock, [&] { return !queue.pieces.empty() || queue.ended; });
      if (queue.pieces.empty()) break;
      KvTransferPiece piece = std::move(queue.pieces.front());
      queue.pieces.pop_front();
      lock.unlock();
      if (const Status sent = (*sender)->send_piece(piece); !sent.is_ok()) stop_with(sent.message());
    }
    const KvStreamRequest request{.request_id = id, .attempt = 0, .prompt_token_ids = prompt, .resume_token_ids = {},
                                  .next_token = 1, .endpoint = "/v1/completions", .request = nlohmann::json::object()};
    if (const Status finished = (*sender)->finish(request); !finished.is_ok()) stop_with(finished.message());
    done = Clock::now();
  });
  const KvPieceCallback push = [&](KvTransferPiece piece) {
    std::lock_guard lock(queue.mutex);
    queue.pieces.push_back(std::move(piece));
    queue.ready.notify_one();
  };
  const SequenceId sequence = *engine.add_sequence();
  const Clock::time_point start = Clock::now();
  for (size_t first = 0; first < prompt.size(); first += size_t(chunk)) {
    const size_t n = std::min(size_t(chunk), prompt.size() - first);
    const bool last = first + n == prompt.size();
    const Status streaming = last ? engine.stream_kv_in_next_step(sequence, push)
                             : every_chunk ? engine.stream_sealed_kv(sequence, push) : Status::ok();
    if (!streaming.is_ok()) stop_with(streaming.message());
    const StepItem item{sequence, std::span<const int32_t>(prompt).subspan(first, n), last ? StepOutput::kSample : StepOutput::kNone};
    StepResult result;
    if (const Status stepped = engine.step({&item, 1}, result); !stepped.is_ok()) stop_with(stepped.message());
  }
  const Clock::time_point prefilled = Clock::now();
  {
    std::lock_guard lock(queue.mutex);
    queue.ended = true;
    queue.ready.notify_one();
  }
  sending.join();
  (void)engine.remove_sequence(sequence);
  if (!receiver.wait_for(id, std::chrono::seconds(10))) stop_with("the receiver does not hold stream " + id);
  return {std::chrono::duration<double>(prefilled - start).count(), std::chrono::duration<double>(done - prefilled).count()};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("KV stream overlapped with a chunked prefill: the wait after the prefill, last-chunk vs every-chunk streaming");
  std::string model;
  std::vector<std::string> specs = {"dense:dtype=f16", "hack:bits=2,pi=64"};
  std::vector<int> lengths = {4096, 8192};
  std::vector<double> gbps = {1};
  int chunk = 512, repeats = 3, threads = 1;
  app.add_option("--model", model, "model directory (with tokenizer.json and heldout.txt)")->required();
  app.add_option("--specs", specs, "KV specs, ';'-separated")->delimiter(';');
  app.add_option("--prompt-tokens", lengths, "prompt lengths (tokens of the model's heldout.txt), ','-separated")->delimiter(',');
  app.add_option("--chunk", chunk, "tokens an engine step runs (slimkv serve --prefill-chunk-tokens)");
  app.add_option("--gbps", gbps, "bandwidth caps in Gbit/s, ','-separated (0: uncapped)")->delimiter(',');
  app.add_option("--repeats", repeats, "timed runs of each way (alternating, after one warm-up); medians printed");
  app.add_option("--threads", threads, "engine threads for the prefill");
  CLI11_PARSE(app, argc, argv);

  std::ifstream file(model + "/heldout.txt");
  std::stringstream text;
  text << file.rdbuf();
  std::printf("%-20s %7s %6s %11s %11s %11s %11s %8s\n", "spec", "tokens", "Gbit/s", "prefill s", "last-chunk",
              "every-chunk", "prefill s", "ratio");
  std::printf("%-20s %7s %6s %11s %11s %11s %11s %8s\n", "", "", "", "(last)", "wait s", "wait s", "(every)", "wait");
  for (const std::string& spec : specs) {
    auto engine = Engine::load({.model_dir = model, .kv_spec = spec, .threads = threads, .prefill_chunk_tokens = chunk,
                                .max_sequences = 2});
    if (!engine) stop_with(engine.status().message());
    if (!(*engine)->tokenizer()) stop_with(model + " has no tokenizer.json");
    const std::vector<int32_t> all = (*engine)->tokenizer()->encode(text.str());
    Expected<KvStreamIdentity> identity = engine_kv_identity(**engine);
    if (!identity) stop_with(identity.status().message());
    auto receiver = KvStreamReceiver::start(*identity, {.port = 0, .max_tokens = (*engine)->context_tokens()});
    if (!receiver) stop_with(receiver.status().message());
    int serial = 0;
    for (const int length : lengths) {
      if (size_t(length) > all.size()) stop_with("heldout.txt holds fewer tokens than --prompt-tokens");
      const std::vector<int32_t> prompt(all.begin(), all.begin() + length);
      for (const double cap : gbps) {
        std::vector<double> prefill[2], wait[2];
        for (int r = -1; r < repeats; ++r) {
          for (int way = 0; way < 2; ++way) {
            const int alternating = r % 2 == 0 ? way : 1 - way;  // the order alternates: load drifts on a shared machine
            const Timing t = run_once(**engine, *identity, **receiver, prompt, chunk, cap, alternating == 1,
                                      "s" + std::to_string(serial++));
            if (r < 0) continue;  // warm-up
            prefill[alternating].push_back(t.prefill_s);
            wait[alternating].push_back(t.after_prefill_s);
          }
        }
        std::printf("%-20s %7d %6g %11.3f %11.3f %11.3f %11.3f %8.3f\n", spec.c_str(), length, cap, median(prefill[0]),
                    median(wait[0]), median(wait[1]), median(prefill[1]), median(wait[1]) / median(wait[0]));
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
