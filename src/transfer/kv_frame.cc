#include "transfer/kv_frame.h"

#include <algorithm>
#include <cstring>

#include "kv/transfer.h"

namespace slimkv {
namespace {

constexpr uint8_t kMagic[4] = {'S', 'K', 'V', 'S'};
// Bytes handed to the socket at once: small enough that a bandwidth cap paces a frame evenly.
constexpr size_t kWriteSliceBytes = size_t(64) << 10;

void store_u32(uint8_t* p, uint32_t value) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(value >> (8 * i));
}
uint32_t load_u32(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }

}  // namespace

const char* kv_frame_type_name(KvFrameType type) {
  switch (type) {
    case KvFrameType::kHello: return "HELLO";
    case KvFrameType::kAccept: return "ACCEPT";
    case KvFrameType::kRefuse: return "REFUSE";
    case KvFrameType::kKvHead: return "KV_HEAD";
    case KvFrameType::kKvLayer: return "KV_LAYER";
    case KvFrameType::kFinish: return "FINISH";
    case KvFrameType::kDone: return "DONE";
    case KvFrameType::kFailed: return "FAILED";
    case KvFrameType::kKvBlocks: return "KV_BLOCKS";
    case KvFrameType::kKvDevice: return "KV_DEVICE";
  }
  return "unknown";
}

Status write_kv_frame(TcpConnection& connection, KvFrameType type, std::span<const std::span<const uint8_t>> parts,
                      TokenBucket* bucket, SteadyClock::time_point deadline) {
  uint64_t payload_bytes = 0;
  for (const auto& part : parts) payload_bytes += part.size();
  if (payload_bytes > kKvFrameMaxPayloadBytes) {
    return error("KV stream to ", connection.peer(), ": a ", kv_frame_type_name(type), " frame of ", payload_bytes,
                 " bytes exceeds the protocol's ", kKvFrameMaxPayloadBytes, "-byte frame limit");
  }
  uint8_t header[kKvFrameHeaderBytes] = {};
  std::memcpy(header, kMagic, 4);
  header[4] = uint8_t(type);
  store_u32(header + 8, uint32_t(payload_bytes));
  uint32_t crc = crc32c(header, 12);
  for (const auto& part : parts) crc = crc32c(part.data(), part.size(), crc);
  store_u32(header + 12, crc);

  const auto send = [&](const uint8_t* data, size_t size) -> Status {
    for (size_t done = 0; done < size;) {
      const size_t slice = std::min(kWriteSliceBytes, size - done);
      if (bucket) bucket->take(slice);
      SLIMKV_RETURN_IF_ERROR(connection.write_all(data + done, slice, deadline));
      done += slice;
    }
    return Status::ok();
  };
  SLIMKV_RETURN_IF_ERROR(send(header, sizeof(header)));
  for (const auto& part : parts) SLIMKV_RETURN_IF_ERROR(send(part.data(), part.size()));
  return Status::ok();
}

Expected<KvFrame> read_kv_frame(TcpConnection& connection, SteadyClock::time_point deadline) {
  uint8_t header[kKvFrameHeaderBytes];
  SLIMKV_RETURN_IF_ERROR(connection.read_exact(header, sizeof(header), deadline).with_context("KV stream frame header"));
  if (std::memcmp(header, kMagic, 4) != 0) {
    return error("KV stream from ", connection.peer(), ": not a frame (the magic \"SKVS\" is missing): corrupt or not a KV stream");
  }
  if (header[5] != 0 || header[6] != 0 || header[7] != 0) {
    return error("KV stream from ", connection.peer(), ": a frame header's reserved bytes are not 0");
  }
  const uint32_t payload_bytes = load_u32(header + 8);
  if (payload_bytes > kKvFrameMaxPayloadBytes) {
    return error("KV stream from ", connection.peer(), ": a frame declares ", payload_bytes, " payload bytes, more than the ",
                 kKvFrameMaxPayloadBytes, " allowed");
  }
  KvFrame frame;
  frame.type = KvFrameType(header[4]);
  // Read a MiB at a time, the buffer growing with what arrives: a header that declares a gigabyte and
  // sends little costs what it sent, not a gigabyte (kv_stream_fuzz found the allocation up front).
  constexpr size_t kPiece = size_t(1) << 20;
  for (size_t got = 0; got < payload_bytes;) {
    const size_t n = std::min(kPiece, payload_bytes - got);
    frame.payload.resize(got + n);
    SLIMKV_RETURN_IF_ERROR(connection.read_exact(frame.payload.data() + got, n, deadline)
                               .with_context(str_cat("KV stream ", kv_frame_type_name(frame.type), " frame payload")));
    got += n;
  }
  const uint32_t computed = crc32c(frame.payload.data(), payload_bytes, crc32c(header, 12));
  if (computed != load_u32(header + 12)) {
    return error("KV stream from ", connection.peer(), ": ", kv_frame_type_name(frame.type), " frame checksum mismatch (stored CRC32C 0x",
                 std::hex, load_u32(header + 12), ", computed 0x", computed, std::dec, " over ", payload_bytes,
                 " payload bytes): the frame is corrupt");
  }
  if (header[4] < uint8_t(KvFrameType::kHello) || header[4] > uint8_t(KvFrameType::kKvDevice)) {
    return error("KV stream from ", connection.peer(), ": unknown frame type ", int(header[4]));
  }
  return frame;
}

}  // namespace slimkv
