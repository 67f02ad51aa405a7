// The KV stream's framing (docs/kv_stream_protocol.md, "Frames"): every message is a 16-byte frame
// header and a payload, checked by a CRC32C over both, so that a corrupt or truncated frame is refused
// rather than imported.
//
//   offset 0  u8[4]  magic "SKVS"
//          4  u8     type (KvFrameType)
//          5  u8[3]  reserved, 0
//          8  u32    payload_bytes (little-endian), at most kKvFrameMaxPayloadBytes
//         12  u32    crc32c of header bytes [0, 12) followed by the payload
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "slimkv/status.h"
#include "transfer/tcp_connection.h"
#include "transfer/token_bucket.h"

namespace slimkv {

enum class KvFrameType : uint8_t {
  kHello = 1,    // sender → receiver: JSON, the sender's identity and the request (handshake)
  kAccept = 2,   // receiver → sender: JSON, the receiver's identity (it matches)
  kRefuse = 3,   // receiver → sender: JSON {"error"}: identities differ, or the receiver cannot take it
  kKvHead = 4,   // sender → receiver: the transfer's header and metadata (bytes [0, sealed_offset))
  kKvLayer = 5,  // sender → receiver: u32 layer, u32 first_block, the layer's sealed blocks from it, open tokens
  kFinish = 6,   // sender → receiver: the transfer's 16-byte trailer, then JSON (tokens, request)
  kDone = 7,     // receiver → sender: JSON: the whole stream arrived and checks out
  kFailed = 8,   // receiver → sender: JSON {"error"}: the stream arrived but does not check out
  kKvBlocks = 9,  // sender → receiver, before KV_HEAD: u32 layer, u32 first_block, sealed blocks of every head
  kKvDevice = 10,  // sender → receiver (CUDA IPC instead of KV_HEAD..KV_LAYER): u32 n, JSON [n bytes], open tokens' transfer
  kKvDeviceBlocks = 11,  // sender → receiver, before KV_DEVICE over NCCL: u32 n, JSON [n bytes]; a layer's pages follow on the link
};
const char* kv_frame_type_name(KvFrameType type);

inline constexpr size_t kKvFrameHeaderBytes = 16;
inline constexpr uint32_t kKvFrameMaxPayloadBytes = uint32_t(1) << 30;

struct KvFrame {
  KvFrameType type = KvFrameType::kHello;
  std::vector<uint8_t> payload;
};

// Writes one frame whose payload is the concatenation of `parts`, taking every byte from `bucket`
// (nullptr: no cap) as it goes out. part_crcs (nullptr, or one per part): each part's own CRC32C, which
// the frame's CRC is made of, for a caller that checksums the same bytes in another order (the KV
// stream's transfer CRC) without reading them again. known_crcs (empty, or one per part): the CRC32C of
// a part that its writer computed as it wrote the bytes (kv/transfer.h's writers): taken as it is, so
// that the frame reads those bytes once, to send them; a part without one is checksummed here.
Status write_kv_frame(TcpConnection& connection, KvFrameType type, std::span<const std::span<const uint8_t>> parts,
                      TokenBucket* bucket, SteadyClock::time_point deadline, uint32_t* part_crcs = nullptr,
                      std::span<const std::optional<uint32_t>> known_crcs = {});

// Reads one frame: magic, reserved bytes, size and CRC checked; errors name the peer and what was wrong.
Expected<KvFrame> read_kv_frame(TcpConnection& connection, SteadyClock::time_point deadline);

// The same in two calls, for a receiver that reads a large payload straight into where it belongs: the
// header (magic, reserved bytes, size and type checked), then the payload in pieces, each read into
// its place and checksummed while it is still in cache; then finish() checks the frame's CRC. A
// payload read this way is in use before its CRC is checked: the caller discards it all on an error.
class KvFrameReader {
 public:
  static Expected<KvFrameReader> start(TcpConnection& connection, SteadyClock::time_point deadline);
  KvFrameType type() const { return type_; }
  size_t payload_bytes() const { return payload_bytes_; }
  // The next `out.size()` payload bytes into `out`; their own CRC32C (crc32c_combine joins pieces).
  Expected<uint32_t> read(std::span<uint8_t> out);
  // The same into several places in turn (read in one go: give about a cache's worth, so that the CRC
  // reads them there); the CRC32C of all of them, in order.
  Expected<uint32_t> read(std::span<const std::span<uint8_t>> outs);
  // After the whole payload: the frame's CRC against its header's.
  Status finish() const;
  // The payload not read yet, read as it arrives (a MiB at a time: a header that declares a gigabyte and
  // sends little costs what it sent), then finish(): the frame, its payload those bytes.
  Expected<KvFrame> read_rest();

 private:
  KvFrameReader(TcpConnection& connection, SteadyClock::time_point deadline) : connection_(&connection), deadline_(deadline) {}
  TcpConnection* connection_;
  SteadyClock::time_point deadline_;
  KvFrameType type_ = KvFrameType::kHello;
  size_t payload_bytes_ = 0, read_bytes_ = 0;
  uint32_t stored_crc_ = 0, crc_ = 0;  // the header's, and that of what was read (header bytes [0, 12) on)
};

}  // namespace slimkv
