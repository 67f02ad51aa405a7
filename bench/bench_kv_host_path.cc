// The KV transfer's host path (issue 23), stage by stage, for a model-shaped KV store (default the
// Llama-3-8B shape: 32 layers, 8 KV heads of 128 dims) of random K/V written through the store's own
// append (sealing included): what a TCP transfer between two workers costs on the CPU before the link.
//   export  the store → transfer bytes (write_kv_transfer, as Engine::export_kv; or, overlapped, a layer
//           at a time as a prefill worker's KvLayerStream writes them: write_kv_transfer_head/_layer)
//   stream  the bytes sent a layer at a time over the KV stream on loopback (KvStreamSender) until the
//           receiver holds them, checked end to end (its wait_for returned them)
//   import  the received bytes → a fresh store (read_kv_transfer with the CRC the receiver computed as
//           they arrived, as Engine::import_kv of a received stream: no second pass over the bytes)
// Four variants per row, side by side with their ratio to the first:
//   first       fresh buffers for everything (a worker's first transfer; every transfer before the pool):
//               export, then stream, then import, one after another
//   repeated    the same stages with the buffers of the transfer before (util/buffer_pool.h: the sender's
//               export, the receiver's assembly), as a server's transfers 2..N find them
//   overlapped  repeated, with each layer sent while the next is written (a thread exports, another
//               sends, as the prefill worker's scheduler and HTTP threads do; each head's CRC taken as
//               it is copied, so the frame reads the bytes only to send them); its export column is the
//               exporting thread's time, its stream column from the export's start until the receiver
//               holds the transfer (the export inside it)
//   pipelined   overlapped, with each piece of a layer also restored into the receiver's store as soon as
//               it has landed and been checksummed, with no buffer of the whole transfer
//               (KvStreamReceiverOptions::staging, as a CPU decode worker does): its stream column
//               holds the import too (the receiver answers once the last layer is restored), its import
//               column what is left after (taking the staged store)
//   laid-out    pipelined, with the sender announcing its tokens in HELLO and the receiver laying the
//               transfer out from them (KvStreamReceiverOptions::expected_head): with --form blocks the
//               early blocks are restored as they land, not buffered until the head
// Each: the transfer's bytes, each stage's median time and GB/s (transfer bytes / time), the total and
// its GB/s: the end-to-end rate of the host path with an uncapped link. Every import is checked: its
// export must equal the sender's bytes (overlapped, whose sender never holds them whole: their length
// and CRC32C). Nothing else stays resident between transfers, as in the bench before the variants:
// first-touch costs depend on how much memory the machine has left.
//   bench_kv_host_path [--specs "dense:dtype=f16;hack:bits=2,pi=64"] [--prompt-tokens 4096,16384]
//                      [--layers 32 --kv-heads 8 --head-dim 128] [--repeats 3]
//                      [--variants first,repeated,overlapped,pipelined] [--form layers|blocks] [--gbps X]
// --form blocks sends each layer's sealed blocks ahead of the head as KV_BLOCKS frames (the overlapped and
// pipelined variants), the form in which a GPU prefill worker's steps and a chunked prompt's earlier
// chunks hand the KV out; --gbps caps the sender as --kv-bandwidth-gbps does.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "kv/kv_factory.h"
#include "kv/store.h"
#include "kv/transfer.h"
#include "transfer/kv_stream.h"
#include "util/buffer_pool.h"

