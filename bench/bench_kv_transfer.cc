// Disaggregated serving's transfer (issue 23; HACK §6): one prompt's KV sent from a prefill worker to a
// decode worker over the KV stream (src/transfer/, TCP on loopback), per KV spec: the bytes on the wire
// per prompt token (frames, handshake and trailer included) with the ratio to dense:dtype=f16, and the
// time from connecting to the receiver's DONE at each token-bucket cap (the link-bandwidth-bound regimes
// of the paper on one machine; 0 = uncapped, whatever loopback and the CRCs allow).
//   bench_kv_transfer --model DIR [--specs "dense:dtype=f16;hack:bits=4;hack:bits=2,pi=64"]
//                     [--prompt-tokens 2048] [--gbps 1,10,25,100,0] [--repeats 5] [--threads 2]
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <CLI/CLI.hpp>

#include "slimkv/engine.h"
#include "slimkv/tokenizer.h"
#include "transfer/kv_stream.h"

namespace {

using namespace slimkv;

// Ends the benchmark with `message` (an error of the setup, not a measurement).
[[noreturn]] void stop_with(const std::string& message) {
  std::fprintf(stderr, "bench_kv_transfer: %s\n", message.c_str());
  std::exit(1);
}

struct Row {
  std::string spec;
  size_t transfer_bytes = 0, wire_bytes = 0;
  std::vector<double> seconds;  // median per cap
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("KV stream: bytes on the wire per prompt token and transfer time per bandwidth cap");
  std::string model;
  std::vector<std::string> specs = {"dense:dtype=f16", "hack:bits=4", "hack:bits=2,pi=64"};
  std::vector<double> gbps = {1, 10, 25, 100, 0};
  int prompt_tokens = 2048, repeats = 5, threads = 2;
  app.add_option("--model", model, "model directory (with tokenizer.json and heldout.txt)")->required();
  app.add_option("--specs", specs, "KV specs, ';'-separated; the first is the ratios' base")->delimiter(';');
  app.add_option("--prompt-tokens", prompt_tokens, "prompt length (tokens of the model's heldout.txt)");
  app.add_option("--gbps", gbps, "bandwidth caps in Gbit/s, ','-separated (0: uncapped)")->delimiter(',');
  app.add_option("--repeats", repeats, "timed sends per cap (after one warm-up); the median is printed");
  app.add_option("--threads", threads, "engine threads for the prefill");
  CLI11_PARSE(app, argc, argv);

  std::ifstream file(model + "/heldout.txt");
  std::stringstream text;
  text << file.rdbuf();

  std::vector<Row> rows;
  for (const std::string& spec : specs) {
    auto engine = Engine::load({.model_dir = model, .kv_spec = spec, .threads = threads, .max_sequences = 2});
    if (!engine) stop_with(engine.status().message());
    if (!(*engine)->tokenizer()) stop_with(model + " has no tokenizer.json");
    std::vector<int32_t> prompt = (*engine)->tokenizer()->encode(text.str());
    if (int(prompt.size()) < prompt_tokens) stop_with(model + "/heldout.txt has fewer tokens than --prompt-tokens");
    prompt.resize(size_t(prompt_tokens));
    Expected<KvStreamIdentity> identity = engine_kv_identity(**engine);
    if (!identity) stop_with(identity.status().message());
    auto session = (*engine)->new_session();
    if (auto prefilled = session->prefill(prompt); !prefilled) stop_with(prefilled.status().message());
    const std::vector<uint8_t> transfer = *(*engine)->export_kv(session->sequence());
    auto receiver = KvStreamReceiver::start(*identity, {.port = 0});
    if (!receiver) stop_with(receiver.status().message());
    const std::string address = "127.0.0.1:" + std::to_string((*receiver)->port());

    Row row;
    row.spec = (*engine)->kv_description();
    row.transfer_bytes = transfer.size();
    int serial = 0;
    const auto send = [&](double cap) {
      const KvStreamRequest request{.request_id = "bench-" + std::to_string(serial++), .attempt = 0,
                                    .prompt_token_ids = prompt, .resume_token_ids = {}, .next_token = 0,
                                    .endpoint = "/v1/completions", .request = nlohmann::json::object()};
      const KvStreamSendResult sent = send_kv_transfer(address, *identity, transfer, request, {.bandwidth_gbps = cap});
      if (!sent.status.is_ok()) stop_with(sent.status.message());
      if (!(*receiver)->wait_for(request.request_id, std::chrono::seconds(10))) stop_with("the receiver lost a stream");
      row.wire_bytes = sent.bytes_sent;
      return sent.seconds;
    };
    for (const double cap : gbps) {
      send(cap);  // warm-up
      std::vector<double> times;
      for (int r = 0; r < repeats; ++r) times.push_back(send(cap));
      std::sort(times.begin(), times.end());
      row.seconds.push_back(times[times.size() / 2]);
    }
    rows.push_back(row);
  }

  std::printf("KV stream on loopback: %d prompt tokens of %s, median of %d sends after a warm-up\n\n", prompt_tokens,
              model.c_str(), repeats);
  std::printf("%-52s %12s %12s %12s %8s", "spec", "KV bytes", "wire bytes", "B/token", "x base");
  for (const double cap : gbps) {
    std::printf(" %13s", cap > 0 ? (std::to_string(int(cap)) + " Gbit/s ms").c_str() : "uncapped ms");
  }
  std::printf(" %14s\n", "uncapped Gb/s");
  for (const Row& row : rows) {
    std::printf("%-52s %12zu %12zu %12.1f %8.3f", row.spec.c_str(), row.transfer_bytes, row.wire_bytes,
                double(row.wire_bytes) / prompt_tokens,
                double(row.wire_bytes) / double(rows[0].wire_bytes));
    double uncapped = 0;
    for (size_t c = 0; c < gbps.size(); ++c) {
      std::printf(" %13.2f", row.seconds[c] * 1e3);
      if (gbps[c] == 0) uncapped = double(row.wire_bytes) * 8 / row.seconds[c] / 1e9;
    }
    std::printf(" %14.2f\n", uncapped);
  }
  std::printf("\ntime: from connecting to the receiver's DONE (handshake, every frame, the receiver's end-to-end check)\n");
  std::printf("at a cap, the floor is wire bytes x 8 / cap; x base: wire bytes over the first spec's\n");
  return 0;
}
