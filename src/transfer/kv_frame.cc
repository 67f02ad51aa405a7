#include "transfer/kv_frame.h"

#include <algorithm>
#include <cstring>

#include "util/crc32c.h"

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
    case KvFrameType::kKvDeviceBlocks: return "KV_DEVICE_BLOCKS";
  }
  return "unknown";
}

Status write_kv_frame(TcpConnection& connection, KvFrameType type, std::span<const std::span<const uint8_t>> parts,
                      TokenBucket* bucket, SteadyClock::time_point deadline, uint32_t* part_crcs,
                      std::span<const std::optional<uint32_t>> known_crcs) {
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
  for (size_t i = 0; i < parts.size(); ++i) {
    const uint32_t part_crc = i < known_crcs.size() && known_crcs[i] ? *known_crcs[i] : crc32c(parts[i].data(), parts[i].size());
    if (part_crcs) part_crcs[i] = part_crc;
    crc = crc32c_combine(crc, part_crc, parts[i].size());
  }
  store_u32(header + 12, crc);

  // Capped: in slices, so that the cap paces a frame evenly. Uncapped: as much at once as the socket
  // takes (a send per 64 KiB cost ~a fifth of the loopback stream's time).
  const bool capped = bucket != nullptr && bucket->capped();
  const auto send = [&](const uint8_t* data, size_t size) -> Status {
    for (size_t done = 0; done < size;) {
      const size_t slice = capped ? std::min(kWriteSliceBytes, size - done) : size - done;
      if (capped) bucket->take(slice);
      SLIMKV_RETURN_IF_ERROR(connection.write_all(data + done, slice, deadline));
      done += slice;
    }
    return Status::ok();
  };
  SLIMKV_RETURN_IF_ERROR(send(header, sizeof(header)));
  for (const auto& part : parts) SLIMKV_RETURN_IF_ERROR(send(part.data(), part.size()));
  return Status::ok();
}

Expected<KvFrameReader> KvFrameReader::start(TcpConnection& connection, SteadyClock::time_point deadline) {
  uint8_t header[kKvFrameHeaderBytes];
  SLIMKV_RETURN_IF_ERROR(connection.read_exact(header, sizeof(header), deadline).with_context("KV stream frame header"));
  if (std::memcmp(header, kMagic, 4) != 0) {
    return error("KV stream from ", connection.peer(), ": not a frame (the magic \"SKVS\" is missing): corrupt or not a KV stream");
  }
  if (header[5] != 0 || header[6] != 0 || header[7] != 0) {
    return error("KV stream from ", connection.peer(), ": a frame header's reserved bytes are not 0");
  }
  KvFrameReader reader(connection, deadline);
  reader.payload_bytes_ = load_u32(header + 8);
  if (reader.payload_bytes_ > kKvFrameMaxPayloadBytes) {
    return error("KV stream from ", connection.peer(), ": a frame declares ", reader.payload_bytes_, " payload bytes, more than the ",
                 kKvFrameMaxPayloadBytes, " allowed");
  }
  reader.type_ = KvFrameType(header[4]);
  reader.stored_crc_ = load_u32(header + 12);
  reader.crc_ = crc32c(header, 12);
  return reader;
}

Expected<uint32_t> KvFrameReader::read(std::span<uint8_t> out) {
  if (out.size() > payload_bytes_ - read_bytes_) {
    return error("KV stream from ", connection_->peer(), ": reading ", out.size(), " more bytes of a ", kv_frame_type_name(type_),
                 " frame whose payload has ", payload_bytes_ - read_bytes_, " left");
  }
  // A piece at a time, checksummed as soon as it lands (still in cache).
  constexpr size_t kPiece = size_t(256) << 10;
  uint32_t crc = 0;
  for (size_t done = 0; done < out.size();) {
    const size_t n = std::min(kPiece, out.size() - done);
    SLIMKV_RETURN_IF_ERROR(connection_->read_exact(out.data() + done, n, deadline_)
                               .with_context(str_cat("KV stream ", kv_frame_type_name(type_), " frame payload")));
    crc = crc32c(out.data() + done, n, crc);
    done += n;
  }
  read_bytes_ += out.size();
  crc_ = crc32c_combine(crc_, crc, out.size());
  return crc;
}

Expected<uint32_t> KvFrameReader::read(std::span<const std::span<uint8_t>> outs) {
  size_t bytes = 0;
  for (const std::span<uint8_t> out : outs) bytes += out.size();
  if (bytes > payload_bytes_ - read_bytes_) {
    return error("KV stream from ", connection_->peer(), ": reading ", bytes, " more bytes of a ", kv_frame_type_name(type_),
                 " frame whose payload has ", payload_bytes_ - read_bytes_, " left");
  }
  SLIMKV_RETURN_IF_ERROR(connection_->read_exact(outs, deadline_)
                             .with_context(str_cat("KV stream ", kv_frame_type_name(type_), " frame payload")));
  // Places that follow one another in memory (a store's slots mostly do) are checksummed as one run:
  // crc32c's three streams need 12 KiB, and a 2-bit block is a few KiB.
  uint32_t crc = 0;
  for (size_t i = 0; i < outs.size();) {
    size_t run = outs[i].size(), next = i + 1;
    for (; next < outs.size() && outs[i].data() + run == outs[next].data(); ++next) run += outs[next].size();
    crc = crc32c(outs[i].data(), run, crc);
    i = next;
  }
  read_bytes_ += bytes;
  crc_ = crc32c_combine(crc_, crc, bytes);
  return crc;
}

Status KvFrameReader::finish() const {
  if (read_bytes_ != payload_bytes_) {
    return error("KV stream from ", connection_->peer(), ": ", payload_bytes_ - read_bytes_, " bytes of a ",
                 kv_frame_type_name(type_), " frame were not read");
  }
  if (crc_ != stored_crc_) {
    return error("KV stream from ", connection_->peer(), ": ", kv_frame_type_name(type_), " frame checksum mismatch (stored CRC32C 0x",
                 std::hex, stored_crc_, ", computed 0x", crc_, std::dec, " over ", payload_bytes_,
                 " payload bytes): the frame is corrupt");
  }
  if (uint8_t(type_) < uint8_t(KvFrameType::kHello) || uint8_t(type_) > uint8_t(KvFrameType::kKvDeviceBlocks)) {
    return error("KV stream from ", connection_->peer(), ": unknown frame type ", int(type_));
  }
  return Status::ok();
}

Expected<KvFrame> KvFrameReader::read_rest() {
  KvFrame frame;
  frame.type = type_;
  // The buffer grows with what arrives (kv_stream_fuzz found the allocation up front).
  constexpr size_t kPiece = size_t(1) << 20;
  const size_t rest = payload_bytes_ - read_bytes_;
  for (size_t got = 0; got < rest;) {
    const size_t n = std::min(kPiece, rest - got);
    frame.payload.resize(got + n);
    SLIMKV_RETURN_IF_ERROR(read(std::span(frame.payload).subspan(got, n)).status());
    got += n;
  }
  SLIMKV_RETURN_IF_ERROR(finish());
  return frame;
}

Expected<KvFrame> read_kv_frame(TcpConnection& connection, SteadyClock::time_point deadline) {
  SLIMKV_ASSIGN_OR_RETURN(KvFrameReader reader, KvFrameReader::start(connection, deadline));
  return reader.read_rest();
}

}  // namespace slimkv
