// The KV transfer's host path (issue 23), stage by stage, for a model-shaped KV store (default the
// Llama-3-8B shape: 32 layers, 8 KV heads of 128 dims) of random K/V written through the store's own
// append (sealing included): what a TCP transfer between two workers costs on the CPU before the link.
//   export  the store → transfer bytes (write_kv_transfer, as Engine::export_kv)
//   stream  the bytes sent a layer at a time over the KV stream on loopback (send_kv_transfer) until
//           the receiver holds them, checked end to end (its wait_for returned them)
//   import  the received bytes → a fresh store (read_kv_transfer, as Engine::import_kv)
// Each row: the transfer's bytes, each stage's median time and GB/s (transfer bytes / time), the sum of
// the three and its GB/s: the end-to-end rate of the host path with an uncapped link. Every import is
// checked: its export must equal the sender's bytes.
//   bench_kv_host_path [--specs "dense:dtype=f16;hack:bits=2,pi=64"] [--prompt-tokens 4096,16384]
//                      [--layers 32 --kv-heads 8 --head-dim 128] [--repeats 3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "kv/kv_factory.h"
#include "kv/store.h"
#include "kv/transfer.h"
#include "transfer/kv_stream.h"

namespace {

using namespace slimkv;
using Clock = std::chrono::steady_clock;

[[noreturn]] void stop_with(const std::string& message) {
  std::fprintf(stderr, "bench_kv_host_path: %s\n", message.c_str());
  std::exit(1);
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// `tokens` tokens of random K/V (normal, as RoPE'd keys and values roughly are) in every layer,
// appended in prefill-sized chunks.
void fill(KvStore& store, int tokens, uint64_t seed) {
  const KvShape& shape = store.shape();
  constexpr int kChunk = 256;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> k(size_t(kChunk) * size_t(shape.num_kv_heads) * size_t(shape.k_dim));
  std::vector<float> v(size_t(kChunk) * size_t(shape.num_kv_heads) * size_t(shape.v_dim));
  // One chunk's random rows reused at a shifted offset per (layer, chunk): filling is setup, not measured,
  // and a normal draw per value of a 16K-token 8B KV would take longer than the transfer.
  std::vector<float> pool(k.size() + v.size() + 4096);
  for (float& x : pool) x = normal(rng);
  for (int l = 0; l < shape.num_layers; ++l) {
    for (int done = 0; done < tokens; done += kChunk) {
      const int n = std::min(kChunk, tokens - done);
      const size_t shift = (size_t(l) * 977 + size_t(done) * 13) % 4096;
      std::copy_n(pool.begin() + ptrdiff_t(shift), k.size(), k.begin());
      std::copy_n(pool.begin() + ptrdiff_t(shift + k.size()), v.size(), v.begin());
      store.append(l, k.data(), v.data(), n);
    }
  }
}

struct Row {
  std::string spec;
  int tokens = 0;
  size_t bytes = 0;
  std::vector<double> export_s, stream_s, import_s;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("KV transfer host path: export, stream (loopback TCP), import of a model-shaped KV store");
  std::vector<std::string> specs = {"dense:dtype=f16", "hack:bits=2,pi=64"};
  std::vector<int> lengths = {4096, 16384};
  int layers = 32, kv_heads = 8, head_dim = 128, repeats = 3;
  app.add_option("--specs", specs, "KV specs, ';'-separated")->delimiter(';');
  app.add_option("--prompt-tokens", lengths, "tokens per layer, ','-separated")->delimiter(',');
  app.add_option("--layers", layers, "layers of the KV shape");
  app.add_option("--kv-heads", kv_heads, "KV heads of the KV shape");
  app.add_option("--head-dim", head_dim, "dims per head (K and V)");
  app.add_option("--repeats", repeats, "timed transfers per row (after one warm-up); medians printed");
  CLI11_PARSE(app, argc, argv);

  std::printf("KV transfer host path, %d layers x %d KV heads x %d dims, median of %d after a warm-up\n\n", layers,
              kv_heads, head_dim, repeats);
  std::printf("%-70s %7s %10s %10s %8s %10s %8s %10s %8s %10s %8s\n", "spec", "tokens", "MB", "export ms", "GB/s",
              "stream ms", "GB/s", "import ms", "GB/s", "total ms", "GB/s");
  for (const std::string& spec : specs) {
    Expected<KvPipeline> pipeline = make_kv_pipeline(spec);
    if (!pipeline) stop_with(pipeline.status().message());
    for (const int tokens : lengths) {
      const KvShape shape(layers, kv_heads, head_dim, head_dim, tokens);
      KvStore sender_store(shape, *pipeline), receiver_store(shape, *pipeline);
      fill(sender_store, tokens, 1234);
      const std::string model_id = "random KV";
      std::vector<uint8_t> empty;
      if (const Status written = write_kv_transfer(receiver_store, model_id, empty); !written.is_ok()) stop_with(written.message());
      Expected<KvStreamIdentity> identity = transfer_kv_identity(empty);
      if (!identity) stop_with(identity.status().message());
      auto receiver = KvStreamReceiver::start(*identity, {.port = 0, .max_unclaimed_bytes = uint64_t(1) << 40, .max_tokens = tokens});
      if (!receiver) stop_with(receiver.status().message());
      const std::string address = "127.0.0.1:" + std::to_string((*receiver)->port());

      Row row;
      row.spec = pipeline->describe();
      row.tokens = tokens;
      for (int r = -1; r < repeats; ++r) {
        // Export: a fresh buffer each time, as each request's export_kv makes one.
        Clock::time_point start = Clock::now();
        std::vector<uint8_t> transfer;
        if (const Status written = write_kv_transfer(sender_store, model_id, transfer); !written.is_ok()) stop_with(written.message());
        const double export_s = seconds_since(start);

        const std::string id = "r" + std::to_string(r + 1);
        const KvStreamRequest request{.request_id = id, .attempt = 0, .prompt_token_ids = std::vector<int32_t>(size_t(tokens), 7),
                                      .resume_token_ids = {}, .next_token = 0, .endpoint = "/v1/completions",
                                      .request = nlohmann::json::object()};
        start = Clock::now();
        const KvStreamSendResult sent = send_kv_transfer(address, *identity, transfer, request, {});
        if (!sent.status.is_ok()) stop_with(sent.status.message());
        Expected<ReceivedKv> received = (*receiver)->wait_for(id, std::chrono::seconds(60));
        if (!received) stop_with(received.status().message());
        const double stream_s = seconds_since(start);

        start = Clock::now();
        if (const Status read = read_kv_transfer(received->transfer.data(), received->transfer.size(), "the stream", model_id,
                                                 receiver_store);
            !read.is_ok()) {
          stop_with(read.message());
        }
        const double import_s = seconds_since(start);
        received = Expected<ReceivedKv>(ReceivedKv{});  // its memory back before the check's export

        // Not timed: the imported store must give back the sender's bytes.
        std::vector<uint8_t> again;
        if (const Status written = write_kv_transfer(receiver_store, model_id, again); !written.is_ok()) stop_with(written.message());
        if (again != transfer) stop_with("the imported store's export differs from the sender's (" + row.spec + ")");
        row.bytes = transfer.size();
        if (r < 0) continue;  // warm-up
        row.export_s.push_back(export_s);
        row.stream_s.push_back(stream_s);
        row.import_s.push_back(import_s);
      }
      const double e = median(row.export_s), s = median(row.stream_s), i = median(row.import_s), gb = double(row.bytes) / 1e9;
      std::printf("%-70s %7d %10.1f %10.1f %8.2f %10.1f %8.2f %10.1f %8.2f %10.1f %8.2f\n", row.spec.c_str(), tokens,
                  double(row.bytes) / 1e6, e * 1e3, gb / e, s * 1e3, gb / s, i * 1e3, gb / i, (e + s + i) * 1e3,
                  gb / (e + s + i));
      std::fflush(stdout);
    }
  }
  std::printf("\nGB/s: the transfer's bytes over the stage's time; total: export + stream + import, one after another\n");
  return 0;
}