namespace {

using namespace slimkv;
using Clock = std::chrono::steady_clock;

[[noreturn]] void stop_with(const std::string& message) {
  std::fprintf(stderr, "bench_kv_host_path: %s\n", message.c_str());
  std::exit(1);
}

void check(const Status& status) {
  if (!status.is_ok()) stop_with(status.message());
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

enum class Variant { kFirst, kRepeated, kOverlapped, kPipelined, kLaidOut };
const char* variant_name(Variant variant) {
  switch (variant) {
    case Variant::kFirst: return "first";
    case Variant::kRepeated: return "repeated";
    case Variant::kOverlapped: return "overlapped";
    case Variant::kPipelined: return "pipelined";
    case Variant::kLaidOut: return "laid-out";
  }
  return "";
}

struct Times {
  double export_s = 0, stream_s = 0, import_s = 0, total_s = 0;
};

// Both workers of one transfer: the sender's store and buffers, the receiver's.
struct Workers {
  const KvStore& sender_store;
  KvStore& receiver_store;
  KvStreamReceiver& receiver;
  const KvStreamIdentity& identity;
  std::shared_ptr<BufferPool> sender_buffers;    // the prefill worker's (its engine's)
  std::shared_ptr<BufferPool> receiver_buffers;  // the decode worker's (its receiver's and scheduler's)
  std::string model_id;
  int tokens = 0;
  double gbps = 0;  // the sender's cap (0: none)
};

KvStreamRequest request_of(const std::string& id, int tokens) {
  return {.request_id = id, .attempt = 0, .prompt_token_ids = std::vector<int32_t>(size_t(tokens), 7), .resume_token_ids = {},
          .next_token = 0, .endpoint = "/v1/completions", .request = nlohmann::json::object()};
}

// announce: HELLO says the tokens the KV will hold (total_tokens), as a prefill worker's does.
std::unique_ptr<KvStreamSender> open_sender(const Workers& w, const std::string& id, bool announce = false) {
  bool refused = false;
  auto sender = KvStreamSender::open("127.0.0.1:" + std::to_string(w.receiver.port()), w.identity, id, 0,
                                     {.bandwidth_gbps = w.gbps, .total_tokens = announce ? int64_t(w.tokens) : 0}, &refused);
  if (!sender) stop_with(sender.status().message());
  return sender.take();
}

// The export then the stream (first, repeated): the whole transfer written, then sent a layer at a time.
// first: a fresh export buffer; repeated: the one given back by the transfer before. Returns the
// sender's bytes (given back once checked).
std::vector<uint8_t> export_then_stream(const Workers& w, Variant variant, const std::string& id, Times& t) {
  Clock::time_point start = Clock::now();
  std::vector<uint8_t> transfer = variant == Variant::kFirst ? std::vector<uint8_t>() : w.sender_buffers->take_largest();
  check(write_kv_transfer(w.sender_store, w.model_id, transfer));
  t.export_s = seconds_since(start);
  start = Clock::now();
  std::unique_ptr<KvStreamSender> sender = open_sender(w, id);
  check(sender->send_transfer(transfer, request_of(id, w.tokens)));
  t.stream_s = seconds_since(start);
  return transfer;
}

// Overlapped: this thread writes the head and each layer into buffers of the sender's pool, as the
// prefill worker's scheduler does; a second thread sends each as soon as it is written (send_piece, as
// the worker's HTTP thread) and gives its buffer back once sent. early_blocks: each layer's sealed blocks
// first, as KV_BLOCKS (what a GPU prefill step or a long prompt's earlier chunks hand out), then the head
// and each layer's open tokens; else the head, then each layer whole (KV_LAYER).
void export_while_streaming(const Workers& w, const std::string& id, bool early_blocks, bool announce, Times& t) {
  struct Queue {
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<KvTransferPiece> pieces;
    bool ended = false;
  } queue;
  const Clock::time_point start = Clock::now();
  std::unique_ptr<KvStreamSender> sender = open_sender(w, id, announce);
  std::thread sending([&] {
    for (;;) {
      std::unique_lock lock(queue.mutex);
      queue.ready.wait(lock, [&] { return !queue.pieces.empty() || queue.ended; });
      if (queue.pieces.empty()) break;
      KvTransferPiece piece = std::move(queue.pieces.front());
      queue.pieces.pop_front();
      lock.unlock();
      check(sender->send_piece(piece));
    }
    check(sender->finish(request_of(id, w.tokens)));
  });
  const auto push = [&](int layer, std::vector<uint8_t> bytes, size_t sealed, int first_block, bool final,
                        std::vector<uint32_t> crcs) {
    // The buffer goes back to the pool when the piece has been sent (its last holder gone).
    std::shared_ptr<BufferPool> pool = w.sender_buffers;
    const std::shared_ptr<std::vector<uint8_t>> owner(new std::vector<uint8_t>(std::move(bytes)),
                                                      [pool](std::vector<uint8_t>* b) {
                                                        pool->give_back(std::move(*b));
                                                        delete b;
                                                      });
    const std::span<const uint8_t> all(*owner);
    std::lock_guard lock(queue.mutex);
    queue.pieces.push_back({.layer = layer, .bytes = layer < 0 ? all : all.first(sealed),
                            .open = layer < 0 ? all.first(0) : all.subspan(sealed), .owner = owner,
                            .first_block = first_block, .final = final, .crcs = std::move(crcs)});
    queue.ready.notify_one();
  };
  const int num_layers = w.sender_store.shape().num_layers;
  std::vector<int> sent_early(size_t(num_layers), 0);
  if (early_blocks) {
    for (int l = 0; l < num_layers; ++l) {
      std::vector<uint8_t> bytes = w.sender_buffers->take_largest();
      std::vector<uint32_t> crcs;
      const int sealed = w.sender_store.num_sealed_blocks(l);
      check(write_kv_transfer_blocks(w.sender_store, l, 0, sealed, bytes, &crcs));
      const size_t size = bytes.size();
      push(l, std::move(bytes), size, 0, /*final=*/false, std::move(crcs));
      sent_early[size_t(l)] = sealed;
    }
  }
  std::vector<uint8_t> head;
  check(write_kv_transfer_head(w.sender_store, w.model_id, w.tokens, head));
  push(-1, std::move(head), 0, 0, /*final=*/true, {});
  for (int l = 0; l < num_layers; ++l) {
    std::vector<uint8_t> bytes = w.sender_buffers->take_largest();
    size_t sealed = 0;
    std::vector<uint32_t> crcs;  // each head's, taken as the bytes are copied (as the prefill worker's KvLayerStream)
    check(write_kv_transfer_layer(w.sender_store, l, sent_early[size_t(l)], bytes, sealed, &crcs));
    push(l, std::move(bytes), sealed, sent_early[size_t(l)], /*final=*/true, std::move(crcs));
  }
  t.export_s = seconds_since(start);
  {
    std::lock_guard lock(queue.mutex);
    queue.ended = true;
    queue.ready.notify_one();
  }
  sending.join();
  t.stream_s = seconds_since(start);
}

// What the sender's bytes must be: their length and CRC32C.
struct SenderBytes {
  size_t bytes = 0;
  uint32_t crc = 0;
};

// One transfer of `variant`: its times; the import's export checked against the sender's bytes.
Times transfer_once(const Workers& w, Variant variant, bool early_blocks, const std::string& id, const SenderBytes& expected) {
  Times t;
  std::vector<uint8_t> sent;
  const bool staged = variant == Variant::kPipelined || variant == Variant::kLaidOut;
  const bool layered = variant == Variant::kOverlapped || staged;
  if (layered) {
    export_while_streaming(w, id, early_blocks, variant == Variant::kLaidOut, t);
  } else {
    sent = export_then_stream(w, variant, id, t);
  }
  Clock::time_point start = Clock::now();
  Expected<ReceivedKv> received = w.receiver.wait_for(id, std::chrono::seconds(60));
  if (!received) stop_with(received.status().message());
  if (staged) {
    if (received->staged_kv.get() != &w.receiver_store) stop_with("pipelined: the stream was not restored as it arrived");
  } else {
    check(read_kv_transfer(received->transfer.data(), received->transfer.size(), "the stream", w.model_id,
                           w.receiver_store, received->received_crc));
    // Its memory back (to the decode worker's pool, as its scheduler does after an import; the first
    // variant's receiver has no pool and frees it) before the check's export.
    w.receiver_buffers->give_back(std::move(received->transfer));
  }
  t.import_s = seconds_since(start);
  t.total_s = layered ? t.stream_s + t.import_s : t.export_s + t.stream_s + t.import_s;
  // Not timed: the imported store must give back the sender's bytes.
  std::vector<uint8_t> again;
  check(write_kv_transfer(w.receiver_store, w.model_id, again));
  const bool same = layered ? again.size() == expected.bytes && crc32c(again.data(), again.size()) == expected.crc
                            : again == sent;
  if (!same) stop_with(std::string("the imported store's export differs from the sender's (") + variant_name(variant) + ")");
  if (variant == Variant::kRepeated) w.sender_buffers->give_back(std::move(sent));
  return t;
}

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
  std::vector<std::string> variant_names = {"first", "repeated", "overlapped", "pipelined", "laid-out"};
  app.add_option("--variants", variant_names, "variants to run, ','-separated (x first needs first)")
      ->delimiter(',')
      ->check(CLI::IsMember({"first", "repeated", "overlapped", "pipelined", "laid-out"}));
  app.add_option("--repeats", repeats, "timed transfers per variant (after one warm-up); medians printed")->check(CLI::Range(1, 1000));
  double gbps = 0;
  app.add_option("--gbps", gbps, "the sender's bandwidth cap in Gbit/s (--kv-bandwidth-gbps; 0: none)")->check(CLI::Range(0.0, 1e6));
  std::string form = "layers";
  app.add_option("--form", form,
                 "how the overlapped and pipelined variants send: layers (the head, then each layer whole: KV_LAYER) "
                 "or blocks (each layer's sealed blocks first as KV_BLOCKS, as a GPU prefill step or a chunked prompt "
                 "hands them out, then the head and each layer's open tokens)")
      ->check(CLI::IsMember({"layers", "blocks"}));
  CLI11_PARSE(app, argc, argv);

  std::printf("KV transfer host path, %d layers x %d KV heads x %d dims, median of %d after a warm-up, form %s\n\n", layers,
              kv_heads, head_dim, repeats, form.c_str());
  std::printf("%-20s %7s %9s %-10s %10s %7s %10s %7s %10s %7s %10s %7s %7s\n", "spec", "tokens", "MB", "variant", "export ms",
              "GB/s", "stream ms", "GB/s", "import ms", "GB/s", "total ms", "GB/s", "x first");
  for (const std::string& spec : specs) {
    Expected<KvPipeline> pipeline = make_kv_pipeline(spec);
    if (!pipeline) stop_with(pipeline.status().message());
    for (const int tokens : lengths) {
      const KvShape shape(layers, kv_heads, head_dim, head_dim, tokens);
      KvStore sender_store(shape, *pipeline), receiver_store(shape, *pipeline);
      fill(sender_store, tokens, 1234);
      const std::string model_id = "random KV";
      SenderBytes expected;
      {
        std::vector<uint8_t> bytes;
        check(write_kv_transfer(sender_store, model_id, bytes));
        expected = {.bytes = bytes.size(), .crc = crc32c(bytes.data(), bytes.size())};
      }
      std::vector<uint8_t> empty;
      check(write_kv_transfer(receiver_store, model_id, empty));
      Expected<KvStreamIdentity> identity = transfer_kv_identity(empty);
      if (!identity) stop_with(identity.status().message());
      const size_t pool_bytes = 2 * expected.bytes + (size_t(1) << 20);
      double first_total = 0;
      for (const Variant variant : {Variant::kFirst, Variant::kRepeated, Variant::kOverlapped, Variant::kPipelined, Variant::kLaidOut}) {
        if (std::find(variant_names.begin(), variant_names.end(), variant_name(variant)) == variant_names.end()) continue;
        // Each variant's own workers: first keeps nothing (pools of 0 bytes), the others warm theirs in the warm-up.
        const size_t keep = variant == Variant::kFirst ? 0 : pool_bytes;
        auto receiver_buffers = std::make_shared<BufferPool>(keep);
        // Pipelined: each stream restored into the receiver's store (not owned: the bench keeps it, as the
        // other variants' imports reuse it) as it arrives.
        decltype(KvStreamReceiverOptions::staging) staging;
        decltype(KvStreamReceiverOptions::expected_head) expected_head;
        if (variant == Variant::kPipelined || variant == Variant::kLaidOut) {
          staging = [&](const KvTransferInfo& info, std::string_view source, std::shared_ptr<KvReservation>) {
            return stage_into_store(std::shared_ptr<KvStore>(std::shared_ptr<KvStore>(), &receiver_store), info, source,
                                    model_id);
          };
        }
        if (variant == Variant::kLaidOut) {
          expected_head = [&](int64_t n) -> Expected<std::vector<uint8_t>> {
            std::vector<uint8_t> head;
            SLIMKV_RETURN_IF_ERROR(write_kv_transfer_head(receiver_store, model_id, int(n), head));
            return head;
          };
        }
        auto receiver = KvStreamReceiver::start(*identity, {.port = 0, .max_unclaimed_bytes = uint64_t(1) << 40,
                                                            .max_tokens = tokens, .buffers = receiver_buffers,
                                                            .staging = staging, .expected_head = expected_head});
        if (!receiver) stop_with(receiver.status().message());
        const Workers workers{.sender_store = sender_store, .receiver_store = receiver_store, .receiver = **receiver,
                              .identity = *identity, .sender_buffers = std::make_shared<BufferPool>(keep),
                              .receiver_buffers = receiver_buffers, .model_id = model_id, .tokens = tokens,
                              .gbps = gbps};
        std::vector<Times> times;
        for (int r = -1; r < repeats; ++r) {
          const Times t = transfer_once(workers, variant, form == "blocks", str_cat(variant_name(variant), r + 1), expected);
          if (r >= 0) times.push_back(t);  // r = -1: the warm-up
        }
        const auto med = [&](double Times::*field) {
          std::vector<double> values;
          for (const Times& t : times) values.push_back(t.*field);
          return median(values);
        };
        const double e = med(&Times::export_s), s = med(&Times::stream_s), i = med(&Times::import_s), total = med(&Times::total_s);
        if (variant == Variant::kFirst) first_total = total;
        const double gb = double(expected.bytes) / 1e9;
        std::printf("%-20s %7d %9.1f %-10s %10.1f %7.2f %10.1f %7.2f %10.1f %7.2f %10.1f %7.2f %7.2f\n", spec.c_str(), tokens,
                    double(expected.bytes) / 1e6, variant_name(variant), e * 1e3, gb / e, s * 1e3, gb / s, i * 1e3, gb / i,
                    total * 1e3, gb / total, first_total / total);
        std::fflush(stdout);
      }
    }
  }
  std::printf("\nGB/s: the transfer's bytes over the stage's time. total: export + stream + import one after another "
              "(overlapped, pipelined: stream, which holds the export, + import). x first: first's total / this total\n");
  return 0;
}
