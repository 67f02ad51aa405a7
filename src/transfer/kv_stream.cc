// The KV stream's two ends (docs/kv_stream_protocol.md).
#include "transfer/kv_stream.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "engine/cuda_backend.h"
#include "kv/transfer.h"
#include "util/system_memory.h"

namespace slimkv {
namespace {

using nlohmann::json;

std::span<const uint8_t> bytes_of(const std::string& text) {
  return {reinterpret_cast<const uint8_t*>(text.data()), text.size()};
}

// A JSON payload, or an error naming the frame.
Expected<json> parse_json_payload(const KvFrame& frame, size_t offset, const std::string& where) {
  json parsed = json::parse(frame.payload.begin() + ptrdiff_t(offset), frame.payload.end(), nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return error(where, ": the ", kv_frame_type_name(frame.type), " frame's payload is not a JSON object");
  }
  return parsed;
}

bool is_receiver_error(const KvFrame& frame) {
  return frame.type == KvFrameType::kRefuse || frame.type == KvFrameType::kFailed;
}

// A REFUSE or FAILED frame as an error quoting the receiver's reason.
Status receiver_error(const KvFrame& frame, const std::string& where) {
  Expected<json> body = parse_json_payload(frame, 0, where);
  const std::string message = body && (*body)["error"].is_string() ? (*body)["error"].get<std::string>() : "no reason given";
  return error(where, ": the receiver ", frame.type == KvFrameType::kRefuse ? "refused" : "failed", " the stream: ", message);
}

// An error unless `frame` is of the expected type, saying which came instead (a REFUSE or FAILED
// quotes the receiver's error).
Status check_frame_type(const KvFrame& frame, KvFrameType expected, const std::string& where) {
  if (frame.type == expected) return Status::ok();
  if (is_receiver_error(frame)) return receiver_error(frame, where);
  return error(where, ": expected a ", kv_frame_type_name(expected), " frame, got ", kv_frame_type_name(frame.type));
}

// The frame that must come next.
Expected<KvFrame> expect_frame(TcpConnection& connection, KvFrameType expected, SteadyClock::time_point deadline,
                               const std::string& where) {
  Expected<KvFrame> frame = read_kv_frame(connection, deadline);
  if (!frame) return frame.status().with_context(where);
  SLIMKV_RETURN_IF_ERROR(check_frame_type(*frame, expected, where));
  return frame;
}

Expected<std::vector<int32_t>> token_ids_field(const json& body, const char* key, const std::string& where) {
  if (!body.contains(key) || !body[key].is_array()) return error(where, ": ", key, " must be an array of token ids");
  std::vector<int32_t> ids;
  for (const json& id : body[key]) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return error(where, ": ", key, " holds ", id.dump(), ", not a token id");
    }
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

// A sealed block's slot in a transfer: its bytes padded to 64.
uint64_t block_slot(uint64_t block_bytes) { return (block_bytes + 63) / 64 * 64; }

// Head g of `layer`'s block slot (every head's the same unless the identity lists each head's).
uint64_t head_stride(const KvStreamIdentity& identity, int layer, int g) {
  return block_slot(identity.head_block_bytes.empty()
                        ? identity.sealed_block_bytes
                        : identity.head_block_bytes[size_t(layer) * size_t(identity.num_kv_heads) + size_t(g)]);
}

// Where each head's blocks start in a frame of `blocks` blocks of every head of `layer` (head by head),
// and their end: num_kv_heads + 1 offsets.
std::vector<uint64_t> head_offsets(const KvStreamIdentity& identity, int layer, uint64_t blocks) {
  std::vector<uint64_t> offsets = {0};
  for (int g = 0; g < identity.num_kv_heads; ++g) offsets.push_back(offsets.back() + blocks * head_stride(identity, layer, g));
  return offsets;
}

// How many of a head's blocks (of `stride`-byte slots) a staged receiver reads and restores at once:
// about 256 KiB, what KvFrameReader checksums at once.
uint64_t blocks_per_piece(uint64_t stride) { return std::max<uint64_t>(1, (uint64_t(256) << 10) / stride); }

// The number of blocks a head has in `bytes` (every head's sealed blocks of `layer`, head by head), or an error.
Expected<int> blocks_per_head(const KvStreamIdentity& identity, int layer, size_t bytes, const std::string& what) {
  const uint64_t block_bytes = head_offsets(identity, layer, 1).back();
  if (block_bytes == 0 || bytes % block_bytes != 0) {
    return error(what, " of ", bytes, " bytes is not a whole number of blocks for ", identity.num_kv_heads,
                 " KV heads taking ", block_bytes, " bytes of block slots a block");
  }
  return int(bytes / block_bytes);
}

uint32_t load_u32_le(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }

// The 8 bytes before a KV_BLOCKS or KV_LAYER frame's blocks: u32 layer, u32 first block.
std::array<uint8_t, 8> layer_prefix(int layer, int first_block) {
  std::array<uint8_t, 8> prefix{};
  for (int i = 0; i < 4; ++i) {
    prefix[size_t(i)] = uint8_t(uint32_t(layer) >> (8 * i));
    prefix[size_t(4 + i)] = uint8_t(uint32_t(first_block) >> (8 * i));
  }
  return prefix;
}

// A CUDA IPC handle as JSON carries it (hex), and back.
std::string hex_of(std::span<const uint8_t> bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (const uint8_t b : bytes) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

bool bytes_of_hex(const std::string& hex, std::span<uint8_t> out) {
  if (hex.size() != 2 * out.size()) return false;
  const auto digit = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  for (size_t i = 0; i < out.size(); ++i) {
    const int high = digit(hex[2 * i]), low = digit(hex[2 * i + 1]);
    if (high < 0 || low < 0) return false;
    out[i] = uint8_t(high << 4 | low);
  }
  return true;
}

// KV_DEVICE's JSON: the pages' layout and the path's own field (the IPC handle, or NCCL's piece size).
json device_layout_json(const DeviceKvTransfer& kv, const char* path_key, const json& path_value) {
  return {{"num_layers", kv.num_layers}, {"sealed_blocks", kv.sealed_blocks}, {"page_bytes", kv.page_bytes}, {path_key, path_value}};
}

}  // namespace

std::string cuda_ipc_device_id(int gpu) {
  Expected<const CudaPlugin*> plugin = cuda_plugin();
  if (!plugin) return "";
  Expected<std::string> uuid = (*plugin)->device_uuid(gpu);
  return uuid ? *uuid : std::string();
}

Status nccl_available() {
  SLIMKV_ASSIGN_OR_RETURN(const CudaPlugin* plugin, cuda_plugin());
  return plugin->nccl_available();
}

uint64_t ReceivedKv::kv_bytes() const {
  return transfer.size() + (device_kv ? device_kv->open.size() + device_kv->pages_bytes() : 0) +
         (staged_kv ? staged_kv->memory().fast_bytes() : 0);
}

// ---------------------------------------------------------------------------------------------------
// Identity
// ---------------------------------------------------------------------------------------------------

json kv_identity_json(const KvStreamIdentity& identity) {
  json out = {{"model_id", identity.model_id},
              {"kv_spec", identity.kv_spec},
              {"transfer_format_version", identity.transfer_format_version},
              {"block_tokens", identity.block_tokens},
              {"sealed_block_bytes", identity.sealed_block_bytes},
              {"num_layers", identity.num_layers},
              {"num_kv_heads", identity.num_kv_heads},
              {"k_dim", identity.k_dim},
              {"v_dim", identity.v_dim}};
  if (!identity.head_block_bytes.empty()) out["head_block_bytes"] = identity.head_block_bytes;
  return out;
}

Expected<KvStreamIdentity> parse_kv_identity(const json& body, const std::string& where) {
  if (!body.is_object()) return error(where, ": identity must be a JSON object");
  KvStreamIdentity identity;
  const auto text = [&](const char* key, std::string& out) -> Status {
    if (!body.contains(key) || !body[key].is_string()) return error(where, ": identity field ", key, " must be a string");
    out = body[key].get<std::string>();
    return Status::ok();
  };
  const auto count = [&](const char* key, auto& out) -> Status {
    if (!body.contains(key) || !body[key].is_number_unsigned()) {
      return error(where, ": identity field ", key, " must be a non-negative integer");
    }
    out = body[key].get<std::remove_reference_t<decltype(out)>>();
    return Status::ok();
  };
  SLIMKV_RETURN_IF_ERROR(text("model_id", identity.model_id));
  SLIMKV_RETURN_IF_ERROR(text("kv_spec", identity.kv_spec));
  SLIMKV_RETURN_IF_ERROR(count("transfer_format_version", identity.transfer_format_version));
  SLIMKV_RETURN_IF_ERROR(count("block_tokens", identity.block_tokens));
  SLIMKV_RETURN_IF_ERROR(count("sealed_block_bytes", identity.sealed_block_bytes));
  SLIMKV_RETURN_IF_ERROR(count("num_layers", identity.num_layers));
  SLIMKV_RETURN_IF_ERROR(count("num_kv_heads", identity.num_kv_heads));
  SLIMKV_RETURN_IF_ERROR(count("k_dim", identity.k_dim));
  SLIMKV_RETURN_IF_ERROR(count("v_dim", identity.v_dim));
  if (body.contains("head_block_bytes")) {
    const json& heads = body["head_block_bytes"];
    const uint64_t expected = uint64_t(identity.num_layers) * uint64_t(identity.num_kv_heads);
    if (!heads.is_array() || heads.size() != expected) {
      return error(where, ": identity field head_block_bytes must be an array of num_layers × num_kv_heads = ", expected,
                   " block sizes");
    }
    for (const json& bytes : heads) {
      if (!bytes.is_number_unsigned() || bytes.get<uint64_t>() == 0 || bytes.get<uint64_t>() > identity.sealed_block_bytes) {
        return error(where, ": identity field head_block_bytes holds ", bytes.dump(), ", not a block size in [1, ",
                     identity.sealed_block_bytes, "] (sealed_block_bytes, the largest)");
      }
      identity.head_block_bytes.push_back(bytes.get<uint64_t>());
    }
  }
  return identity;
}

std::string kv_identity_mismatch(const KvStreamIdentity& sender, const KvStreamIdentity& receiver) {
  json a = kv_identity_json(sender), b = kv_identity_json(receiver);
  // Fields only one side has (head_block_bytes) are compared too: absent reads as null.
  for (const auto& [key, value] : b.items()) {
    if (!a.contains(key)) a[key] = nullptr;
  }
  std::string out;
  for (const auto& [key, value] : a.items()) {
    if (b.contains(key) && b[key] == value) continue;
    if (!out.empty()) out += "; ";
    out += str_cat(key, ": the prefill worker's ", value.dump(), ", this decode worker's ", b.value(key, json()).dump());
  }
  return out;
}

Expected<KvStreamIdentity> engine_kv_identity(Engine& engine) {
  SLIMKV_ASSIGN_OR_RETURN(const SequenceId sequence, engine.add_sequence());
  Expected<std::vector<uint8_t>> empty = engine.export_kv(sequence);
  (void)engine.remove_sequence(sequence);
  if (!empty) return empty.status().with_context("the KV stream identity");
  return transfer_kv_identity(*empty);
}

Expected<KvStreamIdentity> transfer_kv_identity(std::span<const uint8_t> transfer) {
  SLIMKV_ASSIGN_OR_RETURN(const KvTransferInfo info, inspect_kv_transfer(transfer.data(), transfer.size(), "an empty sequence"));
  return KvStreamIdentity{.model_id = info.model_id,
                          .kv_spec = info.spec,
                          .transfer_format_version = info.version,
                          .block_tokens = info.block_tokens,
                          .sealed_block_bytes = info.sealed_block_bytes,
                          .num_layers = info.shape.num_layers,
                          .num_kv_heads = info.shape.num_kv_heads,
                          .k_dim = info.shape.k_dim,
                          .v_dim = info.shape.v_dim,
                          .head_block_bytes = info.head_block_bytes};
}

// ---------------------------------------------------------------------------------------------------
// The sender
// ---------------------------------------------------------------------------------------------------

KvStreamSender::KvStreamSender(TcpConnection connection, const KvStreamIdentity& identity, const KvStreamSendOptions& options)
    : connection_(std::move(connection)), identity_(identity), options_(options), bucket_(options.bandwidth_gbps * 1e9),
      blocks_sent_(size_t(identity.num_layers), 0),
      early_crcs_(size_t(identity.num_layers), std::vector<PartCrc>(size_t(identity.num_kv_heads))) {}

void KvStreamSender::PartCrc::append(uint32_t part_crc, uint64_t part_bytes) {
  crc = crc32c_combine(crc, part_crc, part_bytes);
  bytes += part_bytes;
}

Status KvStreamSender::send(KvFrameType type, std::span<const std::span<const uint8_t>> parts, uint32_t* part_crcs,
                            std::span<const std::optional<uint32_t>> known_crcs) {
  const SteadyClock::time_point start = SteadyClock::now();
  const Status written = write_kv_frame(connection_, type, parts, &bucket_, start + options_.io_timeout, part_crcs, known_crcs);
  frames_seconds_ += std::chrono::duration<double>(SteadyClock::now() - start).count();
  if (!written.is_ok()) {
    // The receiver may have ended the stream with a reason (a head beyond its context, say) before
    // closing: that reason says more than the broken pipe.
    Expected<KvFrame> answer = read_kv_frame(connection_, SteadyClock::now() + std::chrono::seconds(1));
    if (answer && is_receiver_error(*answer)) return receiver_error(*answer, str_cat("KV stream to ", connection_.peer()));
    return written;
  }
  bytes_sent_ += kKvFrameHeaderBytes;
  for (const auto& part : parts) bytes_sent_ += part.size();
  return Status::ok();
}

Expected<std::unique_ptr<KvStreamSender>> KvStreamSender::open(const std::string& address,
                                                               const KvStreamIdentity& identity,
                                                               const std::string& request_id, int attempt,
                                                               const KvStreamSendOptions& options, bool* refused) {
  *refused = false;
  SLIMKV_ASSIGN_OR_RETURN(TcpConnection connection, TcpConnection::connect(address, options.connect_timeout));
  // KV in GPU memory travels as pages of one block size for every head: KV whose heads' sizes differ
  // (ZACK's ranks) offers neither CUDA IPC nor NCCL, and goes over TCP from host memory.
  KvStreamSendOptions offered = options;
  if (!identity.head_block_bytes.empty()) {
    offered.cuda_ipc_device.clear();
    offered.nccl_links = nullptr;
  }
  std::unique_ptr<KvStreamSender> sender(new KvStreamSender(std::move(connection), identity, offered));
  json hello_body = {{"stream_version", kKvStreamVersion},
                     {"request_id", request_id},
                     {"attempt", attempt},
                     {"identity", kv_identity_json(identity)}};
  if (options.total_tokens > 0) hello_body["total_tokens"] = options.total_tokens;  // the receiver reserves for them
  if (!offered.cuda_ipc_device.empty()) hello_body["cuda_ipc"] = {{"device", offered.cuda_ipc_device}};
  // NCCL: the link kept for this receiver, or a new one (the receiver makes its id, which comes back in
  // ACCEPT). Held through the handshake, so that one new link is joined once.
  std::shared_ptr<NcclPeerLink> nccl;
  std::unique_lock<std::mutex> nccl_hold;
  if (offered.nccl_links != nullptr) {
    nccl = offered.nccl_links->get_or_add(address);
    nccl_hold = std::unique_lock(nccl->in_use);
    hello_body["nccl"] = nccl->link ? json{{"link", hex_of(nccl->id)}} : json{{"new", true}};
    if (!offered.gpu_device.empty()) hello_body["nccl"]["device"] = offered.gpu_device;
  }
  const std::string hello = hello_body.dump();
  const std::span<const uint8_t> parts[] = {bytes_of(hello)};
  SLIMKV_RETURN_IF_ERROR(sender->send(KvFrameType::kHello, parts));
  const std::string where = str_cat("KV stream to ", address);
  Expected<KvFrame> answer = read_kv_frame(sender->connection_, SteadyClock::now() + options.io_timeout);
  if (!answer) return answer.status().with_context(where);
  *refused = answer->type == KvFrameType::kRefuse;
  SLIMKV_RETURN_IF_ERROR(check_frame_type(*answer, KvFrameType::kAccept, where));
  SLIMKV_ASSIGN_OR_RETURN(const json accept, parse_json_payload(*answer, 0, where));
  sender->cuda_ipc_ = !offered.cuda_ipc_device.empty() && accept.contains("cuda_ipc") && accept["cuda_ipc"] == true;
  if (nccl) SLIMKV_RETURN_IF_ERROR(sender->take_nccl_answer(accept.value("nccl", json()), address, std::move(nccl)));
  return sender;
}

Status KvStreamSender::take_nccl_answer(const json& answer, const std::string& address, std::shared_ptr<NcclPeerLink> nccl) {
  cuda::NcclId id{};
  const bool accepted = !cuda_ipc_ && answer.is_object() && answer.contains("link") && answer["link"].is_string() &&
                        bytes_of_hex(answer["link"].get<std::string>(), id);
  if (!accepted) {
    // The receiver cannot (no NCCL there, or the same GPU: CUDA IPC) or no longer knows the link (it
    // restarted): TCP now, and a new link next time.
    if (nccl->link) options_.nccl_links->forget(address, nccl);
    return Status::ok();
  }
  if (!nccl->link) {
    SLIMKV_ASSIGN_OR_RETURN(const CudaPlugin* plugin, cuda_plugin());
    Expected<std::shared_ptr<cuda::NcclLink>> joined = plugin->nccl_connect(id, 1, options_.gpu, options_.io_timeout);
    if (!joined) {
      options_.nccl_links->forget(address, nccl);
      return joined.status().with_context(str_cat("KV stream to ", address));
    }
    nccl->id = id;
    nccl->link = joined.take();
  } else if (id != nccl->id) {
    options_.nccl_links->forget(address, nccl);
    return error("KV stream to ", address, ": the receiver accepted NCCL link ", hex_of(id), ", not the one offered");
  }
  address_ = address;
  nccl_link_ = std::move(nccl);
  return Status::ok();
}

std::vector<std::span<const uint8_t>> KvStreamSender::head_parts(int layer, std::span<const uint8_t> blocks, int count,
                                                                 int skip) const {
  const std::vector<uint64_t> offsets = head_offsets(identity_, layer, uint64_t(count));
  std::vector<std::span<const uint8_t>> parts;
  for (int g = 0; g < identity_.num_kv_heads; ++g) {
    const uint64_t skipped = uint64_t(skip) * head_stride(identity_, layer, g);
    parts.push_back(blocks.subspan(offsets[size_t(g)] + skipped, offsets[size_t(g) + 1] - offsets[size_t(g)] - skipped));
  }
  return parts;
}

std::vector<std::optional<uint32_t>> KvStreamSender::known_part_crcs(std::span<const uint32_t> writer_crcs, int skip,
                                                                     size_t extra) const {
  std::vector<std::optional<uint32_t>> known;
  if (skip != 0 || writer_crcs.size() != size_t(identity_.num_kv_heads) + extra) return known;
  known.push_back(std::nullopt);  // the 8-byte prefix
  known.insert(known.end(), writer_crcs.begin(), writer_crcs.end());
  return known;
}

Status KvStreamSender::send_blocks(int layer, int first_block, std::span<const uint8_t> blocks,
                                   std::span<const uint32_t> head_crcs) {
  if (layer < 0 || layer >= identity_.num_layers) return error("KV stream: no layer ", layer, " to send blocks of");
  SLIMKV_ASSIGN_OR_RETURN(const int count, blocks_per_head(identity_, layer, blocks.size(), "KV stream: a layer's blocks"));
  int& sent = blocks_sent_[size_t(layer)];
  if (first_block > sent) {
    return error("KV stream: layer ", layer, "'s blocks from ", first_block, " on come after only ", sent, " were sent");
  }
  if (first_block + count <= sent) return Status::ok();  // all sent already
  const std::array<uint8_t, 8> prefix = layer_prefix(layer, sent);
  std::vector<std::span<const uint8_t>> parts = {prefix};
  const std::vector<std::span<const uint8_t>> heads = head_parts(layer, blocks, count, sent - first_block);
  parts.insert(parts.end(), heads.begin(), heads.end());
  std::vector<uint32_t> crcs(parts.size());
  SLIMKV_RETURN_IF_ERROR(send(KvFrameType::kKvBlocks, parts, crcs.data(), known_part_crcs(head_crcs, sent - first_block, 0)));
  sent = first_block + count;
  for (size_t g = 0; g < heads.size(); ++g) early_crcs_[size_t(layer)][g].append(crcs[1 + g], heads[g].size());
  return Status::ok();
}

Status KvStreamSender::send_head(std::span<const uint8_t> head) {
  crc_ = crc32c(head.data(), head.size());
  const std::span<const uint8_t> parts[] = {head};
  return send(KvFrameType::kKvHead, parts);
}

Status KvStreamSender::send_layer(int layer, int first_block, std::span<const uint8_t> sealed, std::span<const uint8_t> open,
                                  std::span<const uint32_t> part_crcs) {
  if (layer < 0 || layer >= identity_.num_layers) return error("KV stream: no layer ", layer, " to send");
  SLIMKV_ASSIGN_OR_RETURN(const int count,
                          blocks_per_head(identity_, layer, sealed.size(), "KV stream: a layer's sealed blocks"));
  const int sent = blocks_sent_[size_t(layer)];
  if (first_block > sent || first_block + count < sent) {
    return error("KV stream: layer ", layer, "'s blocks [", first_block, ", ", first_block + count, ") do not follow the ",
                 sent, " sent");
  }
  const std::array<uint8_t, 8> prefix = layer_prefix(layer, sent);
  std::vector<std::span<const uint8_t>> parts = {prefix};
  const std::vector<std::span<const uint8_t>> heads = head_parts(layer, sealed, count, sent - first_block);
  parts.insert(parts.end(), heads.begin(), heads.end());
  parts.push_back(open);
  std::vector<uint32_t> crcs(parts.size());
  SLIMKV_RETURN_IF_ERROR(send(KvFrameType::kKvLayer, parts, crcs.data(), known_part_crcs(part_crcs, sent - first_block, 1)));
  // The transfer's CRC takes the layer's blocks head by head: each head's early blocks, then its rest.
  for (size_t g = 0; g < heads.size(); ++g) {
    const PartCrc& early = early_crcs_[size_t(layer)][g];
    crc_ = crc32c_combine(crc32c_combine(crc_, early.crc, early.bytes), crcs[1 + g], heads[g].size());
  }
  early_crcs_[size_t(layer)].assign(heads.size(), PartCrc{});
  open_crcs_.push_back({.crc = crcs.back(), .bytes = open.size()});
  return Status::ok();
}

Status KvStreamSender::send_device(std::shared_ptr<const DeviceKvTransfer> kv) {
  if (!kv_on_device()) {
    return error("KV stream to ", connection_.peer(), ": KV in GPU memory, but the receiver accepted neither CUDA IPC nor NCCL");
  }
  SLIMKV_ASSIGN_OR_RETURN(const CudaPlugin* plugin, cuda_plugin());
  if (nccl()) return send_over_nccl(*plugin, std::move(kv));
  if (!kv->pages) return error("KV stream to ", connection_.peer(), ": CUDA IPC shares pages in GPU memory, and this KV has none");
  SLIMKV_ASSIGN_OR_RETURN(const auto handle, plugin->ipc_handle_of(kv->pages.get(), options_.gpu));
  SLIMKV_RETURN_IF_ERROR(send_device_frame(KvFrameType::kKvDevice, device_layout_json(*kv, "handle", hex_of(handle)), kv->open));
  device_kv_ = std::move(kv);  // the receiver copies from it until it answers
  return Status::ok();
}

Status KvStreamSender::send_device_frame(KvFrameType type, const json& header, std::span<const uint8_t> tail) {
  const std::string text = header.dump();
  const std::array<uint8_t, 4> length = {uint8_t(text.size()), uint8_t(text.size() >> 8), uint8_t(text.size() >> 16),
                                         uint8_t(text.size() >> 24)};
  const std::span<const uint8_t> parts[] = {length, bytes_of(text), tail};
  return send(type, parts);
}

Status KvStreamSender::hold_nccl_link(const CudaPlugin& plugin) {
  if (!nccl_hold_.owns_lock()) nccl_hold_ = std::unique_lock(nccl_link_->in_use);
  if (!nccl_link_->link || plugin.nccl_link_broken(*nccl_link_->link)) {
    options_.nccl_links->forget(address_, nccl_link_);
    return error("KV stream to ", connection_.peer(), " over NCCL: the link failed in another stream");
  }
  return Status::ok();
}

Status KvStreamSender::send_nccl_pages(const CudaPlugin& plugin, std::shared_ptr<const void> pages, uint64_t bytes) {
  // Issued without waiting (a wait per layer's piece cost more than the piece), the pages held until
  // the link has sent them; a wait now and then bounds the GPU memory held so.
  const Status sent = plugin.nccl_send(*nccl_link_->link, pages.get(), bytes, nccl_piece_bytes(),
                                       [this](uint64_t piece) { bucket_.take(size_t(piece)); }, options_.io_timeout);
  if (!sent.is_ok()) return nccl_failed(plugin, sent);
  in_flight_.push_back(std::move(pages));
  in_flight_bytes_ += bytes;
  bytes_sent_ += bytes;
  return in_flight_bytes_ > kMaxNcclBytesInFlight ? wait_for_nccl(plugin) : Status::ok();
}

Status KvStreamSender::wait_for_nccl(const CudaPlugin& plugin) {
  const Status done = plugin.nccl_wait(*nccl_link_->link, options_.io_timeout);
  if (!done.is_ok()) return nccl_failed(plugin, done);
  in_flight_.clear();
  in_flight_bytes_ = 0;
  return Status::ok();
}

Status KvStreamSender::nccl_failed(const CudaPlugin& plugin, const Status& failure) {
  if (plugin.nccl_link_broken(*nccl_link_->link)) options_.nccl_links->forget(address_, nccl_link_);
  return failure.with_context(str_cat("KV stream to ", connection_.peer(), " over NCCL"));
}

Status KvStreamSender::send_device_blocks(int layer, int first_block, const DeviceKvTransfer& blocks) {
  const std::string where = str_cat("KV stream to ", connection_.peer());
  if (!nccl()) return error(where, ": GPU pages go before the end over NCCL only (the receiver took ", transport(), ")");
  if (layer < 0 || layer >= identity_.num_layers || first_block < 0 || blocks.num_layers != 1 || blocks.sealed_blocks < 1 ||
      !blocks.pages) {
    return error(where, ": device blocks of layer ", layer, " from block ", first_block, " (", blocks.sealed_blocks,
                 " blocks of ", blocks.num_layers, " layers): expected one of ", identity_.num_layers, " layers' pages");
  }
  if (device_blocks_sent_.empty()) device_blocks_sent_.assign(size_t(identity_.num_layers), 0);
  int& sent = device_blocks_sent_[size_t(layer)];
  if (first_block + blocks.sealed_blocks <= sent) return Status::ok();  // a recomputed prompt's, sent before
  const int64_t total_blocks = options_.total_tokens / std::max(1, identity_.block_tokens);
  if (first_block != sent || first_block + blocks.sealed_blocks > total_blocks) {
    return error(where, ": device blocks ", first_block, "..", first_block + blocks.sealed_blocks - 1, " of layer ", layer,
                 " after ", sent, " sent, of ", total_blocks, " (", options_.total_tokens, " tokens)");
  }
  SLIMKV_ASSIGN_OR_RETURN(const CudaPlugin* plugin, cuda_plugin());
  SLIMKV_RETURN_IF_ERROR(hold_nccl_link(*plugin));
  const json header = {{"layer", layer},
                       {"first_block", first_block},
                       {"blocks", blocks.sealed_blocks},
                       {"total_blocks", total_blocks},
                       {"page_bytes", blocks.page_bytes},
                       {"nccl_piece_bytes", nccl_piece_bytes()}};
  SLIMKV_RETURN_IF_ERROR(send_device_frame(KvFrameType::kKvDeviceBlocks, header));
  SLIMKV_RETURN_IF_ERROR(send_nccl_pages(*plugin, blocks.pages, blocks.pages_bytes()));
  sent += blocks.sealed_blocks;
  return Status::ok();
}

Status KvStreamSender::send_over_nccl(const CudaPlugin& plugin, std::shared_ptr<const DeviceKvTransfer> kv) {
  SLIMKV_RETURN_IF_ERROR(hold_nccl_link(plugin));
  json header = device_layout_json(*kv, "nccl_piece_bytes", nccl_piece_bytes());
  if (!device_blocks_sent_.empty()) {  // every block went before: the layout and open tokens alone
    for (size_t l = 0; l < device_blocks_sent_.size(); ++l) {
      if (device_blocks_sent_[l] != kv->sealed_blocks || kv->pages) {
        return error("KV stream to ", connection_.peer(), ": layer ", l, "'s ", device_blocks_sent_[l],
                     " blocks sent before the end, of ", kv->sealed_blocks, kv->pages ? ", and pages again" : "");
      }
    }
    header["early"] = true;
    SLIMKV_RETURN_IF_ERROR(send_device_frame(KvFrameType::kKvDevice, header, kv->open));
  } else {
    if (!kv->pages && kv->sealed_blocks > 0) {
      return error("KV stream to ", connection_.peer(), ": ", kv->sealed_blocks, " blocks a layer, neither sent nor given");
    }
    SLIMKV_RETURN_IF_ERROR(send_device_frame(KvFrameType::kKvDevice, header, kv->open));
    if (kv->pages) SLIMKV_RETURN_IF_ERROR(send_nccl_pages(plugin, kv->pages, kv->pages_bytes()));
  }
  device_kv_ = std::move(kv);
  return wait_for_nccl(plugin);
}

Status KvStreamSender::send_piece(const KvTransferPiece& piece) {
  if (piece.ready) SLIMKV_RETURN_IF_ERROR(piece.ready());
  if (piece.device && piece.layer >= 0) return send_device_blocks(piece.layer, piece.first_block, *piece.device);
  if (piece.device) return send_device(piece.device);
  if (piece.layer < 0) return send_head(piece.bytes);
  if (!piece.final) return send_blocks(piece.layer, piece.first_block, piece.bytes, piece.crcs);
  return send_layer(piece.layer, piece.first_block, piece.bytes, piece.open, piece.crcs);
}

Status KvStreamSender::finish(const KvStreamRequest& request) {
  for (const PartCrc& open : open_crcs_) crc_ = crc32c_combine(crc_, open.crc, open.bytes);
  // Over a device path (CUDA IPC, NCCL) the trailer is zeros: the open tokens' transfer carries its own.
  std::array<uint8_t, kKvTransferTrailerBytes> transfer_trailer{};
  if (!device_kv_) transfer_trailer = kv_transfer_trailer(crc_);
  const std::string body = json{{"prompt_token_ids", request.prompt_token_ids},
                                {"resume_token_ids", request.resume_token_ids},
                                {"next_token", request.next_token},
                                {"endpoint", request.endpoint},
                                {"request", request.request}}.dump(-1, ' ', false, json::error_handler_t::replace);
  const std::span<const uint8_t> parts[] = {transfer_trailer, bytes_of(body)};
  SLIMKV_RETURN_IF_ERROR(send(KvFrameType::kFinish, parts));
  const std::string where = str_cat("KV stream to ", connection_.peer());
  Expected<KvFrame> done = expect_frame(connection_, KvFrameType::kDone, SteadyClock::now() + options_.io_timeout, where);
  if (nccl_hold_.owns_lock()) nccl_hold_.unlock();  // the receiver has its blocks: the link is free
  if (!done) return done.status();
  // The receiver's account of its time, when it gives one (kept as it came: it is for people to read).
  Expected<json> answer = parse_json_payload(*done, 0, where);
  if (answer && answer->contains("timing") && (*answer)["timing"].is_object()) receiver_timing_ = (*answer)["timing"];
  return Status::ok();
}

Status KvStreamSender::send_transfer(std::span<const uint8_t> transfer, const KvStreamRequest& request) {
  // The head's checks suffice here (the transfer is this worker's own export); the receiver checks it all.
  SLIMKV_ASSIGN_OR_RETURN(const KvTransferInfo info, inspect_kv_transfer_head(transfer.data(), transfer.size(), "the KV to send"));
  if (info.total_bytes != transfer.size()) {
    return error("the KV to send: ", transfer.size(), " bytes, its header declares ", info.total_bytes);
  }
  SLIMKV_RETURN_IF_ERROR(send_head(transfer.first(info.sealed_offset)));
  const std::vector<KvTransferLayerRanges> ranges = kv_transfer_layer_ranges(info);
  for (size_t l = 0; l < ranges.size(); ++l) {
    SLIMKV_RETURN_IF_ERROR(send_layer(int(l), 0, transfer.subspan(ranges[l].sealed_offset, ranges[l].sealed_bytes),
                                      transfer.subspan(ranges[l].open_offset, ranges[l].open_bytes)));
  }
  return finish(request);
}

KvStreamSendResult send_kv_transfer(const std::string& address, const KvStreamIdentity& identity,
                                    std::span<const uint8_t> transfer, const KvStreamRequest& request,
                                    const KvStreamSendOptions& options) {
  KvStreamSendResult result;
  const SteadyClock::time_point start = SteadyClock::now();
  Expected<std::unique_ptr<KvStreamSender>> sender =
      KvStreamSender::open(address, identity, request.request_id, request.attempt, options, &result.refused);
  if (!sender) {
    result.status = sender.status();
    return result;
  }
  result.status = (*sender)->send_transfer(transfer, request);
  result.bytes_sent = (*sender)->bytes_sent();
  result.seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  return result;
}

// ---------------------------------------------------------------------------------------------------
// The receiver
// ---------------------------------------------------------------------------------------------------

KvStreamReceiver::KvStreamReceiver(const KvStreamIdentity& identity, const KvStreamReceiverOptions& options,
                                   TcpListener listener)
    : identity_(identity), options_(options), listener_(std::move(listener)), port_(listener_.port()) {}

Expected<std::unique_ptr<KvStreamReceiver>> KvStreamReceiver::start(const KvStreamIdentity& identity,
                                                                   const KvStreamReceiverOptions& options) {
  SLIMKV_ASSIGN_OR_RETURN(TcpListener listener, TcpListener::listen(options.host, options.port));
  std::unique_ptr<KvStreamReceiver> receiver(new KvStreamReceiver(identity, options, std::move(listener)));
  KvStreamReceiver* self = receiver.get();
  receiver->acceptor_ = std::thread([self] { self->accept_loop(); });
  return receiver;
}

KvStreamReceiver::~KvStreamReceiver() { stop(); }

void KvStreamReceiver::stop() {
  stopping_ = true;
  if (acceptor_.joinable()) acceptor_.join();
  for (Worker& worker : workers_) worker.thread.join();  // their reads see stopping_ within ~100 ms
  workers_.clear();
  arrived_.notify_all();
}

void KvStreamReceiver::accept_loop() {
  while (!stopping_) {
    Expected<TcpConnection> connection = listener_.accept(std::chrono::milliseconds(100));
    // Reap the connections that ended (only this thread adds to workers_ until stop() joins it).
    std::erase_if(workers_, [](Worker& worker) {
      if (!worker.done->load()) return false;
      worker.thread.join();
      return true;
    });
    {
      std::lock_guard lock(mutex_);
      drop_stale_locked();
    }
    if (options_.buffers) options_.buffers->release_idle();
    if (!connection || !connection->is_open()) continue;
    connection->set_cancel_flag(&stopping_);
    if (int(workers_.size()) >= options_.max_connections) {
      const std::string refusal =
          json{{"error", str_cat("this decode worker receives ", options_.max_connections, " KV streams at once; retry")}}.dump();
      const std::span<const uint8_t> parts[] = {bytes_of(refusal)};
      (void)write_kv_frame(*connection, KvFrameType::kFailed, parts, nullptr, SteadyClock::now() + std::chrono::seconds(1));
      continue;
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    ++streams_in_progress_;
    workers_.push_back({std::thread([this, done, c = std::make_shared<TcpConnection>(connection.take())]() mutable {
                          receive(std::move(*c));  // every local of the stream freed when it returns
                          --streams_in_progress_;
                          *done = true;
                        }),
                        done});
  }
}

void KvStreamReceiver::drop_stale_locked() {
  const SteadyClock::time_point now = SteadyClock::now();
  // Complete and never claimed, or never completed (a sender that failed): either way, nobody will.
  std::erase_if(slots_, [&](const auto& entry) {
    if (now - entry.second.since <= options_.keep_unclaimed) return false;
    dropped_age_total_ += entry.second.complete;
    return true;
  });
}

void KvStreamReceiver::bound_unclaimed_locked() {
  // Memory: a router that sends prefills whose decode requests never come (or come late) must not make
  // a decode worker hold their KV unbounded. Oldest first, as they are the likeliest abandoned.
  uint64_t held = 0;
  std::vector<std::map<std::string, Slot>::iterator> droppable;
  for (auto it = slots_.begin(); it != slots_.end(); ++it) {
    if (!it->second.complete) continue;
    held += it->second.received.kv_bytes();
    if (!waiters_.contains(it->first)) droppable.push_back(it);
  }
  std::sort(droppable.begin(), droppable.end(), [](const auto& a, const auto& b) { return a->second.since < b->second.since; });
  for (auto it : droppable) {
    if (held <= options_.max_unclaimed_bytes) break;
    held -= it->second.received.kv_bytes();
    slots_.erase(it);
    ++dropped_bytes_total_;
  }
}

KvStreamReceiver::Stats KvStreamReceiver::stats() {
  std::lock_guard lock(mutex_);
  Stats stats{.unclaimed_streams = 0, .unclaimed_bytes = 0, .dropped_age_total = dropped_age_total_,
              .dropped_bytes_total = dropped_bytes_total_, .streams_in_progress = streams_in_progress_.load()};
  for (const auto& [id, slot] : slots_) {
    if (!slot.complete) continue;
    ++stats.unclaimed_streams;
    stats.unclaimed_bytes += slot.received.kv_bytes();
  }
  return stats;
}

void KvStreamReceiver::receive(TcpConnection connection) {
  ReceivedKv received;
  uint64_t serial = 0;
  json timing = json::object();
  const Status status = receive_stream(connection, received, serial, timing);
  const int attempt = received.request.attempt;
  const std::string id = received.request.request_id;  // a copy: `received` moves into the mailbox
  const uint64_t kv_bytes = received.kv_bytes();
  std::string answer_error;
  if (status.is_ok()) {
    std::lock_guard lock(mutex_);
    auto slot = slots_.find(id);
    if (slot == slots_.end() || slot->second.serial != serial) {
      answer_error = slot == slots_.end()
                         ? str_cat("KV stream for request ", id, " attempt ", attempt, ": it took longer than the receiver keeps streams")
                         : str_cat("KV stream for request ", id, " attempt ", attempt, ": superseded by a later stream (attempt ",
                                   slot->second.received.request.attempt, ")");
    } else {
      slot->second.complete = true;
      slot->second.since = SteadyClock::now();
      slot->second.received = std::move(received);
      bound_unclaimed_locked();
      if (slots_.contains(id)) {
        arrived_.notify_all();
      } else {
        answer_error = str_cat("KV stream for request ", id, " attempt ", attempt, ": dropped at once: this decode worker's ",
                               "unclaimed streams would hold more than ", options_.max_unclaimed_bytes, " bytes");
      }
    }
  } else {
    answer_error = status.message();
  }
  // A stream that failed (a sender that died midway, a corrupt layer) or was superseded: its buffer
  // goes back for the next stream.
  if (options_.buffers && !received.transfer.empty()) options_.buffers->give_back(std::move(received.transfer));
  if (serial == 0 && !status.is_ok()) {
    // Refused at the handshake (receive_stream answered REFUSE itself), or the sender vanished.
    return;
  }
  const std::string body = answer_error.empty()
                               ? json{{"kv_bytes", kv_bytes}, {"timing", timing}}.dump()
                               : json{{"error", answer_error}}.dump(-1, ' ', false, json::error_handler_t::replace);
  const std::span<const uint8_t> parts[] = {bytes_of(body)};
  (void)write_kv_frame(connection, answer_error.empty() ? KvFrameType::kDone : KvFrameType::kFailed, parts, nullptr,
                       SteadyClock::now() + options_.io_timeout);
  // A stream failed midway leaves the sender's bytes unread: drain them so that the FAILED frame is read.
  if (!answer_error.empty()) connection.close_after_drain(SteadyClock::now() + std::chrono::seconds(2));
}

Status KvStreamReceiver::receive_stream(TcpConnection& connection, ReceivedKv& received, uint64_t& serial, json& timing) {
  const auto deadline = [&] { return SteadyClock::now() + options_.io_timeout; };
  const auto seconds_since = [](SteadyClock::time_point since) {
    return std::chrono::duration<double>(SteadyClock::now() - since).count();
  };
  std::string where = str_cat("KV stream from ", connection.peer());
  const auto refuse = [&](const std::string& message) {
    const std::string body = json{{"error", message}}.dump(-1, ' ', false, json::error_handler_t::replace);
    const std::span<const uint8_t> parts[] = {bytes_of(body)};
    (void)write_kv_frame(connection, KvFrameType::kRefuse, parts, nullptr, deadline());
    return error(where, ": refused: ", message);
  };

  // The handshake.
  SLIMKV_ASSIGN_OR_RETURN(const KvFrame hello_frame, expect_frame(connection, KvFrameType::kHello, deadline(), where));
  const SteadyClock::time_point hello_at = SteadyClock::now();
  SLIMKV_ASSIGN_OR_RETURN(const json hello, parse_json_payload(hello_frame, 0, where));
  if (!hello.contains("stream_version") || !hello["stream_version"].is_number_unsigned() ||
      hello["stream_version"].get<uint64_t>() != kKvStreamVersion) {
    return refuse(str_cat("KV stream protocol version: the prefill worker's ", hello.value("stream_version", json()).dump(),
                          ", this decode worker's ", kKvStreamVersion));
  }
  if (!hello.contains("request_id") || !hello["request_id"].is_string() || hello["request_id"].get<std::string>().empty() ||
      hello["request_id"].get<std::string>().size() > 256) {
    return refuse("HELLO: request_id must be a string of 1 to 256 characters");
  }
  if (!hello.contains("attempt") || !hello["attempt"].is_number_unsigned() || hello["attempt"].get<uint64_t>() > INT32_MAX) {
    return refuse("HELLO: attempt must be a non-negative integer");
  }
  int64_t announced_tokens = 0;  // HELLO's total_tokens: what the KV will hold, when the sender knows it
  if (hello.contains("total_tokens")) {
    if (!hello["total_tokens"].is_number_unsigned() || hello["total_tokens"].get<uint64_t>() > uint64_t(options_.max_tokens)) {
      return refuse(str_cat("HELLO: total_tokens must be a non-negative integer, at most this decode worker's context of ",
                            options_.max_tokens, " tokens; got ", hello["total_tokens"].dump()));
    }
    announced_tokens = hello["total_tokens"].get<int64_t>();
  }
  Expected<KvStreamIdentity> sender = parse_kv_identity(hello.value("identity", json()), "HELLO");
  if (!sender) return refuse(sender.status().message());
  if (const std::string mismatch = kv_identity_mismatch(*sender, identity_); !mismatch.empty()) {
    return refuse("the prefill and decode workers disagree: " + mismatch);
  }
  received.request.request_id = hello["request_id"].get<std::string>();
  received.request.attempt = hello["attempt"].get<int>();
  where = str_cat(where, " (request ", received.request.request_id, " attempt ", received.request.attempt, ")");
  {
    // This attempt replaces any earlier one for the id (an earlier stream still arriving is discarded
    // when it ends; a complete one nobody claimed yet is dropped now).
    std::lock_guard lock(mutex_);
    serial = next_serial_++;
    Slot& slot = slots_[received.request.request_id];
    slot = Slot{.serial = serial, .complete = false, .received = {}, .since = SteadyClock::now()};
    slot.received.request.attempt = received.request.attempt;  // for the message to a superseded stream
  }
  // CUDA IPC when the sender offers it from this worker's GPU (and this worker takes it).
  const json offer = hello.value("cuda_ipc", json());
  const bool cuda_ipc = !options_.cuda_ipc_device.empty() && offer.is_object() && offer.contains("device") &&
                        offer["device"] == options_.cuda_ipc_device;
  // Else NCCL when the sender offers it (a GPU of its own) and this worker can.
  json nccl_answer = false;
  bool join = false;
  const std::shared_ptr<NcclPeerLink> nccl = cuda_ipc ? nullptr : take_nccl_offer(hello.value("nccl", json()), nccl_answer, join);
  const std::string accept =
      json{{"identity", kv_identity_json(identity_)}, {"cuda_ipc", cuda_ipc}, {"nccl", nccl_answer}}.dump();
  const std::span<const uint8_t> accept_parts[] = {bytes_of(accept)};
  SLIMKV_RETURN_IF_ERROR(write_kv_frame(connection, KvFrameType::kAccept, accept_parts, nullptr, deadline()));
  if (join) {
    // A new link: the sender joins it as soon as it reads the ACCEPT.
    std::lock_guard hold(nccl->in_use);
    SLIMKV_ASSIGN_OR_RETURN(const CudaPlugin* plugin, cuda_plugin());
    Expected<std::shared_ptr<cuda::NcclLink>> joined = plugin->nccl_connect(nccl->id, 0, options_.gpu, options_.io_timeout);
    if (!joined) {
      nccl_links_.forget(hex_of(nccl->id), nccl);
      return joined.status().with_context(where);
    }
    nccl->link = joined.take();
  }
  if (cuda_ipc || nccl) {
    received.wire_bytes += kKvFrameHeaderBytes + hello_frame.payload.size();
    SLIMKV_ASSIGN_OR_RETURN(const int held, receive_device(connection, received, where, nccl));
    std::array<uint8_t, kKvTransferTrailerBytes> trailer{};
    SLIMKV_RETURN_IF_ERROR(receive_finish(connection, received, trailer.data(), where));
    if (trailer != std::array<uint8_t, kKvTransferTrailerBytes>{}) {
      return error(where, ": FINISH after KV_DEVICE must carry a zero trailer (the open tokens' transfer has its own)");
    }
    const size_t tokens = received.request.prompt_token_ids.size() + received.request.resume_token_ids.size();
    if (size_t(held) != tokens) {
      return error(where, ": the KV holds ", held, " tokens per layer, but the prompt and resumed tokens are ", tokens);
    }
    timing["seconds"] = seconds_since(hello_at);
    return Status::ok();
  }

  // Sealed blocks of a long prompt's earlier chunks (or of a GPU prefill's layers, as its step computes
  // them: most of the KV), as the sender computed them, then the head, which sizes the transfer. The
  // sender computes between frames here: the head's longer wait. Each KV_BLOCKS frame is read straight
  // into a buffer of its size, each head's part checksummed as it lands: after the head its blocks are
  // copied into place once, their CRCs joined without reading them again. (Read as a whole frame, then
  // copied out of it and checksummed again, a GPU worker's KV took the receiver 2-4x the time of the
  // same bytes as KV_LAYER frames, and the sender's pacing waited on it: bench_kv_host_path --form blocks.)
  struct EarlyBlocks {
    int first_block = 0, count = 0;
    std::vector<uint8_t> bytes;          // every head's, head by head (empty: restored as they landed)
    std::vector<uint64_t> head_offsets;  // where each head's part starts in `bytes`
    std::vector<uint32_t> head_crcs;     // each head's part's CRC32C
  };
  // A staged stream whose tokens HELLO announced: their blocks reserved now, while the sender prefills.
  std::shared_ptr<KvReservation> reserved;
  if (options_.staging && options_.reserve && announced_tokens > 0) {
    Expected<std::shared_ptr<KvReservation>> reservation = options_.reserve(announced_tokens, where);
    if (reservation) reserved = reservation.take();  // else at the head, when there may be room
  }
  // Staged (engine/kv_staging.h), each piece of a layer's frame is restored into the staging's store as
  // soon as it has landed and been checksummed, while it is still in cache, and each complete layer
  // handed to the device's placement (the GPU uploads it): no buffer of the whole transfer, no second
  // pass over its bytes. Else the transfer is assembled in `transfer`, each layer read straight into its
  // place. With the head the tokens HELLO announced lay out (expected_head; the tokens reserved first
  // where the receiver reserves), the staging is made now and the KV_BLOCKS go into it as they land (the
  // KV_HEAD must then be that head); else at the KV_HEAD.
  std::unique_ptr<KvStaging> staging;
  KvStore* staged = nullptr;
  std::vector<uint8_t> laid_out_head;  // the head the staging was made from at HELLO; empty: none
  if (options_.staging && options_.expected_head && announced_tokens > 0 && (reserved || !options_.reserve)) {
    SLIMKV_ASSIGN_OR_RETURN(laid_out_head, options_.expected_head(announced_tokens));
    SLIMKV_ASSIGN_OR_RETURN(const KvTransferInfo laid_out,
                            inspect_kv_transfer_head(laid_out_head.data(), laid_out_head.size(), where));
    SLIMKV_ASSIGN_OR_RETURN(staging, options_.staging(laid_out, where, std::move(reserved)));
    staged = &staging->store();
  }
  // The pieces a head's blocks are read and restored in (whole block slots, about what KvFrameReader
  // checksums at once): straight into the store's slots where it has them in place, else into `piece`
  // and copied. The CRC of the blocks read; what the store refused of them (a block's padding) into
  // `restored`, reported once the frame's CRC checked out, so that a corrupt frame is named as one.
  std::vector<uint8_t> piece;
  std::vector<uint8_t*> slots;
  std::vector<std::span<uint8_t>> slot_spans;
  const auto stage_blocks = [&](KvFrameReader& reader, int l, int g, uint64_t first_block, uint64_t count,
                                Status& restored) -> Expected<uint32_t> {
    const KvTransferInfo& info = staging->info();
    const uint64_t stride = head_stride(identity_, l, g), piece_blocks = blocks_per_piece(stride);
    uint32_t crc = 0;
    for (uint64_t b = first_block; b < first_block + count; b += piece_blocks) {
      const uint64_t n = std::min(piece_blocks, first_block + count - b);
      slots.clear();
      slot_spans.clear();
      for (uint64_t i = 0; i < n; ++i) {
        uint8_t* slot = staged->restore_slot(l, g);
        if (!slot) break;
        slots.push_back(slot);
        slot_spans.emplace_back(slot, stride);
      }
      Expected<uint32_t> piece_crc = slots.size() == n ? reader.read(slot_spans) : [&] {
        piece.resize(size_t(n * stride));
        return reader.read(piece);
      }();
      if (!piece_crc) return piece_crc.status().with_context(where);
      crc = crc32c_combine(crc, *piece_crc, n * stride);
      if (!restored.is_ok()) continue;
      restored = slots.size() == n ? keep_kv_transfer_blocks(slots, info, l, g, int(b), where, *staged)
                                   : restore_kv_transfer_blocks(piece.data(), int(n), info, l, g, int(b), where, *staged);
    }
    return crc;
  };
  std::vector<std::vector<EarlyBlocks>> early(size_t(identity_.num_layers));
  std::vector<int> early_count(size_t(identity_.num_layers), 0);
  const int max_blocks = options_.max_tokens / std::max(1, identity_.block_tokens);
  KvFrame head;
  for (;;) {
    Expected<KvFrameReader> started = KvFrameReader::start(connection, SteadyClock::now() + options_.head_timeout);
    if (!started) return started.status().with_context(where);
    KvFrameReader& frame = *started;
    received.wire_bytes += kKvFrameHeaderBytes + frame.payload_bytes();
    // A frame found wrong before its end is read to its end first: a corrupt frame is named as one.
    const auto refuse_frame = [&](const Status& wrong) -> Status {
      SLIMKV_RETURN_IF_ERROR(frame.read_rest().status().with_context(where));
      return wrong;
    };
    if (frame.type() != KvFrameType::kKvBlocks) {
      Expected<KvFrame> rest = frame.read_rest();
      if (!rest) return rest.status().with_context(where);
      SLIMKV_RETURN_IF_ERROR(check_frame_type(*rest, KvFrameType::kKvHead, where));
      head = rest.take();
      break;
    }
    std::array<uint8_t, 8> prefix{};
    if (frame.payload_bytes() >= 8) SLIMKV_RETURN_IF_ERROR(frame.read(prefix).status().with_context(where));
    const uint32_t layer = frame.payload_bytes() >= 8 ? load_u32_le(prefix.data()) : UINT32_MAX;
    const uint32_t first = frame.payload_bytes() >= 8 ? load_u32_le(prefix.data() + 4) : UINT32_MAX;
    if (layer >= uint32_t(identity_.num_layers) || first != uint32_t(early_count[layer])) {
      return refuse_frame(error(where, ": a KV_BLOCKS frame for layer ", int64_t(layer == UINT32_MAX ? -1 : int64_t(layer)),
                                " from block ", int64_t(first == UINT32_MAX ? -1 : int64_t(first)), "; expected a layer below ",
                                identity_.num_layers, " continuing at its block ",
                                layer < uint32_t(identity_.num_layers) ? early_count[layer] : 0));
    }
    Expected<int> counted = blocks_per_head(identity_, int(layer), frame.payload_bytes() - 8, where + ": a KV_BLOCKS frame");
    if (!counted) return refuse_frame(counted.status());
    const int count = *counted;
    if (early_count[layer] + count > max_blocks) {
      return refuse_frame(error(where, ": KV_BLOCKS frames bring layer ", layer, " to ", early_count[layer] + count,
                                " blocks, more than the ", max_blocks, " of this worker's context (", options_.max_tokens,
                                " tokens)"));
    }
    EarlyBlocks& blocks = early[layer].emplace_back(
        EarlyBlocks{.first_block = int(first), .count = count, .bytes = {}, .head_offsets = {}, .head_crcs = {}});
    if (staged) {  // laid out at HELLO: restored as they land, nothing kept but their CRCs
      Status restored;
      for (int g = 0; g < identity_.num_kv_heads; ++g) {
        SLIMKV_ASSIGN_OR_RETURN(const uint32_t head_crc, stage_blocks(frame, int(layer), g, first, uint64_t(count), restored));
        blocks.head_crcs.push_back(head_crc);
      }
      SLIMKV_RETURN_IF_ERROR(frame.finish().with_context(where));
      SLIMKV_RETURN_IF_ERROR(restored);
      SLIMKV_RETURN_IF_ERROR(staging->blocks_restored(int(layer), int(first), count).with_context(where));
      early_count[layer] += count;
      continue;
    }
    assign_for_overwrite(blocks.bytes, frame.payload_bytes() - 8);
    blocks.head_offsets = head_offsets(identity_, int(layer), uint64_t(count));
    const std::vector<uint64_t>& offsets = blocks.head_offsets;
    for (size_t g = 0; g < size_t(identity_.num_kv_heads); ++g) {
      SLIMKV_ASSIGN_OR_RETURN(const uint32_t head_crc,
                              frame.read(std::span(blocks.bytes).subspan(offsets[g], offsets[g + 1] - offsets[g])));
      blocks.head_crcs.push_back(head_crc);
    }
    SLIMKV_RETURN_IF_ERROR(frame.finish().with_context(where));
    early_count[layer] += count;
  }
  timing["before_head_seconds"] = seconds_since(hello_at);
  double placing_seconds = 0;
  double staging_seconds = 0;  // in the staging's layer_complete and finish (the GPU: laying out, uploading)
  SLIMKV_ASSIGN_OR_RETURN(const KvTransferInfo info, inspect_kv_transfer_head(head.payload.data(), head.payload.size(), where));
  if (head.payload.size() != info.sealed_offset) {
    return error(where, ": the KV_HEAD frame holds ", head.payload.size(), " bytes, the transfer's head is ", info.sealed_offset);
  }
  if (info.spec != identity_.kv_spec || info.model_id != identity_.model_id) {
    return error(where, ": the transfer's head names spec '", info.spec, "' and model '", info.model_id,
                 "', not the handshake's");
  }
  for (size_t l = 0; l < info.layer_tokens.size(); ++l) {
    // Before the transfer is allocated: a head may declare far more than any prompt this worker takes.
    if (int64_t(info.layer_tokens[l]) > options_.max_tokens) {
      return error(where, ": the transfer's head declares ", info.layer_tokens[l], " tokens in layer ", l,
                   ", more than this decode worker's context of ", options_.max_tokens);
    }
  }
  received.wire_bytes += kKvFrameHeaderBytes + hello_frame.payload.size();
  std::vector<uint8_t>& transfer = received.transfer;
  if (staging) {
    if (head.payload != laid_out_head) {
      return error(where, ": the KV_HEAD is not the head of the ", announced_tokens, " tokens HELLO announced (total_tokens)");
    }
  } else if (options_.staging) {
    SLIMKV_ASSIGN_OR_RETURN(staging, options_.staging(info, where, std::move(reserved)));
    staged = &staging->store();
  } else {
    // Every byte of it is written below (head, each layer's ranges, trailer): a reused buffer is not zeroed first.
    if (options_.buffers) transfer = options_.buffers->take(info.total_bytes);
    assign_for_overwrite(transfer, info.total_bytes);
    std::memcpy(transfer.data(), head.payload.data(), head.payload.size());
  }
  std::vector<uint8_t> open;  // staged: a layer's open tokens
  // The transfer's CRC, joined from each piece's as it lands (crc32c_combine): the end-to-end check
  // below reads no byte again.
  uint32_t crc = crc32c(head.payload.data(), head.payload.size());

  // The layers, in order, each exactly its ranges' bytes less the blocks that came early.
  const std::vector<KvTransferLayerRanges> ranges = kv_transfer_layer_ranges(info);
  const uint64_t heads = uint64_t(identity_.num_kv_heads);
  std::vector<std::pair<uint32_t, uint64_t>> open_crcs;  // per layer: the open tokens' CRC and size
  for (size_t l = 0; l < ranges.size(); ++l) {
    Expected<KvFrameReader> started = KvFrameReader::start(connection, deadline());
    if (!started) return started.status().with_context(where);
    KvFrameReader& layer = *started;
    const auto read_into = [&](std::span<uint8_t> out) -> Expected<uint32_t> {
      Expected<uint32_t> piece_crc = layer.read(out);
      if (!piece_crc) return piece_crc.status().with_context(where);
      return piece_crc;
    };
    if (layer.type() != KvFrameType::kKvLayer) {
      return error(where, ": expected a KV_LAYER frame, got ", kv_frame_type_name(layer.type()));
    }
    const KvTransferLayerRanges& range = ranges[l];
    const uint64_t blocks = uint64_t(kv_transfer_sealed_blocks(info, int(l)));
    const uint64_t sent = uint64_t(early_count[l]);
    const uint64_t rest = blocks >= sent ? blocks - sent : 0;
    const uint64_t expected = 8 + head_offsets(identity_, int(l), rest).back() + range.open_bytes;
    std::array<uint8_t, 8> prefix{};
    if (layer.payload_bytes() >= 8) SLIMKV_RETURN_IF_ERROR(read_into(prefix).status());
    const uint32_t index = layer.payload_bytes() >= 8 ? load_u32_le(prefix.data()) : UINT32_MAX;
    const uint32_t first = layer.payload_bytes() >= 8 ? load_u32_le(prefix.data() + 4) : UINT32_MAX;
    if (index != l || first != sent || sent > blocks || layer.payload_bytes() != expected) {
      return error(where, ": expected layer ", l, " from block ", sent, " (of ", blocks, ") in ", expected,
                   " bytes, got a KV_LAYER frame for layer ", int64_t(index == UINT32_MAX ? -1 : int64_t(index)), " from block ",
                   int64_t(first == UINT32_MAX ? -1 : int64_t(first)), " of ", layer.payload_bytes(), " bytes");
    }
    Status restored;  // what the store refused of the layer's blocks (stage_blocks)
    // Each head's blocks: those that came early (checksummed as they landed: the CRC joined; staged at
    // HELLO, restored then; else copied once, or restored, now), then the rest.
    const std::vector<uint64_t> transfer_offsets = head_offsets(identity_, int(l), blocks);
    for (uint64_t g = 0; g < heads; ++g) {
      const uint64_t stride = head_stride(identity_, int(l), int(g)), piece_blocks = blocks_per_piece(stride);
      uint8_t* head_blocks = staged ? nullptr : transfer.data() + range.sealed_offset + transfer_offsets[g];
      const SteadyClock::time_point placing = SteadyClock::now();
      for (const EarlyBlocks& e : early[l]) {
        const uint64_t bytes = uint64_t(e.count) * stride;
        crc = crc32c_combine(crc, e.head_crcs[g], bytes);
        if (e.bytes.empty()) continue;  // restored as it landed
        const uint8_t* early_blocks = e.bytes.data() + e.head_offsets[g];
        if (!staged) {
          std::memcpy(head_blocks + uint64_t(e.first_block) * stride, early_blocks, bytes);
          continue;
        }
        for (uint64_t b = 0; b < uint64_t(e.count) && restored.is_ok(); b += piece_blocks) {
          restored = restore_kv_transfer_blocks(early_blocks + b * stride, int(std::min(piece_blocks, uint64_t(e.count) - b)),
                                                info, int(l), int(g), e.first_block + int(b), where, *staged);
        }
      }
      placing_seconds += seconds_since(placing);
      if (!staged) {
        SLIMKV_ASSIGN_OR_RETURN(const uint32_t rest_crc, read_into({head_blocks + sent * stride, rest * stride}));
        crc = crc32c_combine(crc, rest_crc, rest * stride);
        continue;
      }
      SLIMKV_ASSIGN_OR_RETURN(const uint32_t rest_crc, stage_blocks(layer, int(l), int(g), sent, rest, restored));
      crc = crc32c_combine(crc, rest_crc, rest * stride);
    }
    if (staged) open.resize(range.open_bytes);
    uint8_t* open_records = staged ? open.data() : transfer.data() + range.open_offset;
    SLIMKV_ASSIGN_OR_RETURN(const uint32_t open_crc, read_into({open_records, range.open_bytes}));
    SLIMKV_RETURN_IF_ERROR(layer.finish().with_context(str_cat(where, ": layer ", l)));
    SLIMKV_RETURN_IF_ERROR(restored);
    if (staged) {
      SLIMKV_RETURN_IF_ERROR(restore_kv_transfer_open(open_records, info, int(l), where, *staged));
      const SteadyClock::time_point placing_layer = SteadyClock::now();
      SLIMKV_RETURN_IF_ERROR(staging->layer_complete(int(l), open_records).with_context(where));
      staging_seconds += seconds_since(placing_layer);
    }
    open_crcs.emplace_back(open_crc, range.open_bytes);
    early[l].clear();
    received.wire_bytes += kKvFrameHeaderBytes + layer.payload_bytes();
  }
  for (const auto& [open_crc, bytes] : open_crcs) crc = crc32c_combine(crc, open_crc, bytes);

  // The trailer and the request; then the whole transfer is checked end to end (its own CRC).
  std::array<uint8_t, kKvTransferTrailerBytes> staged_trailer{};
  SLIMKV_RETURN_IF_ERROR(
      receive_finish(connection, received, staged ? staged_trailer.data() : transfer.data() + info.trailer_offset, where));
  if (staged) {
    // Every other check of the whole transfer was made piece by piece above.
    SLIMKV_RETURN_IF_ERROR(check_kv_transfer_trailer(staged_trailer.data(), info, crc, where));
  } else {
    SLIMKV_RETURN_IF_ERROR(inspect_kv_transfer_with_crc(transfer.data(), transfer.size(), where, crc).status());
  }
  received.received_crc = crc;
  const size_t tokens = received.request.prompt_token_ids.size() + received.request.resume_token_ids.size();
  for (size_t l = 0; l < info.layer_tokens.size(); ++l) {
    if (size_t(info.layer_tokens[l]) != tokens) {
      return error(where, ": layer ", l, " holds ", info.layer_tokens[l], " tokens, but the prompt and resumed tokens are ",
                   tokens);
    }
  }
  if (staging) {
    const SteadyClock::time_point finishing = SteadyClock::now();
    SLIMKV_ASSIGN_OR_RETURN(StagedKv staged_kv, staging->finish());
    staging_seconds += seconds_since(finishing);
    timing["staging_seconds"] = staging_seconds;
    received.staged_kv = std::move(staged_kv.store);
    received.device_kv = std::move(staged_kv.device);
    received.kv_reservation = std::move(staged_kv.reservation);
  }
  timing["placing_early_seconds"] = placing_seconds;
  timing["seconds"] = seconds_since(hello_at);
  return Status::ok();
}

Status KvStreamReceiver::receive_finish(TcpConnection& connection, ReceivedKv& received, uint8_t* trailer,
                                        const std::string& where) {
  SLIMKV_ASSIGN_OR_RETURN(const KvFrame finish, expect_frame(connection, KvFrameType::kFinish,
                                                             SteadyClock::now() + options_.io_timeout, where));
  if (finish.payload.size() < kKvTransferTrailerBytes) return error(where, ": the FINISH frame is shorter than a trailer");
  std::memcpy(trailer, finish.payload.data(), kKvTransferTrailerBytes);
  received.wire_bytes += kKvFrameHeaderBytes + finish.payload.size();
  SLIMKV_ASSIGN_OR_RETURN(const json body, parse_json_payload(finish, kKvTransferTrailerBytes, where));
  KvStreamRequest& request = received.request;
  SLIMKV_ASSIGN_OR_RETURN(request.prompt_token_ids, token_ids_field(body, "prompt_token_ids", where));
  SLIMKV_ASSIGN_OR_RETURN(request.resume_token_ids, token_ids_field(body, "resume_token_ids", where));
  if (!body.contains("next_token") || !body["next_token"].is_number_integer() || body["next_token"].get<int64_t>() < 0 ||
      body["next_token"].get<int64_t>() > INT32_MAX) {
    return error(where, ": FINISH: next_token must be a token id");
  }
  request.next_token = body["next_token"].get<int32_t>();
  if (!body.contains("endpoint") || !body["endpoint"].is_string()) return error(where, ": FINISH: endpoint must be a string");
  request.endpoint = body["endpoint"].get<std::string>();
  request.request = body.value("request", json::object());
  return Status::ok();
}

std::shared_ptr<NcclPeerLink> KvStreamReceiver::take_nccl_offer(const json& offer, json& answer, bool& join) {
  if (!options_.nccl || !offer.is_object()) return nullptr;
  // A sender on this very GPU (a capped link between two workers of one GPU: CUDA IPC not offered):
  // NCCL refuses two ranks on one device, so TCP it is.
  if (offer.contains("device") && offer["device"] == options_.cuda_ipc_device) return nullptr;
  Expected<const CudaPlugin*> plugin = cuda_plugin();
  if (!plugin) return nullptr;
  if (offer.contains("new") && offer["new"] == true) {
    // This side makes the id: rank 0 waits for the sender from now on, and the sender joins once it
    // reads the id in ACCEPT.
    Expected<cuda::NcclId> id = (*plugin)->nccl_new_id();
    if (!id) return nullptr;
    std::shared_ptr<NcclPeerLink> link = nccl_links_.get_or_add(hex_of(*id));
    link->id = *id;
    answer = {{"link", hex_of(*id)}};
    join = true;
    return link;
  }
  if (!offer.contains("link") || !offer["link"].is_string()) return nullptr;
  std::shared_ptr<NcclPeerLink> link = nccl_links_.find(offer["link"].get<std::string>());
  if (!link) return nullptr;
  std::lock_guard hold(link->in_use);
  if (!link->link || (*plugin)->nccl_link_broken(*link->link)) return nullptr;
  answer = {{"link", hex_of(link->id)}};
  return link;
}

namespace {

// A KV_DEVICE / KV_DEVICE_BLOCKS frame's JSON (after its u32 length), and where the rest of it starts.
Expected<std::pair<json, size_t>> device_frame_json(const KvFrame& frame, const std::string& where) {
  const size_t header_bytes = frame.payload.size() >= 4 ? load_u32_le(frame.payload.data()) : 0;
  if (frame.payload.size() < 4 || header_bytes > frame.payload.size() - 4) {
    return error(where, ": the ", kv_frame_type_name(frame.type), " frame of ", frame.payload.size(),
                 " bytes does not hold the JSON it declares");
  }
  const auto json_begin = frame.payload.begin() + 4, json_end = json_begin + ptrdiff_t(header_bytes);
  json header = json::parse(json_begin, json_end, nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return error(where, ": the ", kv_frame_type_name(frame.type), " frame's JSON is not an object");
  }
  return std::pair<json, size_t>(std::move(header), 4 + header_bytes);
}

// A non-negative integer field of a frame's JSON, or -1.
int64_t count_field(const json& header, const char* key) {
  return header.contains(key) && header[key].is_number_unsigned() && header[key].get<uint64_t>() <= uint64_t(INT64_MAX)
             ? header[key].get<int64_t>()
             : -1;
}

}  // namespace

Expected<int> KvStreamReceiver::receive_device(TcpConnection& connection, ReceivedKv& received, const std::string& where,
                                               const std::shared_ptr<NcclPeerLink>& nccl) {
  if (!identity_.head_block_bytes.empty()) {  // never offered so (KvStreamSender::open)
    return error(where, ": KV in GPU memory for KV whose heads' block sizes differ (ZACK's ranks): such KV goes over TCP");
  }
  const int64_t max_blocks = options_.max_tokens / std::max(1, identity_.block_tokens);
  const uint64_t expected_page_bytes = uint64_t(identity_.num_kv_heads) * identity_.sealed_block_bytes;
  // The plugin once a frame checks out (a malformed one is refused by what it holds, in any build).
  const CudaPlugin* plugin = nullptr;
  const auto load_plugin = [&]() -> Status {
    if (plugin != nullptr) return Status::ok();
    SLIMKV_ASSIGN_OR_RETURN(plugin, cuda_plugin());
    return Status::ok();
  };
  std::unique_lock<std::mutex> hold;  // the NCCL link, from the first pages received to the last
  // Each receive is waited for before the next frame (the sender keeps its sends issued ahead): none is
  // left writing into memory an error frees.
  const auto nccl_receive = [&](void* to, uint64_t bytes, int64_t piece_bytes) -> Status {
    if (!hold.owns_lock()) hold = std::unique_lock(nccl->in_use);
    Status got = plugin->nccl_receive(*nccl->link, to, bytes, uint64_t(piece_bytes), options_.io_timeout);
    if (got.is_ok()) got = plugin->nccl_wait(*nccl->link, options_.io_timeout);
    if (!got.is_ok() && plugin->nccl_link_broken(*nccl->link)) nccl_links_.forget(hex_of(nccl->id), nccl);
    return got.with_context(where);
  };
  // Over NCCL a layer's blocks may come as the prefill seals them (KV_DEVICE_BLOCKS), each layer's in
  // order, into pages sized by the stream's total blocks; KV_DEVICE then brings the layout and open tokens.
  std::shared_ptr<void> early_pages;
  int64_t total_blocks = -1;
  std::vector<int64_t> early_blocks;  // per layer: received so far
  KvFrame frame;
  for (;;) {
    // The sender prefills between the handshake and these frames: the head's longer wait.
    Expected<KvFrame> read = read_kv_frame(connection, SteadyClock::now() + options_.head_timeout);
    if (!read) return read.status().with_context(where);
    frame = read.take();
    received.wire_bytes += kKvFrameHeaderBytes + frame.payload.size();
    if (frame.type != KvFrameType::kKvDeviceBlocks) break;
    if (!nccl) return error(where, ": KV_DEVICE_BLOCKS comes over NCCL only");
    SLIMKV_ASSIGN_OR_RETURN(const auto parsed, device_frame_json(frame, where));
    const json& header = parsed.first;
    const int64_t layer = count_field(header, "layer"), first = count_field(header, "first_block"),
                  blocks = count_field(header, "blocks"), total = count_field(header, "total_blocks"),
                  page_bytes = count_field(header, "page_bytes"), piece_bytes = count_field(header, "nccl_piece_bytes");
    if (early_blocks.empty()) {
      SLIMKV_RETURN_IF_ERROR(load_plugin());
      early_blocks.assign(size_t(identity_.num_layers), 0);
      total_blocks = total;
      if (total_blocks >= 1 && total_blocks <= max_blocks && uint64_t(page_bytes) == expected_page_bytes) {
        SLIMKV_ASSIGN_OR_RETURN(early_pages, plugin->shared_device_allocation_on(
                                                 options_.gpu, size_t(identity_.num_layers) * size_t(total_blocks) * expected_page_bytes,
                                                 "KV blocks received over NCCL"));
      }
    }
    if (layer < 0 || layer >= identity_.num_layers || blocks < 1 || total != total_blocks || !early_pages ||
        first != early_blocks[size_t(layer)] || first + blocks > total || uint64_t(page_bytes) != expected_page_bytes ||
        piece_bytes < 0) {
      return error(where, ": KV_DEVICE_BLOCKS declares layer ", layer, " blocks ", first, "+", blocks, " of ", total,
                   ", pages of ", page_bytes, " bytes, pieces of ", piece_bytes, "; expected a layer below ",
                   identity_.num_layers, " from block ", layer >= 0 && layer < identity_.num_layers ? early_blocks[size_t(layer)] : 0,
                   ", of ", total_blocks, " blocks (at most ", max_blocks, "), pages of ", expected_page_bytes, " bytes");
    }
    auto* to = static_cast<uint8_t*>(early_pages.get()) + (uint64_t(layer) * uint64_t(total) + uint64_t(first)) * expected_page_bytes;
    SLIMKV_RETURN_IF_ERROR(nccl_receive(to, uint64_t(blocks) * expected_page_bytes, piece_bytes));
    early_blocks[size_t(layer)] += blocks;
  }
  SLIMKV_RETURN_IF_ERROR(check_frame_type(frame, KvFrameType::kKvDevice, where));
  SLIMKV_ASSIGN_OR_RETURN(const auto parsed, device_frame_json(frame, where));
  const json& header = parsed.first;
  const int64_t layers = count_field(header, "num_layers"), blocks = count_field(header, "sealed_blocks"),
                page_bytes = count_field(header, "page_bytes");
  if (layers != identity_.num_layers || blocks < 0 || blocks > max_blocks || page_bytes < 0 ||
      uint64_t(page_bytes) != expected_page_bytes) {
    return error(where, ": KV_DEVICE declares ", layers, " layers × ", blocks, " blocks × ", page_bytes,
                 "-byte pages; expected ", identity_.num_layers, " layers, at most ", max_blocks, " blocks (",
                 options_.max_tokens, " tokens), pages of ", expected_page_bytes, " bytes");
  }
  const bool early = header.value("early", false);
  if (early != !early_blocks.empty() ||
      (early && (blocks != total_blocks || std::any_of(early_blocks.begin(), early_blocks.end(),
                                                       [&](int64_t got) { return got != blocks; })))) {
    return error(where, ": KV_DEVICE of ", blocks, " blocks a layer ", early ? "sent before" : "to come",
                 ", after ", early_blocks.empty() ? 0 : early_blocks.front(), " blocks of layer 0 received before");
  }
  std::array<uint8_t, 64> handle{};
  const int64_t piece_bytes = count_field(header, "nccl_piece_bytes");
  if (nccl && piece_bytes < 0) return error(where, ": KV_DEVICE over NCCL must give nccl_piece_bytes (a byte count, 0: one piece)");
  if (!nccl && (!header.contains("handle") || !header["handle"].is_string() ||
                !bytes_of_hex(header["handle"].get<std::string>(), handle))) {
    return error(where, ": KV_DEVICE's handle must be ", 2 * handle.size(), " hex digits");
  }
  auto kv = std::make_shared<DeviceKvTransfer>();
  kv->open.assign(frame.payload.begin() + ptrdiff_t(parsed.second), frame.payload.end());
  kv->num_layers = int(layers);
  kv->sealed_blocks = int(blocks);
  kv->page_bytes = uint64_t(page_bytes);
  SLIMKV_ASSIGN_OR_RETURN(const KvTransferInfo open, inspect_kv_transfer(kv->open.data(), kv->open.size(), where + ": the open tokens"));
  if (open.spec != identity_.kv_spec || open.model_id != identity_.model_id) {
    return error(where, ": the open tokens' transfer names spec '", open.spec, "' and model '", open.model_id,
                 "', not the handshake's");
  }
  for (size_t l = 0; l < open.layer_tokens.size(); ++l) {
    if (open.layer_tokens[l] != open.layer_tokens[0] || open.layer_tokens[l] >= identity_.block_tokens) {
      return error(where, ": the open tokens' transfer holds ", open.layer_tokens[l], " tokens in layer ", l, " and ",
                   open.layer_tokens[0], " in layer 0: expected one count below a block");
    }
  }
  SLIMKV_RETURN_IF_ERROR(load_plugin());
  if (early) {
    kv->pages = std::move(early_pages);
  } else if (nccl) {
    SLIMKV_ASSIGN_OR_RETURN(kv->pages, plugin->shared_device_allocation_on(options_.gpu, kv->pages_bytes(),
                                                                           "KV blocks received over NCCL"));
    SLIMKV_RETURN_IF_ERROR(nccl_receive(kv->pages.get(), kv->pages_bytes(), piece_bytes));
  } else {
    SLIMKV_ASSIGN_OR_RETURN(kv->pages, plugin->copy_from_ipc_handle(handle, kv->pages_bytes(), options_.gpu));
  }
  received.device_kv = std::move(kv);
  return int(blocks) * identity_.block_tokens + open.layer_tokens.at(0);
}

Expected<ReceivedKv> KvStreamReceiver::wait_for(const std::string& request_id, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  ++waiters_[request_id];
  const bool arrived = arrived_.wait_for(lock, timeout, [&] {
    if (stopping_) return true;
    auto slot = slots_.find(request_id);
    return slot != slots_.end() && slot->second.complete;
  });
  if (--waiters_[request_id] == 0) waiters_.erase(request_id);
  auto slot = slots_.find(request_id);
  if (!arrived || slot == slots_.end() || !slot->second.complete) {
    if (stopping_) return error("the KV stream for request ", request_id, " did not arrive: the worker is shutting down");
    return error("the KV stream for request ", request_id, " did not arrive within ",
                 std::chrono::duration<double>(timeout).count(), " s");
  }
  ReceivedKv received = std::move(slot->second.received);
  slots_.erase(slot);
  return received;
}

}  // namespace slimkv
