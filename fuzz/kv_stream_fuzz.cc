// Fuzzes the KV stream's receiver (src/transfer/kv_stream.h; docs/kv_stream_protocol.md): any bytes a
// prefill worker could send to a decode worker's KV port must end in a refusal, a FAILED answer or a
// closed connection, never a crash, a hang or a leak; and a stream the receiver answers DONE must be
// waiting for its request as a transfer that checks out end to end. The bytes go through a real
// KvStreamReceiver on loopback TCP (its frame reader, handshake, KV_BLOCKS/KV_HEAD/KV_LAYER/FINISH
// parsing). Each input is sent twice: as it is, and with every frame's CRC32C repaired (frames walked
// by their size fields), so that mutations reach the checks behind the checksums. The receiver restores
// each layer into a staging store as it arrives (a CPU decode worker's): a stream answered DONE must
// hold a store whose export is the bytes that arrived.
// Seeds: fuzz/corpus/kv_stream_fuzz/ (fuzz/make_kv_stream_seeds.py).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "kv/kv_factory.h"
#include "kv/store.h"
#include "engine/kv_staging.h"
#include "kv/transfer.h"
#include "transfer/kv_frame.h"
#include "transfer/kv_stream.h"

namespace {

using namespace std::chrono_literals;

// The receiver: the identity of the transfer seeds' store (fuzz/corpus/kv_transfer_fuzz: 2 layers, 2 KV
// heads of 16, hack:bits=2,pi=32), short timeouts so that a stalled input costs little.
slimkv::KvStreamReceiver& receiver() {
  static std::unique_ptr<slimkv::KvStreamReceiver> instance = [] {
    const auto pipeline = slimkv::make_kv_pipeline("hack:bits=2,pi=32,round=stochastic");
    slimkv::KvStore store({2, 2, 16, 16, 64}, *pipeline);
    std::vector<uint8_t> empty;
    if (!slimkv::write_kv_transfer(store, "fuzz-model", empty).is_ok()) std::abort();
    const auto identity = slimkv::transfer_kv_identity(empty);
    if (!identity) std::abort();
    // Each stream staged into a store of the seeds' shape, as a CPU decode worker stages (engine/kv_staging.h).
    const auto staging = [pipeline = *pipeline](const slimkv::KvTransferInfo& info, std::string_view source,
                                                std::shared_ptr<slimkv::KvReservation>)
        -> slimkv::Expected<std::unique_ptr<slimkv::KvStaging>> {
      return slimkv::stage_into_store(std::make_shared<slimkv::KvStore>(slimkv::KvShape{2, 2, 16, 16, 64}, pipeline),
                                      info, source, "fuzz-model");
    };
    auto started = slimkv::KvStreamReceiver::start(*identity, {.port = 0, .io_timeout = 200ms, .head_timeout = 200ms,
                                                               .max_unclaimed_bytes = 1 << 20, .max_tokens = 64,
                                                               .staging = staging});
    if (!started) std::abort();
    return started.take();
  }();
  return *instance;
}

uint32_t load_u32(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }
void store_u32(uint8_t* p, uint32_t value) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(value >> (8 * i));
}

// Sends `bytes` as a prefill worker, closes its sending side (so that the receiver sees the stream end
// at once, not at its timeout), and reads the receiver's answers to the end.
void send_stream(const std::vector<uint8_t>& bytes) {
  auto connected = slimkv::TcpConnection::connect("127.0.0.1:" + std::to_string(receiver().port()), 2s);
  if (!connected) std::abort();
  slimkv::TcpConnection connection = connected.take();
  // The receiver may answer (REFUSE, FAILED) and close before reading everything: a failed write is fine.
  (void)connection.write_all(bytes.data(), bytes.size(), slimkv::SteadyClock::now() + 2s);
  connection.shutdown_write();
  bool done = false;
  for (;;) {
    auto frame = slimkv::read_kv_frame(connection, slimkv::SteadyClock::now() + 5s);
    if (!frame) {
      // The receiver closed, or its answer timed out: it must never be silent longer than its timeouts.
      if (frame.status().message().find("timed out") != std::string::npos) std::abort();
      break;
    }
    done = done || frame->type == slimkv::KvFrameType::kDone;
  }
  if (done) {
    auto received = receiver().wait_for("fuzz", 1s);
    if (!received) {
      // Another request id in HELLO: nothing waits under "fuzz"; fine unless the stream was it.
      return;
    }
    if (!received->staged_kv) std::abort();
    std::vector<uint8_t> exported;
    if (!slimkv::write_kv_transfer(*received->staged_kv, "fuzz-model", exported).is_ok()) std::abort();
    // The store gives back the bytes that arrived (their CRC, as the receiver computed it).
    if (exported.size() < slimkv::kKvTransferTrailerBytes ||
        slimkv::crc32c(exported.data(), exported.size() - slimkv::kKvTransferTrailerBytes) != received->received_crc) {
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  send_stream(bytes);
  // Every frame's CRC repaired, walking frames by their declared sizes.
  bool repaired = false;
  for (size_t at = 0; at + slimkv::kKvFrameHeaderBytes <= bytes.size();) {
    const size_t payload = load_u32(bytes.data() + at + 8);
    if (payload > bytes.size() - at - slimkv::kKvFrameHeaderBytes) break;
    const uint32_t crc = slimkv::crc32c(bytes.data() + at + 16, payload, slimkv::crc32c(bytes.data() + at, 12));
    repaired = repaired || load_u32(bytes.data() + at + 12) != crc;
    store_u32(bytes.data() + at + 12, crc);
    at += slimkv::kKvFrameHeaderBytes + payload;
  }
  if (repaired) send_stream(bytes);
  // The receiving thread may still be unwinding after its last answer: wait for it, so that what it
  // allocated is freed within this input (libFuzzer's leak check counts an input's mallocs and frees).
  const auto deadline = slimkv::SteadyClock::now() + 5s;
  while (receiver().stats().streams_in_progress > 0) {
    if (slimkv::SteadyClock::now() > deadline) std::abort();  // a receiving thread that never ends: a hang
    std::this_thread::sleep_for(1ms);
  }
  return 0;
}
