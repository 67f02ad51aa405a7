// The KV stream on loopback (src/transfer/kv_stream.h): what arrives is the sender's export_kv byte for
// byte, mismatched workers are refused with both values, corrupt and truncated frames are refused, a
// peer that dies or stalls fails the other side within its timeout, and the bandwidth cap holds.
#include "transfer/kv_stream.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>

#include "engine/kv_staging.h"
#include "kv/transfer.h"
#include "model/model_config.h"
#include "transfer/kv_frame.h"
#include "source_dir.h"
#include "transfer/chunk_stream_check.h"
#include "transfer/prefilled_engine.h"

namespace slimkv {
namespace {

using namespace std::chrono_literals;
const std::string kModel = slimkv::test::source_dir() + "/models/slimkv-llama-15m";

std::string loopback(int port) { return "127.0.0.1:" + std::to_string(port); }

// Specs whose heads' blocks differ in size (transfer format version 2): 4-bit heads among 2-bit ones,
// and ZACK's per-head ranks.
constexpr const char* kHeadBitsSpec = "hack:bits=2,pi=64,hibits=4,hiheads=1.0/6.1";
constexpr const char* kZackSpec = "zack:rate=0.5,align=16+hack:bits=4";

using test::Prefilled;
Prefilled prefill(const std::string& spec, int tokens) { return test::prefill_bundled(spec, tokens, "cpu", 2); }

KvStreamRequest request_for(const Prefilled& p, const std::string& id) {
  return {.request_id = id, .attempt = 0, .prompt_token_ids = p.prompt, .resume_token_ids = {}, .next_token = 7,
          .endpoint = "/v1/completions", .request = {{"prompt", "x"}, {"max_tokens", 3}}};
}

class KvStreamRoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(KvStreamRoundTrip, ArrivesAsExported) {
  // 150 tokens: two sealed 64-token blocks and an open block of 22 in every layer.
  Prefilled p = prefill(GetParam(), 150);
  auto receiver = KvStreamReceiver::start(p.identity, {.port = 0});
  ASSERT_TRUE(receiver) << receiver.status().message();
  const KvStreamSendResult sent = send_kv_transfer(loopback((*receiver)->port()), p.identity, p.transfer,
                                                   request_for(p, "r1"), {});
  ASSERT_TRUE(sent.status) << sent.status.message();
  Expected<ReceivedKv> got = (*receiver)->wait_for("r1", 5s);
  ASSERT_TRUE(got) << got.status().message();
  EXPECT_EQ(got->transfer, p.transfer) << "spec " << GetParam();
  // The CRC the receiver joined from the frames' is the transfer's (what its import compares instead).
  EXPECT_EQ(got->received_crc, crc32c(p.transfer.data(), p.transfer.size() - kKvTransferTrailerBytes));
  EXPECT_EQ(got->request.prompt_token_ids, p.prompt);
  EXPECT_EQ(got->request.next_token, 7);
  EXPECT_EQ(got->request.endpoint, "/v1/completions");
  EXPECT_EQ(got->request.request["max_tokens"], 3);
  EXPECT_EQ(got->wire_bytes, sent.bytes_sent);
  EXPECT_GT(sent.bytes_sent, p.transfer.size());
  EXPECT_LT(sent.bytes_sent, p.transfer.size() + 2048 + 16 * size_t(p.identity.num_layers + 4));
  // Imports into a fresh sequence and exports the same bytes again.
  const SequenceId sequence = *p.engine->add_sequence();
  ASSERT_TRUE(p.engine->import_kv(sequence, got->transfer, "the stream"));
  EXPECT_EQ(*p.engine->export_kv(sequence), p.transfer);
  // Taken: a second wait finds nothing.
  EXPECT_FALSE((*receiver)->wait_for("r1", 50ms));
}

// The last two: each head's blocks of its own size (hiheads=; ZACK's ranks), in slots of that size.
INSTANTIATE_TEST_SUITE_P(Specs, KvStreamRoundTrip,
                         ::testing::Values("dense", "dense:dtype=f16", "hack:bits=2,pi=64", "hack:bits=4",
                                           "hack:bits=2,pi=64,sinks=4,window=64", kHeadBitsSpec, kZackSpec));

// Engine::stream_kv_in_next_step: the pieces handed out during a step (head, then layers in order) are
// the export after the step, for a first chunk and for a later one.
TEST(KvStream, LayersStreamedDuringAStepAreTheExportAfterIt) {
  for (const std::string spec : {"dense", "hack:bits=2,pi=64", "hack:bits=2,pi=64,sinks=4,window=64", kHeadBitsSpec, kZackSpec}) {
    auto engine = Engine::load({.model_dir = kModel, .kv_spec = spec, .threads = 2, .max_sequences = 2});
    ASSERT_TRUE(engine) << engine.status().message();
    const SequenceId sequence = *(*engine)->add_sequence();
    std::vector<int32_t> tokens;
    for (int i = 0; i < 200; ++i) tokens.push_back(int32_t(11 + (i * 53) % 800));
    size_t done = 0;
    std::vector<KvTransferPiece> pieces;
    for (const size_t chunk : {size_t(130), size_t(70)}) {
      pieces.clear();
      ASSERT_TRUE((*engine)->stream_kv_in_next_step(sequence, [&](KvTransferPiece piece) { pieces.push_back(std::move(piece)); }));
      const StepItem item{sequence, std::span<const int32_t>(tokens).subspan(done, chunk), StepOutput::kSample};
      StepResult result;
      ASSERT_TRUE((*engine)->step({&item, 1}, result));
      done += chunk;
      const std::vector<uint8_t> exported = *(*engine)->export_kv(sequence);
      ASSERT_EQ(pieces.size(), size_t((*engine)->model_config().num_layers) + 1) << spec;
      std::vector<uint8_t> sealed, open;
      for (size_t p = 1; p < pieces.size(); ++p) {
        ASSERT_EQ(pieces[p].layer, int(p - 1));
        sealed.insert(sealed.end(), pieces[p].bytes.begin(), pieces[p].bytes.end());
        open.insert(open.end(), pieces[p].open.begin(), pieces[p].open.end());
      }
      std::vector<uint8_t> assembled(pieces[0].bytes.begin(), pieces[0].bytes.end());
      EXPECT_EQ(pieces[0].layer, -1);
      assembled.insert(assembled.end(), sealed.begin(), sealed.end());
      assembled.insert(assembled.end(), open.begin(), open.end());
      const auto trailer = kv_transfer_trailer(crc32c(assembled.data(), assembled.size()));
      assembled.insert(assembled.end(), trailer.begin(), trailer.end());
      EXPECT_EQ(assembled, exported) << spec << " after " << done << " tokens";
    }
  }
}

// A prompt prefilled in chunks, streamed as computed, arrives as exported (chunk_stream_check.h).
TEST(KvStream, ChunksStreamedAsComputedArriveAsExported) {
  // @offload: a store whose blocks move to a slow tier, so they are read into a buffer and copied in.
  for (const std::string spec : {"dense:dtype=f16", "hack:bits=2,pi=64", "hack:bits=2,pi=64@offload", kHeadBitsSpec, kZackSpec}) {
    test::expect_chunks_streamed_as_exported(kModel, spec, "cpu");
  }
}

// A head declaring more tokens than the decode worker's context is refused before anything is allocated.
TEST(KvStream, HeadBeyondTheReceiversContextIsRefused) {
  Prefilled p = prefill("dense", 150);
  auto receiver = KvStreamReceiver::start(p.identity, {.port = 0, .max_tokens = 100});
  const KvStreamSendResult sent = send_kv_transfer(loopback((*receiver)->port()), p.identity, p.transfer, request_for(p, "r12"), {});
  EXPECT_NE(sent.status.message().find("150 tokens in layer 0, more than this decode worker's context of 100"), std::string::npos)
      << sent.status.message();
}

// Streams received whole that no request claims hold at most max_unclaimed_bytes: the oldest are
// dropped (and counted); a stream whose request already waits is never dropped.
TEST(KvStream, UnclaimedStreamsAreBoundedByBytes) {
  Prefilled p = prefill("dense", 70);
  const uint64_t one = p.transfer.size();
  auto receiver = KvStreamReceiver::start(p.identity, {.port = 0, .max_unclaimed_bytes = one + one / 2});
  for (const char* id : {"a", "b", "c"}) {
    ASSERT_TRUE(send_kv_transfer(loopback((*receiver)->port()), p.identity, p.transfer, request_for(p, id), {}).status);
  }
  KvStreamReceiver::Stats stats = (*receiver)->stats();
  EXPECT_EQ(stats.unclaimed_streams, 1);
  EXPECT_EQ(stats.unclaimed_bytes, one);
  EXPECT_EQ(stats.dropped_bytes_total, 2u);
  EXPECT_FALSE((*receiver)->wait_for("a", 50ms));
  EXPECT_FALSE((*receiver)->wait_for("b", 50ms));
  EXPECT_TRUE((*receiver)->wait_for("c", 50ms));

  auto small = KvStreamReceiver::start(p.identity, {.port = 0, .max_unclaimed_bytes = one / 2});
  const KvStreamSendResult dropped = send_kv_transfer(loopback((*small)->port()), p.identity, p.transfer, request_for(p, "d"), {});
  EXPECT_NE(dropped.status.message().find("dropped at once"), std::string::npos) << dropped.status.message();
  std::future<Expected<ReceivedKv>> waiting = std::async(std::launch::async, [&] { return (*small)->wait_for("e", 10s); });
  std::this_thread::sleep_for(100ms);  // the request waits first
  ASSERT_TRUE(send_kv_transfer(loopback((*small)->port()), p.identity, p.transfer, request_for(p, "e"), {}).status);
  Expected<ReceivedKv> claimed = waiting.get();
  ASSERT_TRUE(claimed) << claimed.status().message();
  EXPECT_EQ(claimed->transfer, p.transfer);
  EXPECT_EQ((*small)->stats().dropped_bytes_total, 1u);
}

// Heads whose blocks differ in size: the identity lists each head's, and the two sides must agree on
// them (ZACK's ranks come from a calibration: the same spec can give other ranks); a malformed list is
// refused naming the field.
TEST(KvStream, EachHeadsBlockSizeIsPartOfTheIdentity) {
  Prefilled p = prefill(kZackSpec, 70);
  ASSERT_EQ(p.identity.head_block_bytes.size(), size_t(p.identity.num_layers * p.identity.num_kv_heads));
  // As HELLO carries it: the JSON's text.
  const auto as_sent = [](const KvStreamIdentity& identity) { return nlohmann::json::parse(kv_identity_json(identity).dump()); };
  Expected<KvStreamIdentity> parsed = parse_kv_identity(as_sent(p.identity), "HELLO");
  ASSERT_TRUE(parsed) << parsed.status().message();
  EXPECT_EQ(parsed->head_block_bytes, p.identity.head_block_bytes);
  EXPECT_EQ(kv_identity_mismatch(p.identity, *parsed), "");
  KvStreamIdentity other = p.identity;
  other.head_block_bytes[3] -= 64;
  EXPECT_NE(kv_identity_mismatch(p.identity, other).find("head_block_bytes: the prefill worker's ["), std::string::npos);
  KvStreamIdentity uniform = p.identity;
  uniform.head_block_bytes.clear();
  EXPECT_NE(kv_identity_mismatch(uniform, p.identity).find("head_block_bytes: the prefill worker's null"), std::string::npos)
      << kv_identity_mismatch(uniform, p.identity);
  auto receiver = KvStreamReceiver::start(other, {.port = 0});
  ASSERT_TRUE(receiver);
  const KvStreamSendResult sent = send_kv_transfer(loopback((*receiver)->port()), p.identity, p.transfer, request_for(p, "h"), {});
  EXPECT_TRUE(sent.refused);
  EXPECT_NE(sent.status.message().find("head_block_bytes"), std::string::npos) << sent.status.message();
  for (const auto& [value, message] : std::vector<std::pair<nlohmann::json, std::string>>{
           {nlohmann::json::array({64, 64}), "must be an array of num_layers × num_kv_heads = 16 block sizes"},
           {"64", "must be an array"},
           {nlohmann::json::array({0, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64}), "holds 0, not a block size"},
           {nlohmann::json(std::vector<uint64_t>(16, p.identity.sealed_block_bytes + 1)), "(sealed_block_bytes, the largest)"}}) {
    nlohmann::json body = as_sent(p.identity);
    body["head_block_bytes"] = value;
    Expected<KvStreamIdentity> bad = parse_kv_identity(body, "HELLO");
    ASSERT_FALSE(bad) << value.dump();
    EXPECT_NE(bad.status().message().find("identity field head_block_bytes " + std::string(value.is_array() && value.size() == 16 ? "holds" : "must")),
              std::string::npos)
        << bad.status().message();
    EXPECT_NE(bad.status().message().find(message), std::string::npos) << bad.status().message();
  }
}

TEST(KvStream, MismatchIsRefusedNamingBothSides) {
  Prefilled p = prefill("hack:bits=2,pi=64", 70);
  KvStreamIdentity receiver_identity = p.identity;
  receiver_identity.kv_spec = "hack:kbits=4,vbits=4,round=stochastic,se=on,pi=64";
  receiver_identity.block_tokens = 32;
  auto receiver = KvStreamReceiver::start(receiver_identity, {.port = 0});
  ASSERT_TRUE(receiver);
  const KvStreamSendResult sent = send_kv_transfer(loopback((*receiver)->port()), p.identity, p.transfer,
                                                   request_for(p, "r2"), {});
  ASSERT_FALSE(sent.status);
  EXPECT_TRUE(sent.refused);
  const std::string& message = sent.status.message();
  EXPECT_NE(message.find("kv_spec: the prefill worker's \"" + p.identity.kv_spec + "\", this decode worker's \"" +
                         receiver_identity.kv_spec + "\""), std::string::npos) << message;
  EXPECT_NE(message.find("block_tokens: the prefill worker's 64, this decode worker's 32"), std::string::npos) << message;
  // No KV byte moved: the handshake alone.
  EXPECT_LT(sent.bytes_sent, 1024u);
  EXPECT_FALSE((*receiver)->wait_for("r2", 50ms));
}

// A hand-driven sender for the fault cases: the handshake, then whatever the test writes.
struct RawSender {
  TcpConnection connection;
  explicit RawSender(int port, const KvStreamIdentity& identity, const std::string& id, const std::string& cuda_ipc_device = "",
                     int64_t total_tokens = 0) {
    connection = TcpConnection::connect(loopback(port), 2s).take();
    nlohmann::json body = {{"stream_version", kKvStreamVersion}, {"request_id", id}, {"attempt", 0},
                           {"identity", kv_identity_json(identity)}};
    if (!cuda_ipc_device.empty()) body["cuda_ipc"] = {{"device", cuda_ipc_device}};
    if (total_tokens > 0) body["total_tokens"] = total_tokens;
    const std::string hello = body.dump();
    write(KvFrameType::kHello, {reinterpret_cast<const uint8_t*>(hello.data()), hello.size()});
    EXPECT_EQ(read_kv_frame(connection, SteadyClock::now() + 5s)->type, KvFrameType::kAccept);
  }
  void write(KvFrameType type, std::span<const uint8_t> payload) {
    const std::span<const uint8_t> parts[] = {payload};
    ASSERT_TRUE(write_kv_frame(connection, type, parts, nullptr, SteadyClock::now() + 5s));
  }
  // A frame whose payload has a bit flipped after its CRC was computed (the header written by hand).
  void write_corrupted(KvFrameType type, std::vector<uint8_t> payload) {
    uint8_t header[kKvFrameHeaderBytes] = {'S', 'K', 'V', 'S', uint8_t(type)};
    const uint32_t size = uint32_t(payload.size()), crc = crc32c(payload.data(), payload.size(), crc32c(header, 12));
    std::memcpy(header + 8, &size, 4);
    std::memcpy(header + 12, &crc, 4);
    payload[payload.size() / 2] ^= 0x10;
    ASSERT_TRUE(connection.write_all(header, sizeof(header), SteadyClock::now() + 2s));
    ASSERT_TRUE(connection.write_all(payload.data(), payload.size(), SteadyClock::now() + 2s));
  }
  // What the receiver answers (its FAILED error), or the read's error.
  std::string answer() {
    Expected<KvFrame> frame = read_kv_frame(connection, SteadyClock::now() + 5s);
    if (!frame) return frame.status().message();
    return std::string(frame->payload.begin(), frame->payload.end());
  }
};

TEST(KvStream, CorruptFrameIsRefused) {
  Prefilled p = prefill("hack:bits=2,pi=64", 100);
  auto receiver = KvStreamReceiver::start(p.identity, {.port = 0});
  RawSender sender((*receiver)->port(), p.identity, "r3");
  const auto info = *inspect_kv_transfer(p.transfer.data(), p.transfer.size(), "t");
  // A KV_HEAD frame whose payload is flipped after its CRC was computed.
  sender.write_corrupted(KvFrameType::kKvHead, {p.transfer.begin(), p.transfer.begin() + ptrdiff_t(info.sealed_offset)});
  const std::string answer = sender.answer();
  EXPECT_NE(answer.find("KV_HEAD frame checksum mismatch"), std::string::npos) << answer;
  EXPECT_FALSE((*receiver)->wait_for("r3", 50ms));
}

TEST(KvStream, CorruptLayerInsideAValidFrameFailsTheTransferChecksum) {
  // A sender that corrupts its own bytes before framing them: the frames check out, the transfer's
  // end-to-end CRC does not.
  Prefilled p = prefill("dense", 80);
  std::vector<uint8_t> corrupt = p.transfer;
  const auto info = *inspect_kv_transfer(p.transfer.data(), p.transfer.size(), "t");
  corrupt[info.sealed_offset + 100] ^= 1;
  auto receiver = KvStreamReceiver::start(p.identity, {.port = 0});
  RawSender sender((*receiver)->port(), p.identity, "r4");
  sender.write(KvFrameType::kKvHead, std::span<const uint8_t>(corrupt).first(info.sealed_offset));
  const auto ranges = kv_transfer_layer_ranges(info);
  for (size_t l = 0; l < ranges.size(); ++l) {
    std::vector<uint8_t> payload(8, 0);
    payload[0] = uint8_t(l);
    payload.insert(payload.end(), corrupt.begin() + ptrdiff_t(ranges[l].sealed_offset),
                   corrupt.begin() + ptrdiff_t(ranges[l].sealed_offset + ranges[l].sealed_bytes));
    payload.insert(payload.end(), corrupt.begin() + ptrdiff_t(ranges[l].open_offset),
                   corrupt.begin() + ptrdiff_t(ranges[l].open_offset + ranges[l].open_bytes));
    sender.write(KvFrameType::kKvLayer, payload);
  }
  std::vector<uint8_t> finish(corrupt.begin() + ptrdiff_t(info.trailer_offset), corrupt.end());
  const std::string body = R"({"prompt_token_ids":[],"resume_token_ids":[],"next_token":1,"endpoint":"/v1/completions"})";
  finish.insert(finish.end(), body.begin(), body.end());
  sender.write(KvFrameType::kFinish, finish);
  const std::string answer = sender.answer();
  EXPECT_NE(answer.find("checksum mismatch"), std::string::npos) << answer;
  EXPECT_FALSE((*receiver)->wait_for("r4", 50ms));
}

TEST(KvStream, TruncatedFrameAndDeadSenderFailWithinTheTimeout) {
  Prefilled p = prefill("hack:bits=4", 70);
  auto receiver = KvStreamReceiver::start(p.identity, {.port = 0, .io_timeout = 300ms, .head_timeout = 300ms});
  {
    // A frame header that promises 1000 bytes, 10 of them sent, then the sender goes quiet.
    RawSender sender((*receiver)->port(), p.identity, "r5");
    uint8_t header[kKvFrameHeaderBytes] = {'S', 'K', 'V', 'S', uint8_t(KvFrameType::kKvHead)};
    const uint32_t size = 1000;
    std::memcpy(header + 8, &size, 4);
    const uint8_t some[10] = {};
    ASSERT_TRUE(sender.connection.write_all(header, sizeof(header), SteadyClock::now() + 1s));
    ASSERT_TRUE(sender.connection.write_all(some, sizeof(some), SteadyClock::now() + 1s));
    const auto start = SteadyClock::now();
    const std::string answer = sender.answer();  // the receiver gives up after io_timeout and says why
    EXPECT_NE(answer.find("timed out"), std::string::npos) << answer;
    EXPECT_LT(SteadyClock::now() - start, 3s);
  }
  {
    // A sender that dies mid-frame: the receiver sees the connection close.
    RawSender sender((*receiver)->port(), p.identity, "r6");
    uint8_t header[kKvFrameHeaderBytes] = {'S', 'K', 'V', 'S', uint8_t(KvFrameType::kKvHead)};
    const uint32_t size = 1000;
    std::memcpy(header + 8, &size, 4);
    ASSERT_TRUE(sender.connection.write_all(header, sizeof(header), SteadyClock::now() + 1s));
    sender.connection.close();
  }
  EXPECT_FALSE((*receiver)->wait_for("r5", 50ms));
  EXPECT_FALSE((*receiver)->wait_for("r6", 300ms));
}

// A receiver with a buffer pool assembles each stream in the buffer of one before, once whoever took
// that stream gave it back (a decode worker's scheduler after its import).
TEST(KvStream, ReceiverAssemblesInABufferGivenBack) {
  Prefilled p = prefill("dense:dtype=f16", 150);
  auto buffers = std::make_shared<BufferPool>(size_t(64) << 20);
  auto receiver = KvStreamReceiver::start(p.identity, {.port = 0, .buffers = buffers});
  ASSERT_TRUE(receiver) << receiver.status().message();
  const uint8_t* first = nullptr;
  for (const std::string id : {"p1", "p2", "p3"}) {
    ASSERT_TRUE(send_kv_transfer(loopback((*receiver)->port()), p.identity, p.transfer, request_for(p, id), {}).status);
    Expected<ReceivedKv> got = (*receiver)->wait_for(id, 5s);
    ASSERT_TRUE(got) << got.status().message();
    EXPECT_EQ(got->transfer, p.transfer);
    if (first) {
      EXPECT_EQ(got->transfer.data(), first) << id;  // the same memory, not a new allocation
    }
    first = got->transfer.data();
    buffers->give_back(std::move(got->transfer));
  }
  // A shorter prompt's stream in the same buffer, not zeroed first: every byte is its own, none stale.
  auto session = p.engine->new_session();
  std::vector<int32_t> shorter(p.prompt.begin(), p.prompt.begin() + 70);
  ASSERT_TRUE(session->prefill(shorter));
  const std::vector<uint8_t> short_transfer = *p.engine->export_kv(session->sequence());
  KvStreamRequest request = request_for(p, "p4");
  request.prompt_token_ids = shorter;
  ASSERT_TRUE(send_kv_transfer(loopback((*receiver)->port()), p.identity, short_transfer, request, {}).status);
  Expected<ReceivedKv> got = (*receiver)->wait_for("p4", 5s);
  ASSERT_TRUE(got) << got.status().message();
  EXPECT_EQ(got->transfer.data(), first);
  EXPECT_EQ(got->transfer, short_transfer);
  const BufferPool::Stats stats = buffers->stats();
  EXPECT_EQ(stats.fresh_total, 1u);
  EXPECT_EQ(stats.reused_total, 3u);
}

// A sender that dies mid-layer or sends a corrupt layer: the stream fails with the error naming the
// layer, and its buffer goes back to the pool (nothing held by the receiver, nothing leaked).
TEST(KvStream, AFailedStreamGivesItsBufferBack) {
  Prefilled p = prefill("dense", 150);
  auto buffers = std::make_shared<BufferPool>(size_t(64) << 20);
  auto receiver = KvStreamReceiver::start(p.identity, {.port = 0, .io_timeout = 500ms, .buffers = buffers});
  ASSERT_TRUE(receiver) << receiver.status().message();
  const auto info = *inspect_kv_transfer(p.transfer.data(), p.transfer.size(), "t");
  const auto ranges = kv_transfer_layer_ranges(info);
  const auto layer_payload = [&](size_t l) {  // u32 layer, u32 first block (0), its blocks, its open tokens
    const KvTransferLayerRanges& range = ranges[l];
    std::vector<uint8_t> payload(8 + range.sealed_bytes + range.open_bytes, 0);
    payload[0] = uint8_t(l);
    std::memcpy(payload.data() + 8, p.transfer.data() + range.sealed_offset, range.sealed_bytes);
    std::memcpy(payload.data() + 8 + range.sealed_bytes, p.transfer.data() + range.open_offset, range.open_bytes);
    return payload;
  };
  const auto wait_until_idle = [&] {
    for (int i = 0; i < 200 && (*receiver)->stats().streams_in_progress > 0; ++i) std::this_thread::sleep_for(10ms);
    EXPECT_EQ((*receiver)->stats().streams_in_progress, 0);
  };
  {
    // Two layers, then half of the third, then gone.
    RawSender sender((*receiver)->port(), p.identity, "d1");
    sender.write(KvFrameType::kKvHead, std::span<const uint8_t>(p.transfer).first(info.sealed_offset));
    sender.write(KvFrameType::kKvLayer, layer_payload(0));
    sender.write(KvFrameType::kKvLayer, layer_payload(1));
    const std::vector<uint8_t> third = layer_payload(2);
    uint8_t header[kKvFrameHeaderBytes] = {'S', 'K', 'V', 'S', uint8_t(KvFrameType::kKvLayer)};
    const uint32_t size = uint32_t(third.size());
    std::memcpy(header + 8, &size, 4);
    ASSERT_TRUE(sender.connection.write_all(header, sizeof(header), SteadyClock::now() + 1s));
    ASSERT_TRUE(sender.connection.write_all(third.data(), third.size() / 2, SteadyClock::now() + 1s));
    sender.connection.close();
  }
  wait_until_idle();
  EXPECT_FALSE((*receiver)->wait_for("d1", 50ms));
  EXPECT_EQ(buffers->stats().held_buffers, 1);
  EXPECT_GE(buffers->stats().held_bytes, p.transfer.size());
  {
    // Layer 1's frame corrupted after its CRC: refused naming the frame, the buffer back again (the same one).
    RawSender sender((*receiver)->port(), p.identity, "d2");
    sender.write(KvFrameType::kKvHead, std::span<const uint8_t>(p.transfer).first(info.sealed_offset));
    sender.write(KvFrameType::kKvLayer, layer_payload(0));
    sender.write_corrupted(KvFrameType::kKvLayer, layer_payload(1));
    const std::string answer = sender.answer();
    EXPECT_NE(answer.find("layer 1: "), std::string::npos) << answer;
    EXPECT_NE(answer.find("KV_LAYER frame checksum mismatch"), std::string::npos) << answer;
  }
  wait_until_idle();
  EXPECT_FALSE((*receiver)->wait_for("d2", 50ms));
  const BufferPool::Stats stats = buffers->stats();
  EXPECT_EQ(stats.held_buffers, 1);
  EXPECT_EQ(stats.reused_total, 1u);
  EXPECT_EQ(stats.fresh_total, 1u);
}

// A receiver with a staging store (a CPU decode worker): each piece of a layer is restored into a store
// of the engine's as soon as it arrives (read straight into its block slots); the engine adopts the store, which holds what a whole import of
// the transfer holds: the same bytes, the same logits for the next token. No buffer of the whole
// transfer is taken.
TEST(KvStream, AStagedStreamIsWhatAWholeImportGives) {
  // @offload: a store whose blocks move to a slow tier, so the pieces are read into a buffer and
  // copied in, where the others are read straight into the store's slots.
  for (const std::string spec : {"dense", "hack:bits=2,pi=64", "hack:bits=2,pi=64@offload", "hack:bits=2,pi=64,sinks=4,window=64",
                                 kHeadBitsSpec, kZackSpec}) {
    Prefilled p = prefill(spec, 150);
    auto buffers = std::make_shared<BufferPool>(size_t(64) << 20);
    auto receiver = KvStreamReceiver::start(
        p.identity, {.port = 0, .buffers = buffers, .staging = [&](const KvTransferInfo& info, std::string_view source, std::shared_ptr<KvReservation> reserved) {
                       return p.engine->new_kv_staging(info, source, std::move(reserved));
                     }});
    ASSERT_TRUE(receiver) << receiver.status().message();
    ASSERT_TRUE(send_kv_transfer(loopback((*receiver)->port()), p.identity, p.transfer, request_for(p, "s1"), {}).status);
    Expected<ReceivedKv> got = (*receiver)->wait_for("s1", 5s);
    ASSERT_TRUE(got) << got.status().message();
    ASSERT_TRUE(got->staged_kv) << spec;
    EXPECT_TRUE(got->transfer.empty());
    EXPECT_EQ(buffers->stats().fresh_total + buffers->stats().reused_total, 0u);
    const SequenceId staged = *p.engine->add_sequence(), whole = *p.engine->add_sequence();
    const Status adopted = p.engine->adopt_kv(staged, got->staged_kv, "the stream");
    ASSERT_TRUE(adopted) << adopted.message();
    ASSERT_TRUE(p.engine->import_kv(whole, p.transfer, "whole"));
    EXPECT_EQ(*p.engine->export_kv(staged), p.transfer) << spec;
    const int32_t next = 7;
    const std::vector<StepItem> items = {{staged, std::span(&next, 1), StepOutput::kLastLogits},
                                         {whole, std::span(&next, 1), StepOutput::kLastLogits}};
    StepResult result;
    ASSERT_TRUE(p.engine->step(items, result));
    EXPECT_TRUE(std::equal(result.logits_of(0).begin(), result.logits_of(0).end(), result.logits_of(1).begin())) << spec;
  }
}

// What a staged stream laid out at HELLO asks of its placement, in order: each KV_BLOCKS frame's blocks as
// they land (blocks_restored: a layer's ranges continuing each other from block 0, before the layer's
// frame), then each layer whole (layer_complete, layers in order). The GPU's placement uploads on these.
TEST(KvStream, ALaidOutStreamPlacesEachFramesBlocksAsTheyLand) {
  class Recording final : public KvStaging {
   public:
    Recording(std::shared_ptr<KvStore> store, const KvTransferInfo& info, std::vector<std::string>& calls)
        : KvStaging(std::move(store), info, "test"), calls_(calls) {}
    Status start(std::string_view model_id) { return check_head(model_id); }
    Status blocks_restored(int layer, int first_block, int count) override {
      calls_.push_back(str_cat("blocks ", layer, " ", first_block, "+", count, " (", store().num_sealed_blocks(layer), " in)"));
      return Status::ok();
    }
    Status layer_complete(int layer, const uint8_t*) override {
      calls_.push_back(str_cat("layer ", layer, " (", store().num_sealed_blocks(layer), " in)"));
      return Status::ok();
    }

   private:
    Status finish_placing(StagedKv& out) override {
      out.store = store_;
      return Status::ok();
    }
    std::vector<std::string>& calls_;
  };
  Prefilled p = prefill("hack:bits=2,pi=64", 150);  // two sealed blocks a layer, 22 open tokens
  std::vector<std::string> calls;
  KvStreamReceiverOptions options{.port = 0};
  options.staging = [&](const KvTransferInfo& info, std::string_view, std::shared_ptr<KvReservation>) -> Expected<std::unique_ptr<KvStaging>> {
    auto staging = std::make_unique<Recording>(*p.engine->new_kv_store(), info, calls);
    SLIMKV_RETURN_IF_ERROR(staging->start(p.identity.model_id));
    return std::unique_ptr<KvStaging>(std::move(staging));
  };
  options.expected_head = [&](int64_t tokens) { return p.engine->kv_transfer_head(tokens); };
  auto receiver = KvStreamReceiver::start(p.identity, options);
  ASSERT_TRUE(receiver) << receiver.status().message();
  // The sender: each layer's two blocks one KV_BLOCKS frame at a time (as two prompt chunks hand them
  // out), then the head and each layer's open tokens.
  const std::shared_ptr<KvStore> store = *p.engine->new_kv_store();
  KvStore& sent = *store;
  ASSERT_TRUE(read_kv_transfer(p.transfer.data(), p.transfer.size(), "t", p.identity.model_id, sent));
  bool refused = false;
  auto sender = KvStreamSender::open(loopback((*receiver)->port()), p.identity, "l1", 0, {.total_tokens = 150}, &refused);
  ASSERT_TRUE(sender) << sender.status().message();
  for (const int block : {0, 1}) {
    for (int l = 0; l < p.identity.num_layers; ++l) {
      std::vector<uint8_t> blocks;
      ASSERT_TRUE(write_kv_transfer_blocks(sent, l, block, block + 1, blocks));
      ASSERT_TRUE((*sender)->send_blocks(l, block, blocks));
    }
  }
  const auto info = *inspect_kv_transfer(p.transfer.data(), p.transfer.size(), "t");
  ASSERT_TRUE((*sender)->send_head(std::span<const uint8_t>(p.transfer).first(info.sealed_offset)));
  for (int l = 0; l < p.identity.num_layers; ++l) {
    std::vector<uint8_t> layer;
    size_t sealed_bytes = 0;
    ASSERT_TRUE(write_kv_transfer_layer(sent, l, 2, layer, sealed_bytes));
    ASSERT_TRUE((*sender)->send_layer(l, 2, std::span(layer).first(sealed_bytes), std::span(layer).subspan(sealed_bytes)));
  }
  ASSERT_TRUE((*sender)->finish(request_for(p, "l1")));
  Expected<ReceivedKv> got = (*receiver)->wait_for("l1", 5s);
  ASSERT_TRUE(got) << got.status().message();
  std::vector<std::string> expected;
  for (const int block : {0, 1}) {
    for (int l = 0; l < p.identity.num_layers; ++l) expected.push_back(str_cat("blocks ", l, " ", block, "+1 (", block + 1, " in)"));
  }
  for (int l = 0; l < p.identity.num_layers; ++l) expected.push_back(str_cat("layer ", l, " (2 in)"));
  EXPECT_EQ(calls, expected);
  ASSERT_TRUE(got->staged_kv);
  std::vector<uint8_t> exported;
  ASSERT_TRUE(write_kv_transfer(*got->staged_kv, p.identity.model_id, exported));
  EXPECT_EQ(exported, p.transfer);
}

// A staged stream that fails after some layers were restored — a corrupt frame midway, or a layer
// whose frames check out but whose open tokens this spec's open block cannot hold — is refused naming
// the layer, and frees what it staged: the store is gone, no buffer taken, no stream in progress.
TEST(KvStream, AFailedStagedStreamFreesWhatItStaged) {
  Prefilled p = prefill("hack:bits=2,pi=64", 150);
  std::mutex mutex;
  std::vector<std::weak_ptr<KvStore>> stores;  // every store the receiver staged into
  auto buffers = std::make_shared<BufferPool>(size_t(64) << 20);
  auto receiver = KvStreamReceiver::start(p.identity, {.port = 0, .io_timeout = 500ms, .buffers = buffers,
                                                       .staging = [&](const KvTransferInfo& info, std::string_view source, std::shared_ptr<KvReservation>)
                                                           -> Expected<std::unique_ptr<KvStaging>> {
                                                         SLIMKV_ASSIGN_OR_RETURN(std::shared_ptr<KvStore> store,
                                                                                 p.engine->new_kv_store());
                                                         {
                                                           std::lock_guard lock(mutex);
                                                           stores.push_back(store);
                                                         }
                                                         return stage_into_store(store, info, source, p.identity.model_id);
                                                       }});
  ASSERT_TRUE(receiver) << receiver.status().message();
  const auto info = *inspect_kv_transfer(p.transfer.data(), p.transfer.size(), "t");
  const auto ranges = kv_transfer_layer_ranges(info);
  const auto layer_payload = [&](const std::vector<uint8_t>& transfer, size_t l) {
    const KvTransferLayerRanges& range = ranges[l];
    std::vector<uint8_t> payload(8 + range.sealed_bytes + range.open_bytes, 0);
    payload[0] = uint8_t(l);
    std::memcpy(payload.data() + 8, transfer.data() + range.sealed_offset, range.sealed_bytes);
    std::memcpy(payload.data() + 8 + range.sealed_bytes, transfer.data() + range.open_offset, range.open_bytes);
    return payload;
  };
  const auto check_freed = [&](const std::string& id) {
    for (int i = 0; i < 200 && (*receiver)->stats().streams_in_progress > 0; ++i) std::this_thread::sleep_for(10ms);
    EXPECT_EQ((*receiver)->stats().streams_in_progress, 0);
    EXPECT_FALSE((*receiver)->wait_for(id, 50ms));
    std::lock_guard lock(mutex);
    ASSERT_FALSE(stores.empty());
    EXPECT_TRUE(stores.back().expired()) << id << ": the staged store outlived its stream";
    EXPECT_EQ(buffers->stats().held_buffers, 0) << id;
  };
  const int num_layers = p.identity.num_layers;
  ASSERT_GE(num_layers, 4);
  {
    // Layers 0 and 1 arrive (and are restored), layer 2's frame is corrupted after its CRC.
    RawSender sender((*receiver)->port(), p.identity, "f1");
    sender.write(KvFrameType::kKvHead, std::span<const uint8_t>(p.transfer).first(info.sealed_offset));
    sender.write(KvFrameType::kKvLayer, layer_payload(p.transfer, 0));
    sender.write(KvFrameType::kKvLayer, layer_payload(p.transfer, 1));
    sender.write_corrupted(KvFrameType::kKvLayer, layer_payload(p.transfer, 2));
    const std::string answer = sender.answer();
    EXPECT_NE(answer.find("layer 2: "), std::string::npos) << answer;
    EXPECT_NE(answer.find("KV_LAYER frame checksum mismatch"), std::string::npos) << answer;
  }
  check_freed("f1");
  {
    // Layer 1's first open value is not an FP16 value, every frame and the trailer computed over it:
    // only the layer's own check finds it.
    std::vector<uint8_t> odd = p.transfer;
    const float not_fp16 = 1.0f + 1.0f / 4096.0f;
    std::memcpy(odd.data() + ranges[1].open_offset, &not_fp16, 4);
    const auto trailer = kv_transfer_trailer(crc32c(odd.data(), info.trailer_offset));
    std::copy(trailer.begin(), trailer.end(), odd.begin() + ptrdiff_t(info.trailer_offset));
    RawSender sender((*receiver)->port(), p.identity, "f2");
    sender.write(KvFrameType::kKvHead, std::span<const uint8_t>(odd).first(info.sealed_offset));
    for (int l = 0; l < num_layers; ++l) sender.write(KvFrameType::kKvLayer, layer_payload(odd, size_t(l)));
    std::vector<uint8_t> finish(odd.begin() + ptrdiff_t(info.trailer_offset), odd.end());
    const std::string body = nlohmann::json{{"prompt_token_ids", p.prompt}, {"resume_token_ids", nlohmann::json::array()},
                                            {"next_token", 1}, {"endpoint", "/v1/completions"}}.dump();
    finish.insert(finish.end(), body.begin(), body.end());
    sender.write(KvFrameType::kFinish, finish);
    const std::string answer = sender.answer();
    EXPECT_NE(answer.find("layer 1 KV head 0"), std::string::npos) << answer;
    EXPECT_NE(answer.find("not FP16"), std::string::npos) << answer;
  }
  check_freed("f2");
  std::lock_guard lock(mutex);
  EXPECT_EQ(stores.size(), 2u);
}

// A staged stream's blocks are reserved in the receiving engine's KV budget (admissions leave them
// free: KvBudget::reserved_blocks) from its HELLO when that announces its tokens (a prefill worker's
// does), else from its head, and let go when its sender dies midway, as when the stream fails any other
// way; a transfer larger than the budget's blocks not reserved already is refused naming the counts.
// The orchestration is the GPU's too (Engine::new_kv_staging): only the placement differs.
TEST(KvStream, AStagedStreamReservesItsBlocksUntilItEnds) {
  Prefilled p = prefill("hack:bits=2,pi=64", 150);
  KvStreamReceiverOptions options{.port = 0, .io_timeout = 5s};
  options.staging = [&](const KvTransferInfo& info, std::string_view source, std::shared_ptr<KvReservation> reserved) {
    return p.engine->new_kv_staging(info, source, std::move(reserved));
  };
  options.reserve = [&](int64_t tokens, std::string_view source) { return p.engine->reserve_kv(tokens, source); };
  auto receiver = KvStreamReceiver::start(p.identity, options);
  ASSERT_TRUE(receiver) << receiver.status().message();
  const auto info = *inspect_kv_transfer(p.transfer.data(), p.transfer.size(), "t");
  const KvBudget budget = p.engine->kv_budget();
  ASSERT_EQ(budget.reserved_blocks, 0);
  const auto reserved_becomes = [&](int64_t blocks) {
    for (int i = 0; i < 300 && p.engine->kv_budget().reserved_blocks != blocks; ++i) std::this_thread::sleep_for(10ms);
    return p.engine->kv_budget().reserved_blocks == blocks;
  };
  {
    RawSender sender((*receiver)->port(), p.identity, "v1");
    sender.write(KvFrameType::kKvHead, std::span<const uint8_t>(p.transfer).first(info.sealed_offset));
    EXPECT_TRUE(reserved_becomes(budget.blocks_for_tokens(150)));
  }  // the sender dies before its first layer
  EXPECT_TRUE(reserved_becomes(0));
  {
    RawSender sender((*receiver)->port(), p.identity, "v1", "", 150);  // announcing its tokens: reserved before the head
    EXPECT_TRUE(reserved_becomes(budget.blocks_for_tokens(150)));
    sender.write(KvFrameType::kKvHead, std::span<const uint8_t>(p.transfer).first(info.sealed_offset));
    std::this_thread::sleep_for(50ms);
    EXPECT_EQ(p.engine->kv_budget().reserved_blocks, budget.blocks_for_tokens(150)) << "the head's staging took it over";
  }
  EXPECT_TRUE(reserved_becomes(0));
  for (int i = 0; i < 200 && (*receiver)->stats().streams_in_progress > 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ((*receiver)->stats().streams_in_progress, 0);

  // Laid out at HELLO (expected_head): a head that is not the one the announced tokens lay out fails
  // the stream naming them, and frees the staging and its reservation.
  KvStreamReceiverOptions laid_out = options;
  laid_out.expected_head = [&](int64_t tokens) { return p.engine->kv_transfer_head(tokens); };
  auto at_hello = KvStreamReceiver::start(p.identity, laid_out);
  ASSERT_TRUE(at_hello) << at_hello.status().message();
  {
    RawSender sender((*at_hello)->port(), p.identity, "v0", "", 149);
    EXPECT_TRUE(reserved_becomes(budget.blocks_for_tokens(149)));
    sender.write(KvFrameType::kKvHead, std::span<const uint8_t>(p.transfer).first(info.sealed_offset));
    const std::string answer = sender.answer();
    EXPECT_NE(answer.find("the KV_HEAD is not the head of the 149 tokens HELLO announced (total_tokens)"), std::string::npos)
        << answer;
  }
  EXPECT_TRUE(reserved_becomes(0));
  EXPECT_FALSE(p.engine->kv_transfer_head(-1));

  // A whole stream keeps its reservation, with its KV, until the holder lets go (the scheduler, at the
  // request's admission); meanwhile a transfer that would not fit beside it is refused.
  ASSERT_TRUE(send_kv_transfer(loopback((*receiver)->port()), p.identity, p.transfer, request_for(p, "v2"), {}).status);
  Expected<ReceivedKv> got = (*receiver)->wait_for("v2", 5s);
  ASSERT_TRUE(got) << got.status().message();
  ASSERT_TRUE(got->kv_reservation && got->staged_kv);
  const int64_t held = budget.blocks_for_tokens(150);
  EXPECT_EQ(got->kv_reservation->blocks(), held);
  EXPECT_EQ(p.engine->kv_budget().reserved_blocks, held);
  KvTransferInfo too_large = info;
  const int64_t want = budget.total_blocks - held + 1;
  for (int& tokens : too_large.layer_tokens) tokens = int(want) * budget.block_tokens;
  Expected<std::unique_ptr<KvStaging>> refused = p.engine->new_kv_staging(too_large, "a large one");
  ASSERT_FALSE(refused);
  const std::string message = refused.status().message();
  EXPECT_NE(message.find("'a large one'"), std::string::npos) << message;
  EXPECT_NE(message.find("need " + std::to_string(want) + " blocks of this worker's KV budget of " +
                         std::to_string(budget.total_blocks) + " blocks, of which " + std::to_string(held) + " are reserved"),
            std::string::npos)
      << message;
  EXPECT_EQ(p.engine->kv_budget().reserved_blocks, held);
  got->kv_reservation = nullptr;
  EXPECT_EQ(p.engine->kv_budget().reserved_blocks, 0);
}

TEST(KvStream, DeadReceiverFailsTheSenderWithinTheTimeout) {
  Prefilled p = prefill("dense:dtype=f16", 200);
  // A "receiver" that accepts, answers the handshake, then never reads again.
  auto listener = TcpListener::listen("127.0.0.1", 0);
  ASSERT_TRUE(listener);
  std::promise<void> release;
  std::thread stalled([&] {
    TcpConnection connection = listener->accept(5s).take();
    const KvFrame hello = *read_kv_frame(connection, SteadyClock::now() + 5s);
    EXPECT_EQ(hello.type, KvFrameType::kHello);
    const std::string accept = "{}";
    const std::span<const uint8_t> parts[] = {{reinterpret_cast<const uint8_t*>(accept.data()), accept.size()}};
    ASSERT_TRUE(write_kv_frame(connection, KvFrameType::kAccept, parts, nullptr, SteadyClock::now() + 5s));
    release.get_future().wait_for(10s);
  });
  const auto start = SteadyClock::now();
  const KvStreamSendResult sent =
      send_kv_transfer(loopback(listener->port()), p.identity, p.transfer, request_for(p, "r7"), {.io_timeout = 300ms});
  release.set_value();
  stalled.join();
  ASSERT_FALSE(sent.status);
  EXPECT_NE(sent.status.message().find("timed out"), std::string::npos) << sent.status.message();
  EXPECT_LT(SteadyClock::now() - start, 3s);
  // Nobody listening at all: a connection error, at once.
  const KvStreamSendResult nobody = send_kv_transfer("127.0.0.1:1", p.identity, p.transfer, request_for(p, "r8"), {});
  EXPECT_FALSE(nobody.status);
  EXPECT_FALSE(nobody.refused);
}

// The cap is an upper bound: a busy machine may send slower, never faster. The lower bound only checks
// that the sender is not stalled by something other than the cap.
TEST(KvStream, BandwidthCapIsNeverExceeded) {
  Prefilled p = prefill("dense", 600);  // ~10 MB of KV in FP32-open + FP16 blocks
  auto receiver = KvStreamReceiver::start(p.identity, {.port = 0});
  const double gbps = 0.2;
  const KvStreamSendResult sent = send_kv_transfer(loopback((*receiver)->port()), p.identity, p.transfer,
                                                   request_for(p, "r9"), {.bandwidth_gbps = gbps});
  ASSERT_TRUE(sent.status) << sent.status.message();
  const double achieved = double(sent.bytes_sent) * 8 / sent.seconds / 1e9;
  EXPECT_LE(achieved, 1.1 * gbps) << sent.bytes_sent << " bytes in " << sent.seconds << " s";
  EXPECT_GE(achieved, 0.25 * gbps) << sent.bytes_sent << " bytes in " << sent.seconds << " s";
  EXPECT_TRUE((*receiver)->wait_for("r9", 5s));
}

TEST(KvStream, LaterAttemptReplacesAnEarlierOne) {
  Prefilled p = prefill("dense", 70);
  auto receiver = KvStreamReceiver::start(p.identity, {.port = 0});
  KvStreamRequest first = request_for(p, "r10"), second = request_for(p, "r10");
  second.attempt = 1;
  second.next_token = 9;
  ASSERT_TRUE(send_kv_transfer(loopback((*receiver)->port()), p.identity, p.transfer, first, {}).status);
  ASSERT_TRUE(send_kv_transfer(loopback((*receiver)->port()), p.identity, p.transfer, second, {}).status);
  Expected<ReceivedKv> got = (*receiver)->wait_for("r10", 1s);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->request.attempt, 1);
  EXPECT_EQ(got->request.next_token, 9);
}

// A KV_BLOCKS frame that does not continue its layer's blocks, or after the head, fails the stream.
TEST(KvStream, BlocksOutOfOrderFailTheStream) {
  Prefilled p = prefill("dense", 150);
  auto receiver = KvStreamReceiver::start(p.identity, {.port = 0});
  const uint64_t slot = (p.identity.sealed_block_bytes + 63) / 64 * 64;
  std::vector<uint8_t> blocks(8 + slot * uint64_t(p.identity.num_kv_heads), 0);
  blocks[4] = 1;  // from block 1, none sent
  RawSender sender((*receiver)->port(), p.identity, "r11");
  sender.write(KvFrameType::kKvBlocks, blocks);
  const std::string answer = sender.answer();
  EXPECT_NE(answer.find("continuing at its block 0"), std::string::npos) << answer;
}

// A KV_BLOCKS frame is read straight into its buffer, head by head, its CRC checked at its end: a
// corrupt one is refused as corrupt, also when the corruption makes its prefix name blocks out of order
// (the frame is read to its end first, so the checksum, not the order, is named).
TEST(KvStream, CorruptBlocksFrameIsRefusedAsCorrupt) {
  Prefilled p = prefill("dense", 150);
  const uint64_t slot = (p.identity.sealed_block_bytes + 63) / 64 * 64;
  for (const bool in_prefix : {false, true}) {
    auto receiver = KvStreamReceiver::start(p.identity, {.port = 0});
    std::vector<uint8_t> blocks(8 + 2 * slot * uint64_t(p.identity.num_kv_heads), 0);
    if (in_prefix) blocks.resize(8);  // a flip in the middle lands in first_block's bytes
    RawSender sender((*receiver)->port(), p.identity, "corrupt-blocks");
    sender.write_corrupted(KvFrameType::kKvBlocks, blocks);
    const std::string answer = sender.answer();
    EXPECT_NE(answer.find("KV_BLOCKS frame checksum mismatch"), std::string::npos) << in_prefix << ": " << answer;
    EXPECT_FALSE((*receiver)->wait_for("corrupt-blocks", 50ms));
  }
}

// CUDA IPC only between two workers that name the same GPU (the UUID in HELLO and in the receiver's
// options); otherwise the stream is TCP's, unchanged.
TEST(KvStream, CudaIpcIsAcceptedOnlyForTheReceiversOwnGpu) {
  Prefilled p = prefill("dense", 70);
  const auto accepted = [&](const std::string& receiver_gpu, const std::string& sender_gpu) {
    auto receiver = KvStreamReceiver::start(p.identity, {.port = 0, .cuda_ipc_device = receiver_gpu});
    bool refused = false;
    auto sender = KvStreamSender::open(loopback((*receiver)->port()), p.identity, "ipc", 0,
                                       {.cuda_ipc_device = sender_gpu}, &refused);
    EXPECT_TRUE(sender) << sender.status().message();
    if (!sender || (*sender)->cuda_ipc()) return sender.has_value();
    // Not accepted: the TCP path, as before.
    const Status sent = (*sender)->send_transfer(p.transfer, request_for(p, "ipc"));
    EXPECT_TRUE(sent) << sent.message();
    Expected<ReceivedKv> got = (*receiver)->wait_for("ipc", 5s);
    EXPECT_TRUE(got && got->transfer == p.transfer && !got->device_kv);
    return false;
  };
  EXPECT_TRUE(accepted("GPU-1234", "GPU-1234"));
  EXPECT_FALSE(accepted("GPU-1234", "GPU-5678"));
  EXPECT_FALSE(accepted("", "GPU-1234"));
  EXPECT_FALSE(accepted("GPU-1234", ""));
}

// NCCL is offered by a sender with links and taken only by a receiver that accepts it (a decode worker
// with its KV in GPU memory and NCCL): to one that does not, the stream goes over TCP, unchanged, and no
// link is joined; the next stream offers a new link again.
TEST(KvStream, NcclOfferedToAReceiverWithoutItFallsBackToTcp) {
  Prefilled p = prefill("dense", 70);
  NcclLinks links;
  auto receiver = KvStreamReceiver::start(p.identity, {.port = 0});
  const std::string address = loopback((*receiver)->port());
  for (const char* id : {"nccl-1", "nccl-2"}) {
    bool refused = false;
    auto sender = KvStreamSender::open(address, p.identity, id, 0, {.nccl_links = &links}, &refused);
    ASSERT_TRUE(sender) << sender.status().message();
    EXPECT_FALSE((*sender)->nccl());
    EXPECT_STREQ((*sender)->transport(), "tcp");
    ASSERT_NE(links.find(address), nullptr);
    EXPECT_EQ(links.find(address)->link, nullptr);  // never joined
    const Status sent = (*sender)->send_transfer(p.transfer, request_for(p, id));
    EXPECT_TRUE(sent) << sent.message();
    Expected<ReceivedKv> got = (*receiver)->wait_for(id, 5s);
    EXPECT_TRUE(got && got->transfer == p.transfer && !got->device_kv);
  }
}

// The links kept are bounded: beyond the bound the least recently used idle one goes; one in use stays.
TEST(NcclLinks, TheLeastRecentlyUsedIdleLinkGoesBeyondTheBound) {
  NcclLinks links(2);
  const auto a = links.get_or_add("a");
  std::unique_lock a_in_use(a->in_use);
  links.get_or_add("b");
  links.get_or_add("c");  // a is in use: b, the next least recent, goes
  EXPECT_EQ(links.size(), 2u);
  EXPECT_EQ(links.find("a"), a);
  EXPECT_EQ(links.find("b"), nullptr);
  a_in_use.unlock();
  links.find("c");        // c more recent than a
  links.get_or_add("d");  // a goes now
  EXPECT_EQ(links.find("a"), nullptr);
  EXPECT_NE(links.find("c"), nullptr);
  EXPECT_NE(links.find("d"), nullptr);
  links.forget("d", links.find("c"));  // another key's link: nothing goes
  EXPECT_EQ(links.size(), 2u);
  links.forget("d", links.find("d"));
  EXPECT_EQ(links.size(), 1u);
}

// KV in GPU memory is the GPU's: a CPU engine says so instead of handing out anything.
TEST(KvStream, KvInGpuMemoryIsRefusedOnTheCpu) {
  Prefilled p = prefill("dense", 10);
  const SequenceId sequence = *p.engine->add_sequence();
  EXPECT_FALSE(p.engine->exports_kv_to_device());
  for (const KvStreamForm form : {KvStreamForm::kDeviceWhole, KvStreamForm::kDeviceLayers}) {
    const Status streamed = p.engine->stream_kv_in_next_step(sequence, [](KvTransferPiece) {}, form);
    EXPECT_NE(streamed.message().find("leaves through host memory only"), std::string::npos) << streamed.message();
  }
  const Expected<DeviceKvTransfer> exported = p.engine->export_kv_to_device(sequence);
  ASSERT_FALSE(exported);
  EXPECT_NE(exported.status().message().find("device 'cuda'"), std::string::npos) << exported.status().message();
}

// A KV_DEVICE frame is checked before any GPU memory is touched: its JSON, the pages it declares
// against the handshake's identity, the handle.
TEST(KvStream, MalformedKvDeviceFramesAreRefusedNamingTheField) {
  Prefilled p = prefill("hack:bits=2,pi=64", 70);
  auto receiver = KvStreamReceiver::start(p.identity, {.port = 0, .cuda_ipc_device = "GPU-1234"});
  const auto answer_to = [&](const std::string& json_text) {
    RawSender sender((*receiver)->port(), p.identity, "bad-device", "GPU-1234");
    std::vector<uint8_t> payload = {uint8_t(json_text.size()), uint8_t(json_text.size() >> 8), 0, 0};
    payload.insert(payload.end(), json_text.begin(), json_text.end());
    sender.write(KvFrameType::kKvDevice, payload);
    return sender.answer();
  };
  const uint64_t page = uint64_t(p.identity.num_kv_heads) * p.identity.sealed_block_bytes;
  const std::string handle(128, 'a');
  EXPECT_NE(answer_to("[1, 2]").find("KV_DEVICE frame's JSON is not an object"), std::string::npos);
  const std::string wrong_pages = answer_to(nlohmann::json{{"num_layers", p.identity.num_layers}, {"sealed_blocks", 1},
                                                           {"page_bytes", page + 1}, {"handle", handle}}.dump());
  EXPECT_NE(wrong_pages.find("pages of " + std::to_string(page) + " bytes"), std::string::npos) << wrong_pages;
  const std::string bad_handle = answer_to(nlohmann::json{{"num_layers", p.identity.num_layers}, {"sealed_blocks", 1},
                                                          {"page_bytes", page}, {"handle", "xyz"}}.dump());
  EXPECT_NE(bad_handle.find("handle must be 128 hex digits"), std::string::npos) << bad_handle;
  // Blocks ahead of KV_DEVICE come over NCCL only: on this CUDA IPC stream the frame is refused by name.
  RawSender early((*receiver)->port(), p.identity, "early-blocks", "GPU-1234");
  const std::string blocks = nlohmann::json{{"layer", 0}, {"first_block", 0}, {"blocks", 1}, {"total_blocks", 1},
                                            {"page_bytes", page}, {"nccl_piece_bytes", 0}}.dump();
  std::vector<uint8_t> payload = {uint8_t(blocks.size()), uint8_t(blocks.size() >> 8), 0, 0};
  payload.insert(payload.end(), blocks.begin(), blocks.end());
  early.write(KvFrameType::kKvDeviceBlocks, payload);
  const std::string not_nccl = early.answer();
  EXPECT_NE(not_nccl.find("KV_DEVICE_BLOCKS comes over NCCL only"), std::string::npos) << not_nccl;
}

}  // namespace
}  // namespace slimkv
