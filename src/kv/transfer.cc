#include "kv/transfer.h"


#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>

#include "util/atomic_file.h"
#include "util/half.h"
#include "util/mapped_file.h"
#include "util/system_memory.h"

namespace slimkv {
namespace {

// Fields are written byte by byte as little-endian, but blocks and FP32 tokens are copied as they lie
// in memory: that is little-endian only on a little-endian host (every target slimkv builds for).
static_assert(std::endian::native == std::endian::little, "the KV transfer format copies little-endian memory");

constexpr std::array<uint8_t, 8> kMagic = {'S', 'L', 'I', 'M', 'K', 'V', 'X', 'F'};
constexpr std::array<uint8_t, 8> kEndMagic = {'X', 'F', 'E', 'N', 'D', '\r', '\n', 0x1a};

// Byte offsets of the header fields (docs/kv_transfer_format.md, "Header").
namespace at {
constexpr size_t kMagic = 0, kVersion = 8, kHeaderBytes = 12, kTotalBytes = 16;
constexpr size_t kNumLayers = 24, kNumKvHeads = 28, kKDim = 32, kVDim = 36, kMaxTokens = 40, kBlockTokens = 44;
constexpr size_t kSealedBlockBytes = 48, kSpecBytes = 56, kModelIdBytes = 60;
constexpr size_t kMetadataOffset = 64, kMetadataBytes = 72, kSealedOffset = 80, kSealedBytes = 88;
constexpr size_t kOpenOffset = 96, kOpenBytes = 104, kTrailerOffset = 112, kReserved = 120, kHeaderCrc = 124;
// ...and of the trailer's, from the trailer's start.
constexpr size_t kTrailerCrc = 0, kTrailerReserved = 4, kEndMagic = 8;
}  // namespace at

// --- little-endian fields ---------------------------------------------------------------------

void store_u32(uint8_t* p, uint32_t value) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(value >> (8 * i));
}
void store_u64(uint8_t* p, uint64_t value) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(value >> (8 * i));
}
uint32_t load_u32(const uint8_t* p) {
  uint32_t value = 0;
  for (int i = 3; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}
uint64_t load_u64(const uint8_t* p) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

// --- sizes, overflow-checked (the reader computes them from untrusted fields) -------------------

bool checked_add(uint64_t a, uint64_t b, uint64_t* sum) { return !__builtin_add_overflow(a, b, sum); }
bool checked_mul(uint64_t a, uint64_t b, uint64_t* product) { return !__builtin_mul_overflow(a, b, product); }
bool checked_align(uint64_t x, uint64_t* aligned) {
  if (!checked_add(x, kKvTransferAlignment - 1, aligned)) return false;
  *aligned -= *aligned % kKvTransferAlignment;
  return true;
}

// Version 2's record of one (layer, KV head) in the metadata: u32 k_dim, u32 v_dim, u64 sealed block bytes.
constexpr uint64_t kHeadRecordBytes = 16;
// Version 3's record after the token counts: u32 sink_tokens, u32 recent_tokens.
constexpr uint64_t kExactTokensRecordBytes = 8;

// The sealed blocks of a layer holding `tokens`: with window=W a block seals once it leaves the W
// newest tokens, so the open part holds up to block_tokens + W - 1 of them.
uint64_t sealed_blocks_for(uint64_t tokens, uint64_t block_tokens, uint64_t recent_tokens) {
  return tokens > recent_tokens ? (tokens - recent_tokens) / block_tokens : 0;
}

// The sizes that locate every section: the header's fields, or the writer's store.
struct Layout {
  uint32_t version = 1;  // 2: the heads' dims differ (ZACK's ranks), each head's in the tables below;
                         // 3: sinks=N / window=W (their counts below)
  uint32_t sink_tokens = 0, recent_tokens = 0;  // version 3: N and W; else 0
  uint32_t num_layers = 0, num_kv_heads = 0, k_dim = 0, v_dim = 0, max_tokens = 0, block_tokens = 0;
  uint64_t sealed_block_bytes = 0;   // version 2: the largest head's
  uint64_t sealed_block_stride = 0;  // sealed_block_bytes rounded up to 64
  uint32_t spec_bytes = 0, model_id_bytes = 0;
  uint64_t metadata_offset = 0, metadata_bytes = 0, sealed_offset = 0, sealed_bytes = 0;
  uint64_t open_offset = 0, open_bytes = 0, trailer_offset = 0, total_bytes = 0;
  // Version 2: [num_layers · num_kv_heads], layer by layer (the metadata's head records); empty in version 1.
  std::vector<uint32_t> head_k_dims, head_v_dims;
  std::vector<uint64_t> head_block_bytes;

  bool per_head() const { return version == 2; }
  bool exact_tokens() const { return version == 3; }
  // A layer holding `tokens`: its sealed blocks, its FP16 sink rows (sinks=N, once block 0 is sealed)
  // and its open tokens.
  uint64_t blocks_of(uint64_t tokens) const { return sealed_blocks_for(tokens, block_tokens, recent_tokens); }
  uint64_t sinks_of(uint64_t tokens) const { return blocks_of(tokens) > 0 ? sink_tokens : 0; }
  uint64_t open_of(uint64_t tokens) const { return tokens - blocks_of(tokens) * block_tokens; }
  size_t head_index(int l, int g) const { return size_t(l) * num_kv_heads + size_t(g); }
  uint64_t k_dim_of(int l, int g) const { return per_head() ? head_k_dims[head_index(l, g)] : k_dim; }
  uint64_t v_dim_of(int l, int g) const { return per_head() ? head_v_dims[head_index(l, g)] : v_dim; }
  uint64_t block_bytes_of(int l, int g) const { return per_head() ? head_block_bytes[head_index(l, g)] : sealed_block_bytes; }
  // A head's block slot: its block bytes rounded up to 64 (no overflow: each is at most sealed_block_bytes).
  uint64_t stride_of(int l, int g) const {
    return per_head() ? (block_bytes_of(l, g) + kKvTransferAlignment - 1) / kKvTransferAlignment * kKvTransferAlignment
                      : sealed_block_stride;
  }
  // One block of every head of layer l: the slots a block index takes in the layer's sealed bytes.
  uint64_t layer_block_stride(int l) const {
    if (!per_head()) return uint64_t(num_kv_heads) * sealed_block_stride;
    uint64_t bytes = 0;
    for (int g = 0; g < int(num_kv_heads); ++g) bytes += stride_of(l, g);
    return bytes;
  }
};

// Bytes of one (layer, head)'s open K or V record: n tokens of dim FP32, padded to 64.
bool open_record_bytes(uint64_t n, uint64_t dim, uint64_t* bytes) {
  return checked_mul(n, dim, bytes) && checked_mul(*bytes, sizeof(float), bytes) && checked_align(*bytes, bytes);
}

// One (layer, head)'s records in the open section, in order: sink K, sink V (version 3, once block 0 is
// sealed; else empty), open K, open V; each `rows` × `dim` FP32.
struct RowRecord {
  uint64_t rows, dim;
};
std::array<RowRecord, 4> head_row_records(uint64_t sinks, uint64_t open, uint64_t k_dim, uint64_t v_dim) {
  return {{{sinks, k_dim}, {sinks, v_dim}, {open, k_dim}, {open, v_dim}}};
}
bool head_open_bytes(uint64_t sinks, uint64_t open, uint64_t k_dim, uint64_t v_dim, uint64_t* bytes) {
  *bytes = 0;
  for (const RowRecord& record : head_row_records(sinks, open, k_dim, v_dim)) {
    uint64_t record_bytes = 0;
    if (!open_record_bytes(record.rows, record.dim, &record_bytes) || !checked_add(*bytes, record_bytes, bytes)) return false;
  }
  return true;
}

// Bytes of version 2's head records (0 in version 1).
bool head_records_bytes(const Layout& layout, uint64_t* bytes) {
  *bytes = 0;
  return !layout.per_head() || (checked_mul(layout.num_layers, layout.num_kv_heads, bytes) &&
                                checked_mul(*bytes, kHeadRecordBytes, bytes));
}

// Metadata: num_layers u32 token counts, version 3's record, version 2's head records, the spec, the
// model id, padded to 64.
bool metadata_section_bytes(const Layout& layout, uint64_t* bytes) {
  uint64_t records = 0;
  return head_records_bytes(layout, &records) && checked_mul(layout.num_layers, 4, bytes) &&
         checked_add(*bytes, records, bytes) &&
         checked_add(*bytes, layout.exact_tokens() ? kExactTokensRecordBytes : 0, bytes) && checked_add(*bytes, layout.spec_bytes, bytes) &&
         checked_add(*bytes, layout.model_id_bytes, bytes) && checked_align(*bytes, bytes);
}

// The sealed and open sections' sizes for these token counts [num_layers].
// Version 2 sums its heads' sizes (the head records lie in the input, which bounds their count); version 1
// multiplies one head's by the count, however large a corrupt header makes it.
bool sequence_section_bytes(const Layout& layout, const std::vector<int>& layer_tokens, uint64_t* sealed_bytes,
                            uint64_t* open_bytes, int first_layer = 0) {
  *sealed_bytes = 0;
  *open_bytes = 0;
  for (size_t i = 0; layout.per_head() && i < layer_tokens.size(); ++i) {
    const int l = first_layer + int(i);
    const uint64_t tokens = uint64_t(layer_tokens[i]);
    const uint64_t blocks = layout.blocks_of(tokens), sinks = layout.sinks_of(tokens), open = layout.open_of(tokens);
    for (int g = 0; g < int(layout.num_kv_heads); ++g) {
      uint64_t head_sealed = 0, head_open = 0;
      if (!checked_mul(blocks, layout.stride_of(l, g), &head_sealed) || !checked_add(*sealed_bytes, head_sealed, sealed_bytes) ||
          !head_open_bytes(sinks, open, layout.k_dim_of(l, g), layout.v_dim_of(l, g), &head_open) ||
          !checked_add(*open_bytes, head_open, open_bytes)) {
        return false;
      }
    }
  }
  if (layout.per_head()) return true;
  for (const int layer : layer_tokens) {
    const uint64_t tokens = uint64_t(layer);
    const uint64_t blocks = layout.blocks_of(tokens), sinks = layout.sinks_of(tokens), open = layout.open_of(tokens);
    uint64_t layer_sealed = 0, layer_open = 0;
    if (!checked_mul(blocks, layout.num_kv_heads, &layer_sealed) ||
        !checked_mul(layer_sealed, layout.sealed_block_stride, &layer_sealed) ||
        !checked_add(*sealed_bytes, layer_sealed, sealed_bytes) ||
        !head_open_bytes(sinks, open, layout.k_dim, layout.v_dim, &layer_open) ||
        !checked_mul(layer_open, layout.num_kv_heads, &layer_open) || !checked_add(*open_bytes, layer_open, open_bytes)) {
      return false;
    }
  }
  return true;
}

// Places the sections one after another from the metadata's size on; false on overflow.
bool place_sections(Layout& layout) {
  layout.metadata_offset = kKvTransferHeaderBytes;
  return checked_add(layout.metadata_offset, layout.metadata_bytes, &layout.sealed_offset) &&
         checked_add(layout.sealed_offset, layout.sealed_bytes, &layout.open_offset) &&
         checked_add(layout.open_offset, layout.open_bytes, &layout.trailer_offset) &&
         checked_add(layout.trailer_offset, kKvTransferTrailerBytes, &layout.total_bytes);
}

bool all_zero(const uint8_t* p, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

// --- reading -----------------------------------------------------------------------------------

struct ParsedTransfer {
  KvTransferInfo info;
  Layout layout;
};

std::string where_of(std::string_view source) { return str_cat("kv transfer '", source, "'"); }

// A count field that must lie in [min_value, INT_MAX] (the store keeps them as int).
Status check_count(const std::string& where, const char* field, uint32_t value, uint32_t min_value) {
  if (value < min_value || value > uint32_t(INT_MAX)) {
    return error(where, ": header field ", field, " is ", value, ", expected ", min_value, " to ", INT_MAX);
  }
  return Status::ok();
}

// A section size or offset the header declares, against the one its other fields imply.
Status check_placement(const std::string& where, const char* field, uint64_t found, uint64_t expected) {
  if (found != expected) {
    return error(where, ": header field ", field, " is ", found, ", but the other fields place it at ", expected,
                 " (corrupt header, or a writer that does not follow version ", kKvTransferVersion, ")");
  }
  return Status::ok();
}

// Magic and version: the only fields a future version must keep where they are.
Status check_identity(const uint8_t* data, size_t size, const std::string& where) {
  const size_t magic_seen = std::min(size, kMagic.size());
  if (magic_seen > 0 && std::memcmp(data, kMagic.data(), magic_seen) != 0) {
    return error(where, ": not a KV transfer (the first bytes are not the magic \"SLIMKVXF\")");
  }
  if (size < at::kVersion + 4) {
    return error(where, ": truncated in the header (the input has ", size, " bytes, a header is ",
                 kKvTransferHeaderBytes, ")");
  }
  const uint32_t version = load_u32(data + at::kVersion);
  if (version > kKvTransferVersion) {
    return error(where, ": format version ", version, " is newer than this reader's version ", kKvTransferVersion,
                 "; upgrade the reading side");
  }
  if (version == 0) return error(where, ": format version 0 is not a valid version (expected 1 to ", kKvTransferVersion, ")");
  if (size < kKvTransferHeaderBytes) {
    return error(where, ": truncated in the header (the input has ", size, " bytes, a header is ",
                 kKvTransferHeaderBytes, ")");
  }
  return Status::ok();
}

// The header's fields, each checked on its own and against the others. The header's CRC is checked.
Status parse_header(const uint8_t* data, const std::string& where, Layout& layout) {
  const uint32_t header_crc = load_u32(data + at::kHeaderCrc), computed_header_crc = crc32c(data, at::kHeaderCrc);
  if (header_crc != computed_header_crc) {
    return error(where, ": header checksum mismatch (stored CRC32C 0x", std::hex, header_crc, ", computed 0x",
                 computed_header_crc, std::dec, "): the header is corrupt");
  }
  const uint32_t header_bytes = load_u32(data + at::kHeaderBytes);
  if (header_bytes != kKvTransferHeaderBytes) {
    return error(where, ": header field header_bytes is ", header_bytes, ", expected ", kKvTransferHeaderBytes);
  }
  if (load_u32(data + at::kReserved) != 0) return error(where, ": header field reserved is not 0");
  layout.version = load_u32(data + at::kVersion);  // 1 to 3: check_identity
  layout.num_layers = load_u32(data + at::kNumLayers);
  layout.num_kv_heads = load_u32(data + at::kNumKvHeads);
  layout.k_dim = load_u32(data + at::kKDim);
  layout.v_dim = load_u32(data + at::kVDim);
  layout.max_tokens = load_u32(data + at::kMaxTokens);
  layout.block_tokens = load_u32(data + at::kBlockTokens);
  layout.sealed_block_bytes = load_u64(data + at::kSealedBlockBytes);
  layout.spec_bytes = load_u32(data + at::kSpecBytes);
  layout.model_id_bytes = load_u32(data + at::kModelIdBytes);
  SLIMKV_RETURN_IF_ERROR(check_count(where, "num_layers", layout.num_layers, 1));
  SLIMKV_RETURN_IF_ERROR(check_count(where, "num_kv_heads", layout.num_kv_heads, 1));
  SLIMKV_RETURN_IF_ERROR(check_count(where, "k_dim", layout.k_dim, 1));
  SLIMKV_RETURN_IF_ERROR(check_count(where, "v_dim", layout.v_dim, 1));
  SLIMKV_RETURN_IF_ERROR(check_count(where, "max_tokens", layout.max_tokens, 0));
  SLIMKV_RETURN_IF_ERROR(check_count(where, "block_tokens", layout.block_tokens, 1));
  if (layout.sealed_block_bytes == 0 || !checked_align(layout.sealed_block_bytes, &layout.sealed_block_stride)) {
    return error(where, ": header field sealed_block_bytes is ", layout.sealed_block_bytes,
                 ", expected a block size of at least 1 byte");
  }
  if (layout.spec_bytes == 0 || layout.spec_bytes > kKvTransferMaxStringBytes) {
    return error(where, ": header field spec_bytes is ", layout.spec_bytes, ", expected 1 to ",
                 kKvTransferMaxStringBytes);
  }
  if (layout.model_id_bytes > kKvTransferMaxStringBytes) {
    return error(where, ": header field model_id_bytes is ", layout.model_id_bytes, ", expected at most ",
                 kKvTransferMaxStringBytes);
  }

  // Section placement: the metadata's size follows from the fields above, the other two sections'
  // sizes from the token counts (checked once the metadata is read); offsets are consecutive.
  Layout declared = layout;
  declared.metadata_offset = load_u64(data + at::kMetadataOffset);
  declared.metadata_bytes = load_u64(data + at::kMetadataBytes);
  declared.sealed_offset = load_u64(data + at::kSealedOffset);
  declared.sealed_bytes = load_u64(data + at::kSealedBytes);
  declared.open_offset = load_u64(data + at::kOpenOffset);
  declared.open_bytes = load_u64(data + at::kOpenBytes);
  declared.trailer_offset = load_u64(data + at::kTrailerOffset);
  declared.total_bytes = load_u64(data + at::kTotalBytes);
  if (!metadata_section_bytes(layout, &layout.metadata_bytes)) return error(where, ": metadata size overflows");
  layout.sealed_bytes = declared.sealed_bytes;
  layout.open_bytes = declared.open_bytes;
  if (!layout.per_head() && layout.sealed_bytes % layout.sealed_block_stride != 0) {
    return error(where, ": header field sealed_bytes is ", layout.sealed_bytes, ", not a whole number of ",
                 layout.sealed_block_stride, "-byte block slots");
  }
  if (layout.open_bytes % kKvTransferAlignment != 0) {
    return error(where, ": header field open_bytes is ", layout.open_bytes, ", not a multiple of ",
                 kKvTransferAlignment);
  }
  if (!place_sections(layout)) return error(where, ": header section sizes overflow 64 bits");
  SLIMKV_RETURN_IF_ERROR(check_placement(where, "metadata_offset", declared.metadata_offset, layout.metadata_offset));
  SLIMKV_RETURN_IF_ERROR(check_placement(where, "metadata_bytes", declared.metadata_bytes, layout.metadata_bytes));
  SLIMKV_RETURN_IF_ERROR(check_placement(where, "sealed_offset", declared.sealed_offset, layout.sealed_offset));
  SLIMKV_RETURN_IF_ERROR(check_placement(where, "open_offset", declared.open_offset, layout.open_offset));
  SLIMKV_RETURN_IF_ERROR(check_placement(where, "trailer_offset", declared.trailer_offset, layout.trailer_offset));
  SLIMKV_RETURN_IF_ERROR(check_placement(where, "total_bytes", declared.total_bytes, layout.total_bytes));
  return Status::ok();
}

// Names the section that an input of `size` bytes (fewer than the header's total) is cut in.
Status truncation_error(const Layout& layout, size_t size, const std::string& where) {
  struct Section {
    const char* name;
    uint64_t begin, end;
  };
  const Section sections[] = {
      {"metadata section", layout.metadata_offset, layout.sealed_offset},
      {"sealed blocks section", layout.sealed_offset, layout.open_offset},
      {"open blocks section", layout.open_offset, layout.trailer_offset},
      {"trailer", layout.trailer_offset, layout.total_bytes},
  };
  for (const Section& section : sections) {
    if (size < section.end) {
      return error(where, ": truncated in the ", section.name, " (bytes [", section.begin, ", ", section.end,
                   ")): the input has ", size, " of the ", layout.total_bytes, " bytes the header declares");
    }
  }
  return error(where, ": truncated");  // not reached: size < total_bytes
}

// Version 2's head records (at `records`) into layout's tables, checked: every dim and block size at
// least 1 and at most the header's, which are their largest.
Status parse_head_records(const uint8_t* records, Layout& layout, const std::string& where) {
  const size_t heads = size_t(layout.num_layers) * layout.num_kv_heads;  // bounded: the records lie in the input
  layout.head_k_dims.resize(heads);
  layout.head_v_dims.resize(heads);
  layout.head_block_bytes.resize(heads);
  uint32_t widest_k = 0, widest_v = 0;
  uint64_t largest_block = 0;
  for (size_t i = 0; i < heads; ++i, records += kHeadRecordBytes) {
    const uint32_t k_dim = load_u32(records), v_dim = load_u32(records + 4);
    const uint64_t block_bytes = load_u64(records + 8);
    if (k_dim < 1 || k_dim > layout.k_dim || v_dim < 1 || v_dim > layout.v_dim || block_bytes < 1 ||
        block_bytes > layout.sealed_block_bytes) {
      return error(where, ": layer ", i / layout.num_kv_heads, " KV head ", i % layout.num_kv_heads, "'s record holds k_dim ",
                   k_dim, ", v_dim ", v_dim, " and blocks of ", block_bytes, " bytes; expected 1 to the header's ",
                   layout.k_dim, ", ", layout.v_dim, " and ", layout.sealed_block_bytes);
    }
    layout.head_k_dims[i] = k_dim;
    layout.head_v_dims[i] = v_dim;
    layout.head_block_bytes[i] = block_bytes;
    widest_k = std::max(widest_k, k_dim);
    widest_v = std::max(widest_v, v_dim);
    largest_block = std::max(largest_block, block_bytes);
  }
  if (widest_k != layout.k_dim || widest_v != layout.v_dim || largest_block != layout.sealed_block_bytes) {
    return error(where, ": the header's k_dim ", layout.k_dim, ", v_dim ", layout.v_dim, " and sealed_block_bytes ",
                 layout.sealed_block_bytes, " are not the head records' largest (", widest_k, ", ", widest_v, ", ",
                 largest_block, ")");
  }
  return Status::ok();
}

// Version 3's record (at `record`): sink_tokens at most block_tokens (sinks come from block 0), recent_tokens
// a count, and at least one of them not 0 (a store without either is written as version 1).
Status parse_exact_tokens_record(const uint8_t* record, Layout& layout, const std::string& where) {
  layout.sink_tokens = load_u32(record);
  layout.recent_tokens = load_u32(record + 4);
  if (layout.sink_tokens > layout.block_tokens) {
    return error(where, ": metadata field sink_tokens is ", layout.sink_tokens, ", expected 0 to block_tokens ",
                 layout.block_tokens);
  }
  if (layout.recent_tokens > uint32_t(INT_MAX)) {
    return error(where, ": metadata field recent_tokens is ", layout.recent_tokens, ", expected 0 to ", INT_MAX);
  }
  if (layout.sink_tokens == 0 && layout.recent_tokens == 0) {
    return error(where, ": metadata fields sink_tokens and recent_tokens are both 0 in a version 3 transfer, expected ",
                 "at least one of them (a store without sinks or a window is version 1)");
  }
  return Status::ok();
}

// The metadata (token counts, version 3's or 2's record(s), spec, model id) into `info` and `layout`, with the
// header's fields, checked: padding zero, and the sealed and open sections exactly the sizes the token
// counts need. data holds at least the bytes before sealed_offset.
Status parse_metadata(const uint8_t* data, Layout& layout, const std::string& where, KvTransferInfo& info) {
  info.version = layout.version;
  info.shape = {int(layout.num_layers), int(layout.num_kv_heads), int(layout.k_dim), int(layout.v_dim),
                int(layout.max_tokens)};
  info.block_tokens = int(layout.block_tokens);
  info.sealed_block_bytes = layout.sealed_block_bytes;
  info.total_bytes = layout.total_bytes;
  info.sealed_offset = layout.sealed_offset;
  info.open_offset = layout.open_offset;
  info.trailer_offset = layout.trailer_offset;
  const uint8_t* metadata = data + layout.metadata_offset;
  info.layer_tokens.resize(layout.num_layers);  // bounded by the input: 4 bytes each lie inside it
  for (uint32_t l = 0; l < layout.num_layers; ++l) {
    const uint32_t tokens = load_u32(metadata + 4 * size_t(l));
    if (tokens > layout.max_tokens) {
      return error(where, ": layer ", l, " holds ", tokens, " tokens, more than the header's max_tokens ",
                   layout.max_tokens);
    }
    info.layer_tokens[l] = int(tokens);
  }
  uint64_t records_bytes = 0;
  head_records_bytes(layout, &records_bytes);  // within metadata_bytes: no overflow
  if (layout.exact_tokens()) {
    SLIMKV_RETURN_IF_ERROR(parse_exact_tokens_record(metadata + 4 * size_t(layout.num_layers), layout, where));
    info.sink_tokens = int(layout.sink_tokens);
    info.recent_tokens = int(layout.recent_tokens);
    records_bytes = kExactTokensRecordBytes;
  }
  if (layout.per_head()) {
    SLIMKV_RETURN_IF_ERROR(parse_head_records(metadata + 4 * size_t(layout.num_layers), layout, where));
    info.shape.head_k_dims.assign(layout.head_k_dims.begin(), layout.head_k_dims.end());
    info.shape.head_v_dims.assign(layout.head_v_dims.begin(), layout.head_v_dims.end());
    info.head_block_bytes = layout.head_block_bytes;
  }
  const uint8_t* strings = metadata + 4 * size_t(layout.num_layers) + records_bytes;
  info.spec.assign(reinterpret_cast<const char*>(strings), layout.spec_bytes);
  info.model_id.assign(reinterpret_cast<const char*>(strings + layout.spec_bytes), layout.model_id_bytes);
  const uint64_t metadata_used = 4 * uint64_t(layout.num_layers) + records_bytes + layout.spec_bytes + layout.model_id_bytes;
  if (!all_zero(metadata + metadata_used, layout.metadata_bytes - metadata_used)) {
    return error(where, ": the metadata section's padding is not zero");
  }

  // The sealed and open sections must be exactly what the token counts need.
  uint64_t sealed_bytes = 0, open_bytes = 0;
  if (!sequence_section_bytes(layout, info.layer_tokens, &sealed_bytes, &open_bytes)) {
    return error(where, ": the token counts' section sizes overflow 64 bits");
  }
  if (sealed_bytes != layout.sealed_bytes || open_bytes != layout.open_bytes) {
    return error(where, ": the token counts per layer need ", sealed_bytes, " bytes of sealed blocks and ", open_bytes,
                 " bytes of open tokens (", layout.block_tokens, " tokens per block), but the header declares ",
                 layout.sealed_bytes, " and ", layout.open_bytes);
  }
  return Status::ok();
}

// The trailer's fields, and its CRC against body_crc, that of the `body_bytes` bytes before it.
Status check_trailer(const uint8_t* trailer, uint64_t body_bytes, uint32_t body_crc, const std::string& where) {
  if (std::memcmp(trailer + at::kEndMagic, kEndMagic.data(), kEndMagic.size()) != 0) {
    return error(where, ": the trailer's end magic is wrong (corrupt, or not where the header says it ends)");
  }
  if (load_u32(trailer + at::kTrailerReserved) != 0) return error(where, ": trailer field reserved is not 0");
  const uint32_t stored_crc = load_u32(trailer + at::kTrailerCrc);
  if (stored_crc != body_crc) {
    return error(where, ": checksum mismatch (stored CRC32C 0x", std::hex, stored_crc, ", computed 0x", body_crc, std::dec,
                 " over ", body_bytes, " bytes): the transfer is corrupt");
  }
  return Status::ok();
}

// One (layer, head)'s records in the open section (head_row_records).
std::array<RowRecord, 4> head_row_records(const KvTransferInfo& info, int layer, int head) {
  return head_row_records(uint64_t(kv_transfer_sink_tokens(info, layer)), uint64_t(kv_transfer_open_tokens(info, layer)),
                          uint64_t(info.shape.k_dim_of(layer, head)), uint64_t(info.shape.v_dim_of(layer, head)));
}

// Bytes of one (layer, head)'s records, and of the layer's open range (every head's: one head's times
// the count in version 1, however large a corrupt header makes it).
uint64_t open_head_bytes(const KvTransferInfo& info, int layer, int head) {
  uint64_t bytes = 0;
  for (const RowRecord& record : head_row_records(info, layer, head)) {
    uint64_t record_bytes = 0;
    open_record_bytes(record.rows, record.dim, &record_bytes);  // cannot overflow: the section's total did not
    bytes += record_bytes;
  }
  return bytes;
}
uint64_t open_layer_bytes(const KvTransferInfo& info, int layer) {
  if (!info.shape.heads_differ()) return open_head_bytes(info, layer, 0) * uint64_t(info.shape.num_kv_heads);
  uint64_t bytes = 0;
  for (int g = 0; g < info.shape.num_kv_heads; ++g) bytes += open_head_bytes(info, layer, g);
  return bytes;
}

// The zero padding of layer `layer`'s open records (its open range at `records`).
Status check_open_padding(const uint8_t* records, const KvTransferInfo& info, int layer, const std::string& where) {
  // A layer without open tokens or sinks has empty records: skipping it keeps this loop bounded by the
  // section's bytes even when a (corrupt) header claims billions of heads.
  if (kv_transfer_open_tokens(info, layer) == 0 && kv_transfer_sink_tokens(info, layer) == 0) return Status::ok();
  for (int g = 0; g < info.shape.num_kv_heads; ++g) {
    int index = 0;
    for (const RowRecord& rows : head_row_records(info, layer, g)) {
      uint64_t record = 0;
      open_record_bytes(rows.rows, rows.dim, &record);
      const uint64_t used = rows.rows * rows.dim * sizeof(float);
      if (!all_zero(records + used, record - used)) {
        return error(where, ": the padding of layer ", layer, " head ", g, "'s ", index < 2 ? "sink" : "open", " tokens is not zero");
      }
      records += record;
      ++index;
    }
  }
  return Status::ok();
}

// body_crc: the CRC of bytes [0, trailer_offset) when the caller has it; else it is computed here.
Expected<ParsedTransfer> parse_transfer(const uint8_t* data, size_t size, std::string_view source,
                                        std::optional<uint32_t> body_crc = std::nullopt) {
  const std::string where = where_of(source);
  SLIMKV_RETURN_IF_ERROR(check_identity(data, size, where));
  ParsedTransfer parsed;
  Layout& layout = parsed.layout;
  SLIMKV_RETURN_IF_ERROR(parse_header(data, where, layout));
  if (size < layout.total_bytes) return truncation_error(layout, size, where);
  if (size > layout.total_bytes) {
    return error(where, ": ", size - layout.total_bytes, " bytes follow the end of the transfer (the header declares ",
                 layout.total_bytes, " bytes, the input has ", size, ")");
  }

  // The trailer: its checksum covers every byte before it, so nothing below reads corrupt data.
  SLIMKV_RETURN_IF_ERROR(check_trailer(data + layout.trailer_offset, layout.trailer_offset,
                                       body_crc ? *body_crc : crc32c(data, layout.trailer_offset), where));

  SLIMKV_RETURN_IF_ERROR(parse_metadata(data, layout, where, parsed.info));
  const KvTransferInfo& info = parsed.info;
  // Padding is zero, so that the format stays canonical (write → read → write gives the same bytes).
  const uint64_t block_padding = layout.sealed_block_stride - layout.sealed_block_bytes;
  for (uint64_t offset = layout.sealed_offset; !layout.per_head() && offset < layout.open_offset;
       offset += layout.sealed_block_stride) {
    if (!all_zero(data + offset + layout.sealed_block_bytes, block_padding)) {
      return error(where, ": the padding after the sealed block at byte ", offset, " is not zero");
    }
  }
  uint64_t block_offset = layout.sealed_offset;
  for (int l = 0; layout.per_head() && l < int(layout.num_layers); ++l) {
    for (int g = 0; g < int(layout.num_kv_heads); ++g) {
      const uint64_t bytes = layout.block_bytes_of(l, g), stride = layout.stride_of(l, g);
      for (uint64_t b = 0; b < layout.blocks_of(uint64_t(info.layer_tokens[size_t(l)])); ++b, block_offset += stride) {
        if (!all_zero(data + block_offset + bytes, stride - bytes)) {
          return error(where, ": the padding after the sealed block at byte ", block_offset, " is not zero");
        }
      }
    }
  }
  uint64_t offset = layout.open_offset;
  for (uint32_t l = 0; l < layout.num_layers; ++l) {
    SLIMKV_RETURN_IF_ERROR(check_open_padding(data + offset, info, int(l), where));
    offset += open_layer_bytes(info, int(l));
  }
  return parsed;
}

// --- writing -------------------------------------------------------------------------------------

// The layout of `store`'s transfer once its layers hold `layer_tokens`, and its spec: version 1, or 2
// when its heads' dims differ (ZACK's ranks); errors for what neither holds.
Expected<Layout> writer_layout(const KvStore& store, std::string_view model_id, const std::vector<int>& layer_tokens,
                               std::string& spec) {
  spec = store.pipeline().describe();
  if (model_id.size() > kKvTransferMaxStringBytes) {
    return error("writing a kv transfer: the model id is ", model_id.size(), " bytes, at most ",
                 kKvTransferMaxStringBytes, " fit");
  }
  if (spec.size() > kKvTransferMaxStringBytes) {
    return error("writing a kv transfer: the KV spec '", spec, "' is longer than ", kKvTransferMaxStringBytes, " bytes");
  }
  const KvShape& shape = store.shape();
  if (shape.any_window()) {
    return error("writing a kv transfer: format version ", kKvTransferVersion,
                 " holds every token of every layer; this model's sliding-window layers have freed the blocks "
                 "that left their window");
  }
  Layout layout;
  layout.num_layers = uint32_t(shape.num_layers);
  layout.num_kv_heads = uint32_t(shape.num_kv_heads);
  layout.k_dim = uint32_t(shape.k_dim);
  layout.v_dim = uint32_t(shape.v_dim);
  layout.max_tokens = uint32_t(shape.max_tokens);
  layout.block_tokens = uint32_t(store.block_tokens());
  layout.sealed_block_bytes = store.block_bytes(0, 0);
  // Heads of their own dims (ZACK's ranks) or block sizes (per-head bit widths): version 2's head records.
  const bool per_head = shape.heads_differ() || !store.pipeline().wide_heads.empty();
  if (store.pipeline().sink_tokens > 0 || store.pipeline().recent_tokens > 0) {
    if (per_head) {
      return error("writing a kv transfer: the FP16 sink tokens and recent window of sinks= and window= (KV spec '",
                   spec, "') are written as format version 3, whose heads share one shape and block size; this ",
                   "store's heads differ (ZACK's ranks or hiheads=, version 2): use a spec without sinks= and window=, ",
                   "or without per-head ranks and bit widths");
    }
    layout.version = 3;
    layout.sink_tokens = uint32_t(store.pipeline().sink_tokens);
    layout.recent_tokens = uint32_t(store.pipeline().recent_tokens);
  }
  if (per_head) {  // the header's dims and block size: the heads' largest
    layout.version = 2;
    layout.k_dim = layout.v_dim = 0;
    layout.sealed_block_bytes = 0;
    for (int l = 0; l < shape.num_layers; ++l) {
      for (int g = 0; g < shape.num_kv_heads; ++g) {
        layout.head_k_dims.push_back(uint32_t(shape.k_dim_of(l, g)));
        layout.head_v_dims.push_back(uint32_t(shape.v_dim_of(l, g)));
        layout.head_block_bytes.push_back(store.block_bytes(l, g));
        layout.k_dim = std::max(layout.k_dim, layout.head_k_dims.back());
        layout.v_dim = std::max(layout.v_dim, layout.head_v_dims.back());
        layout.sealed_block_bytes = std::max(layout.sealed_block_bytes, layout.head_block_bytes.back());
      }
    }
  }
  checked_align(layout.sealed_block_bytes, &layout.sealed_block_stride);
  layout.spec_bytes = uint32_t(spec.size());
  layout.model_id_bytes = uint32_t(model_id.size());
  // A store in memory cannot overflow these sizes.
  metadata_section_bytes(layout, &layout.metadata_bytes);
  sequence_section_bytes(layout, layer_tokens, &layout.sealed_bytes, &layout.open_bytes);
  place_sections(layout);
  return layout;
}

// Whether `pages` holds blocks of this transfer's size: its pieces add up to one block per head, each
// inside the page.
Status check_page_layout(const KvPageLayout& pages, const Layout& layout) {
  size_t block = 0;
  bool inside = pages.piece_offsets.size() == pages.piece_bytes.size();
  for (size_t p = 0; inside && p < pages.piece_bytes.size(); ++p) {
    block += pages.piece_bytes[p];
    inside = pages.piece_offsets[p] + layout.num_kv_heads * pages.piece_bytes[p] <= pages.page_bytes;
  }
  if (!inside || block != layout.sealed_block_bytes) {
    return error("KV pages of ", pages.page_bytes, " bytes in ", pages.piece_bytes.size(), " pieces per head hold blocks of ",
                 block, " bytes", inside ? "" : " (a piece lies outside the page)", "; this transfer's blocks are ",
                 layout.sealed_block_bytes, " bytes for ", layout.num_kv_heads, " KV heads");
  }
  return Status::ok();
}

// The header and metadata: bytes [0, sealed_offset) of `out`, padding zeroed.
void write_head(const Layout& layout, const std::string& spec, std::string_view model_id,
                const std::vector<int>& layer_tokens, uint8_t* out) {
  std::memset(out, 0, layout.sealed_offset);
  uint8_t* header = out;
  std::memcpy(header + at::kMagic, kMagic.data(), kMagic.size());
  store_u32(header + at::kVersion, layout.version);
  store_u32(header + at::kHeaderBytes, kKvTransferHeaderBytes);
  store_u64(header + at::kTotalBytes, layout.total_bytes);
  store_u32(header + at::kNumLayers, layout.num_layers);
  store_u32(header + at::kNumKvHeads, layout.num_kv_heads);
  store_u32(header + at::kKDim, layout.k_dim);
  store_u32(header + at::kVDim, layout.v_dim);
  store_u32(header + at::kMaxTokens, layout.max_tokens);
  store_u32(header + at::kBlockTokens, layout.block_tokens);
  store_u64(header + at::kSealedBlockBytes, layout.sealed_block_bytes);
  store_u32(header + at::kSpecBytes, layout.spec_bytes);
  store_u32(header + at::kModelIdBytes, layout.model_id_bytes);
  store_u64(header + at::kMetadataOffset, layout.metadata_offset);
  store_u64(header + at::kMetadataBytes, layout.metadata_bytes);
  store_u64(header + at::kSealedOffset, layout.sealed_offset);
  store_u64(header + at::kSealedBytes, layout.sealed_bytes);
  store_u64(header + at::kOpenOffset, layout.open_offset);
  store_u64(header + at::kOpenBytes, layout.open_bytes);
  store_u64(header + at::kTrailerOffset, layout.trailer_offset);
  store_u32(header + at::kReserved, 0);
  store_u32(header + at::kHeaderCrc, crc32c(header, at::kHeaderCrc));

  uint8_t* metadata = out + layout.metadata_offset;
  for (uint32_t l = 0; l < layout.num_layers; ++l) store_u32(metadata + 4 * size_t(l), uint32_t(layer_tokens[l]));
  uint8_t* records = metadata + 4 * size_t(layout.num_layers);
  if (layout.exact_tokens()) {
    store_u32(records, layout.sink_tokens);
    store_u32(records + 4, layout.recent_tokens);
    records += kExactTokensRecordBytes;
  }
  for (size_t i = 0; i < layout.head_k_dims.size(); ++i, records += kHeadRecordBytes) {  // version 2
    store_u32(records, layout.head_k_dims[i]);
    store_u32(records + 4, layout.head_v_dims[i]);
    store_u64(records + 8, layout.head_block_bytes[i]);
  }
  uint8_t* strings = records;
  std::memcpy(strings, spec.data(), spec.size());
  if (!model_id.empty()) std::memcpy(strings + spec.size(), model_id.data(), model_id.size());
}

// Layer l's sealed blocks [first_block, end_block) as stored: head by head, block by block, each in a
// 64-byte slot of `sealed` (its padding zeroed). head_crcs (nullptr, or [num_kv_heads]): each head's
// CRC32C of its bytes written, padding included, taken over each run of ~64 KiB of blocks just copied
// (in cache: one pass, not two; a run, not a block: crc32c's three streams need 12 KiB, and a 2-bit
// block is a few KiB).
void write_sealed_blocks(const KvStore& store, const Layout& layout, int l, int first_block, int end_block, uint8_t* sealed,
                         uint32_t* head_crcs = nullptr) {
  constexpr uint64_t kRunBytes = uint64_t(64) << 10;
  for (int g = 0; g < int(layout.num_kv_heads); ++g) {
    const uint64_t bytes = layout.block_bytes_of(l, g), stride = layout.stride_of(l, g);
    uint32_t crc = 0;
    const uint8_t* run = sealed;  // the blocks copied and not checksummed yet
    for (int b = first_block; b < end_block; ++b) {
      std::memcpy(sealed, store.sealed_block(l, g, b), bytes);
      std::memset(sealed + bytes, 0, stride - bytes);
      sealed += stride;
      if (head_crcs && (uint64_t(sealed - run) >= kRunBytes || b + 1 == end_block)) {
        crc = crc32c(run, size_t(sealed - run), crc);
        run = sealed;
      }
    }
    if (head_crcs) head_crcs[g] = crc;
  }
}

// One layer's sealed blocks from first_block on (into `sealed`, each head's CRC into head_crcs as
// write_sealed_blocks) and open tokens (into `open`), every byte written (padding zeroed).
void write_open_tokens(const KvStore& store, const Layout& layout, int l, uint8_t* open);
void write_layer(const KvStore& store, const Layout& layout, int l, int first_block, uint8_t* sealed, uint8_t* open,
                 uint32_t* head_crcs = nullptr) {
  write_sealed_blocks(store, layout, l, first_block, store.num_sealed_blocks(l), sealed, head_crcs);
  write_open_tokens(store, layout, l, open);
}

// Layer l's sink rows and open tokens in FP32 (the store's FP16 widened) into `open` (padding zeroed): per
// head, the records of head_row_records (sink K, sink V, open K, open V), each padded to 64.
void write_open_tokens(const KvStore& store, const Layout& layout, int l, uint8_t* open) {
  const uint64_t sinks = uint64_t(store.sink_tokens(l)), tokens = uint64_t(store.open_tokens(l));
  std::vector<float> sink_k, sink_v, open_k, open_v;
  for (int g = 0; g < int(layout.num_kv_heads); ++g) {
    const uint64_t k_dim = layout.k_dim_of(l, g), v_dim = layout.v_dim_of(l, g);
    sink_k.resize(sinks * k_dim);
    sink_v.resize(sinks * v_dim);
    open_k.resize(tokens * k_dim);
    open_v.resize(tokens * v_dim);
    if (sinks > 0) store.widen_sinks(l, g, sink_k.data(), sink_v.data());
    if (tokens > 0) store.widen_open(l, g, int(tokens), open_k.data(), open_v.data());
    for (const std::vector<float>* rows : {&sink_k, &sink_v, &open_k, &open_v}) {
      uint64_t record = 0;
      open_record_bytes(rows->size(), 1, &record);
      const size_t bytes = rows->size() * sizeof(float);
      if (record == 0) continue;  // an empty record: `open` may be an empty buffer's null
      if (bytes > 0) std::memcpy(open, rows->data(), bytes);
      std::memset(open + bytes, 0, record - bytes);
      open += record;
    }
  }
}

// Layer l's sealed and open sizes when it holds `tokens`.
void layer_bytes(const Layout& layout, int l, int tokens, uint64_t* sealed, uint64_t* open) {
  sequence_section_bytes(layout, {tokens}, sealed, open, l);
}

// Device pages hold one block size for every head: version 1 (and 3).
Status check_one_block_size(const Layout& layout) {
  if (!layout.per_head()) return Status::ok();
  return error("writing a kv transfer from device pages: the pages hold one block size for every head; this store's ",
               "heads differ (ZACK ranks or hiheads=): write it from the store (format version 2)");
}

std::vector<int> store_layer_tokens(const KvStore& store) {
  std::vector<int> tokens(size_t(store.shape().num_layers));
  for (size_t l = 0; l < tokens.size(); ++l) tokens[l] = store.num_tokens(int(l));
  return tokens;
}

}  // namespace

Status write_kv_transfer(const KvStore& store, std::string_view model_id, std::vector<uint8_t>& out) {
  const std::vector<int> layer_tokens = store_layer_tokens(store);
  std::string spec;
  SLIMKV_ASSIGN_OR_RETURN(const Layout layout, writer_layout(store, model_id, layer_tokens, spec));
  // Every byte is written below, padding zeroed as it goes: a buffer reused from an earlier transfer
  // is not cleared first (a pass over gigabytes).
  assign_for_overwrite(out, layout.total_bytes);
  write_head(layout, spec, model_id, layer_tokens, out.data());
  // The CRC as the bytes are written: the head, the sealed section block by block, then the open section.
  uint32_t crc = crc32c(out.data(), layout.sealed_offset);
  uint64_t sealed = layout.sealed_offset, open = layout.open_offset;
  std::vector<uint32_t> head_crcs(layout.num_kv_heads);
  for (uint32_t l = 0; l < layout.num_layers; ++l) {
    write_layer(store, layout, int(l), 0, out.data() + sealed, out.data() + open, head_crcs.data());
    uint64_t sealed_bytes = 0, open_bytes = 0;
    layer_bytes(layout, int(l), layer_tokens[l], &sealed_bytes, &open_bytes);
    const uint64_t blocks = layout.blocks_of(uint64_t(layer_tokens[l]));
    for (uint32_t g = 0; g < layout.num_kv_heads; ++g) {
      crc = crc32c_combine(crc, head_crcs[g], blocks * layout.stride_of(int(l), int(g)));
    }
    sealed += sealed_bytes;
    open += open_bytes;
  }
  crc = crc32c(out.data() + layout.open_offset, layout.open_bytes, crc);
  const std::array<uint8_t, kKvTransferTrailerBytes> trailer = kv_transfer_trailer(crc);
  std::memcpy(out.data() + layout.trailer_offset, trailer.data(), trailer.size());
  return Status::ok();
}

Status write_kv_transfer_head(const KvStore& store, std::string_view model_id, int tokens_per_layer,
                              std::vector<uint8_t>& out) {
  const std::vector<int> layer_tokens(size_t(store.shape().num_layers), tokens_per_layer);
  std::string spec;
  SLIMKV_ASSIGN_OR_RETURN(const Layout layout, writer_layout(store, model_id, layer_tokens, spec));
  assign_for_overwrite(out, layout.sealed_offset);
  write_head(layout, spec, model_id, layer_tokens, out.data());
  return Status::ok();
}

Status write_kv_transfer_layer(const KvStore& store, int layer, int first_block, std::vector<uint8_t>& out,
                               size_t& sealed_bytes, std::vector<uint32_t>* part_crcs) {
  std::string spec;
  SLIMKV_ASSIGN_OR_RETURN(const Layout layout, writer_layout(store, "", store_layer_tokens(store), spec));
  if (first_block < 0 || first_block > store.num_sealed_blocks(layer)) {
    return error("writing a kv transfer: layer ", layer, " holds ", store.num_sealed_blocks(layer),
                 " sealed blocks; its blocks from ", first_block, " on were asked for");
  }
  uint64_t sealed = 0, open = 0;
  layer_bytes(layout, layer, store.num_tokens(layer), &sealed, &open);
  sealed -= uint64_t(first_block) * layout.layer_block_stride(layer);
  assign_for_overwrite(out, sealed + open);
  if (part_crcs) part_crcs->assign(layout.num_kv_heads + 1, 0);
  write_layer(store, layout, layer, first_block, out.data(), out.data() + sealed, part_crcs ? part_crcs->data() : nullptr);
  if (part_crcs) part_crcs->back() = crc32c(out.data() + sealed, open);  // the open tokens: a few KB
  sealed_bytes = sealed;
  return Status::ok();
}

Status write_kv_transfer_blocks(const KvStore& store, int layer, int first_block, int end_block, std::vector<uint8_t>& out,
                                std::vector<uint32_t>* head_crcs) {
  std::string spec;
  SLIMKV_ASSIGN_OR_RETURN(const Layout layout, writer_layout(store, "", store_layer_tokens(store), spec));
  if (first_block < 0 || first_block > end_block || end_block > store.num_sealed_blocks(layer)) {
    return error("writing a kv transfer: layer ", layer, " holds ", store.num_sealed_blocks(layer),
                 " sealed blocks; blocks [", first_block, ", ", end_block, ") were asked for");
  }
  assign_for_overwrite(out, uint64_t(end_block - first_block) * layout.layer_block_stride(layer));
  if (head_crcs) head_crcs->assign(layout.num_kv_heads, 0);
  write_sealed_blocks(store, layout, layer, first_block, end_block, out.data(), head_crcs ? head_crcs->data() : nullptr);
  return Status::ok();
}

Status write_kv_transfer_from_pages(const KvPageLayout& pages, int blocks,
                                    const std::function<Expected<const uint8_t*>(int layer)>& layer_pages,
                                    const KvStore& open, std::string_view model_id, std::vector<uint8_t>& out) {
  std::vector<int> layer_tokens = store_layer_tokens(open);
  for (int& tokens : layer_tokens) tokens += blocks * open.block_tokens();
  std::string spec;
  SLIMKV_ASSIGN_OR_RETURN(const Layout layout, writer_layout(open, model_id, layer_tokens, spec));
  SLIMKV_RETURN_IF_ERROR(check_one_block_size(layout));
  if (layout.exact_tokens()) {  // the GPU cache refuses sinks= and window= (kv/cuda/gpu_kv_plan.cc)
    return error("writing a kv transfer from device pages: the pages hold no FP16 sink tokens or recent window (KV spec '",
                 spec, "')");
  }
  SLIMKV_RETURN_IF_ERROR(check_page_layout(pages, layout));
  assign_for_overwrite(out, layout.total_bytes);  // every byte written below, padding zeroed
  write_head(layout, spec, model_id, layer_tokens, out.data());
  uint32_t crc = crc32c(out.data(), layout.sealed_offset);
  uint8_t* sealed = out.data() + layout.sealed_offset;
  uint8_t* open_bytes = out.data() + layout.open_offset;
  for (int l = 0; l < int(layout.num_layers); ++l) {
    SLIMKV_ASSIGN_OR_RETURN(const uint8_t* layer, layer_pages(l));
    // Head by head, block by block, each block's pieces gathered from its page, checksummed as written.
    for (uint32_t g = 0; g < layout.num_kv_heads; ++g) {
      for (int b = 0; b < blocks; ++b, sealed += layout.sealed_block_stride) {
        const uint8_t* page = layer + size_t(b) * pages.page_bytes;
        size_t at = 0;
        for (size_t p = 0; p < pages.piece_bytes.size(); at += pages.piece_bytes[p], ++p) {
          crc = crc32c_copy(sealed + at, page + pages.piece_offsets[p] + g * pages.piece_bytes[p], pages.piece_bytes[p], crc);
        }
        std::memset(sealed + at, 0, layout.sealed_block_stride - at);
        crc = crc32c(sealed + at, layout.sealed_block_stride - at, crc);
      }
    }
    write_open_tokens(open, layout, l, open_bytes);
    uint64_t sealed_bytes = 0, layer_open_bytes = 0;
    layer_bytes(layout, l, open.num_tokens(l), &sealed_bytes, &layer_open_bytes);
    open_bytes += layer_open_bytes;
  }
  crc = crc32c(out.data() + layout.open_offset, layout.open_bytes, crc);
  const std::array<uint8_t, kKvTransferTrailerBytes> trailer = kv_transfer_trailer(crc);
  std::memcpy(out.data() + layout.trailer_offset, trailer.data(), trailer.size());
  return Status::ok();
}

std::array<uint8_t, kKvTransferTrailerBytes> kv_transfer_trailer(uint32_t crc) {
  std::array<uint8_t, kKvTransferTrailerBytes> trailer{};
  store_u32(trailer.data() + at::kTrailerCrc, crc);
  store_u32(trailer.data() + at::kTrailerReserved, 0);
  std::memcpy(trailer.data() + at::kEndMagic, kEndMagic.data(), kEndMagic.size());
  return trailer;
}

Status write_kv_transfer_file(const KvStore& store, std::string_view model_id, const std::string& path) {
  std::vector<uint8_t> bytes;
  SLIMKV_RETURN_IF_ERROR(write_kv_transfer(store, model_id, bytes).with_context(str_cat("writing ", path)));
  return write_file_atomically(path, {bytes});
}

// --- reading -------------------------------------------------------------------------------------

int kv_transfer_sealed_blocks(const KvTransferInfo& info, int layer) {
  return int(sealed_blocks_for(uint64_t(info.layer_tokens[size_t(layer)]), uint64_t(info.block_tokens),
                               uint64_t(info.recent_tokens)));
}
int kv_transfer_sink_tokens(const KvTransferInfo& info, int layer) {
  return kv_transfer_sealed_blocks(info, layer) > 0 ? info.sink_tokens : 0;
}
int kv_transfer_open_tokens(const KvTransferInfo& info, int layer) {
  return info.layer_tokens[size_t(layer)] - kv_transfer_sealed_blocks(info, layer) * info.block_tokens;
}

Expected<KvTransferInfo> inspect_kv_transfer(const uint8_t* data, size_t size, std::string_view source) {
  SLIMKV_ASSIGN_OR_RETURN(ParsedTransfer parsed, parse_transfer(data, size, source));
  return std::move(parsed.info);
}

Expected<KvTransferInfo> inspect_kv_transfer_with_crc(const uint8_t* data, size_t size, std::string_view source,
                                                      uint32_t body_crc) {
  SLIMKV_ASSIGN_OR_RETURN(ParsedTransfer parsed, parse_transfer(data, size, source, body_crc));
  return std::move(parsed.info);
}

Expected<KvTransferInfo> inspect_kv_transfer_head(const uint8_t* data, size_t size, std::string_view source) {
  const std::string where = where_of(source);
  SLIMKV_RETURN_IF_ERROR(check_identity(data, size, where));
  Layout layout;
  SLIMKV_RETURN_IF_ERROR(parse_header(data, where, layout));
  if (size < layout.sealed_offset) return truncation_error(layout, size, where);
  KvTransferInfo info;
  SLIMKV_RETURN_IF_ERROR(parse_metadata(data, layout, where, info));
  return info;
}

namespace {

// The layout that a checked transfer's info describes (the fields that size its sections).
Layout layout_of(const KvTransferInfo& info) {
  Layout layout;
  layout.version = info.shape.heads_differ() ? 2 : info.sink_tokens > 0 || info.recent_tokens > 0 ? 3 : 1;
  layout.sink_tokens = uint32_t(info.sink_tokens);
  layout.recent_tokens = uint32_t(info.recent_tokens);
  layout.num_layers = uint32_t(info.shape.num_layers);
  layout.num_kv_heads = uint32_t(info.shape.num_kv_heads);
  layout.k_dim = uint32_t(info.shape.k_dim);
  layout.v_dim = uint32_t(info.shape.v_dim);
  layout.block_tokens = uint32_t(info.block_tokens);
  layout.sealed_block_bytes = info.sealed_block_bytes;
  checked_align(info.sealed_block_bytes, &layout.sealed_block_stride);  // checked by the reader: no overflow
  layout.head_k_dims.assign(info.shape.head_k_dims.begin(), info.shape.head_k_dims.end());
  layout.head_v_dims.assign(info.shape.head_v_dims.begin(), info.shape.head_v_dims.end());
  layout.head_block_bytes = info.head_block_bytes;
  return layout;
}

}  // namespace

std::vector<KvTransferLayerRanges> kv_transfer_layer_ranges(const KvTransferInfo& info) {
  const Layout layout = layout_of(info);
  std::vector<KvTransferLayerRanges> ranges;
  uint64_t sealed = info.sealed_offset, open = info.open_offset;
  for (size_t l = 0; l < info.layer_tokens.size(); ++l) {
    KvTransferLayerRanges range;
    // The sizes fit: parse_metadata checked that the sections these counts need are the header's.
    sequence_section_bytes(layout, {info.layer_tokens[l]}, &range.sealed_bytes, &range.open_bytes, int(l));
    range.sealed_offset = sealed;
    range.open_offset = open;
    sealed += range.sealed_bytes;
    open += range.open_bytes;
    ranges.push_back(range);
  }
  return ranges;
}

Status check_kv_transfer_head_for(const KvTransferInfo& info, std::string_view source, std::string_view model_id,
                                  const KvStore& into) {
  const std::string where = where_of(source);
  // Against the receiver: the same model, the same encoding, the same shape.
  if (info.model_id != model_id) {
    return error(where, ": model mismatch: the KV was computed by model '", info.model_id, "', this worker serves '",
                 model_id, "'");
  }
  const std::string spec = into.pipeline().describe();
  if (info.spec != spec) {
    return error(where, ": KV spec mismatch: the sender encoded with '", info.spec, "', this store with '", spec,
                 "' (start the receiver with the sender's --kv spec)");
  }
  // Implied by the spec, checked so that the rows are sized by the receiver's own counts.
  if (info.sink_tokens != into.pipeline().sink_tokens || info.recent_tokens != into.pipeline().recent_tokens) {
    return error(where, ": metadata fields sink_tokens and recent_tokens are ", info.sink_tokens, " and ",
                 info.recent_tokens, ", expected the spec's sinks=", into.pipeline().sink_tokens, " and window=",
                 into.pipeline().recent_tokens);
  }
  if (info.sink_tokens > 0 && into.shape().any_window()) {  // no sender with this spec and model writes them
    return error(where, ": metadata field sink_tokens is ", info.sink_tokens, ", expected 0: this model's ",
                 "sliding-window layers keep no sink tokens, and its transfers have none");
  }
  const KvShape& shape = into.shape();
  const bool per_head = info.shape.heads_differ() || shape.heads_differ();
  if (info.shape.num_layers != shape.num_layers || info.shape.num_kv_heads != shape.num_kv_heads ||
      (!per_head && (info.shape.k_dim != shape.k_dim || info.shape.v_dim != shape.v_dim))) {
    return error(where, ": KV shape mismatch (layers × KV heads × k_dim × v_dim): the sender's is ",
                 info.shape.num_layers, " × ", info.shape.num_kv_heads, " × ", info.shape.k_dim, " × ",
                 info.shape.v_dim, ", this store's ", shape.num_layers, " × ", shape.num_kv_heads, " × ", shape.k_dim,
                 " × ", shape.v_dim);
  }
  // Each head's dims (ZACK's ranks, version 2), and its blocks: implied by spec and shape, checked so
  // that no block is read past its end whatever the codec does. Bounded: the counts are this store's.
  if (info.block_tokens != into.block_tokens()) {
    return error(where, ": block mismatch: the sender's blocks are ", info.block_tokens, " tokens, this store's ",
                 into.block_tokens());
  }
  for (int l = 0; l < shape.num_layers; ++l) {
    for (int g = 0; g < shape.num_kv_heads; ++g) {
      if (info.shape.k_dim_of(l, g) != shape.k_dim_of(l, g) || info.shape.v_dim_of(l, g) != shape.v_dim_of(l, g)) {
        return error(where, ": KV shape mismatch at layer ", l, " KV head ", g, ": the sender's holds ",
                     info.shape.k_dim_of(l, g), "/", info.shape.v_dim_of(l, g), " K/V dims, this store's ",
                     shape.k_dim_of(l, g), "/", shape.v_dim_of(l, g), per_head ? " (ZACK's per-head ranks)" : "");
      }
      const uint64_t sent = per_head && info.shape.heads_differ() ? info.head_block_bytes[size_t(l) * size_t(shape.num_kv_heads) + size_t(g)]
                                                                   : info.sealed_block_bytes;
      if (sent != into.block_bytes(l, g)) {
        return error(where, ": block mismatch: the sender's blocks", per_head ? str_cat(" of layer ", l, " KV head ", g) : "",
                     " are ", info.block_tokens, " tokens in ", sent, " bytes, this store's ", into.block_tokens(),
                     " tokens in ", into.block_bytes(l, g));
      }
      if (!per_head) break;  // every head alike
    }
    if (!per_head) break;
  }
  for (int l = 0; l < shape.num_layers; ++l) {
    if (info.layer_tokens[size_t(l)] > shape.max_tokens) {
      return error(where, ": layer ", l, " holds ", info.layer_tokens[size_t(l)],
                   " tokens, more than this store's max_tokens ", shape.max_tokens);
    }
  }
  return Status::ok();
}

namespace {

// Layer `layer`'s open records (its open range at `records`) against `into`: the open rows are FP32 in
// the format, but a store whose open block is FP16 (every sender with this spec) only ever writes FP16
// values: anything else was not written by such a sender, and restoring it would round it, so the bytes
// would not come back as they were.
Status check_open_values(const uint8_t* records, const KvTransferInfo& info, int layer, const std::string& where,
                         const KvStore& into) {
  if (into.open_dtype() != DType::kF16) return Status::ok();
  const auto all_fp16 = [](const uint8_t* values, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      uint32_t bits = 0;
      std::memcpy(&bits, values + 4 * i, 4);
      if (float_bits(fp16_to_float(float_to_fp16(bits_float(bits)))) != bits) return false;
    }
    return true;
  };
  for (int g = 0; g < info.shape.num_kv_heads; ++g) {
    int index = 0;
    for (const RowRecord& rows : head_row_records(info, layer, g)) {
      if (!all_fp16(records, size_t(rows.rows * rows.dim))) {
        return error(where, ": layer ", layer, " KV head ", g, ": the ", index < 2 ? "sink tokens hold" : "open block holds",
                     " values that are not FP16, and this spec keeps them in FP16 (no sender with this spec wrote them)");
      }
      uint64_t record = 0;
      open_record_bytes(rows.rows, rows.dim, &record);
      records += record;
      ++index;
    }
  }
  return Status::ok();
}

// One layer's sink rows and open tokens, every head's records from `records` on.
void restore_open_layer(const uint8_t* records, const KvTransferInfo& info, int layer, KvStore& into) {
  // Rows of FP32 may lie unaligned for float in the input (it need not be aligned): copy through buffers.
  std::array<std::vector<float>, 4> rows;  // sink K, sink V, open K, open V
  for (int g = 0; g < info.shape.num_kv_heads; ++g) {
    const std::array<RowRecord, 4> records_of_head = head_row_records(info, layer, g);
    for (size_t r = 0; r < rows.size(); ++r) {
      rows[r].resize(size_t(records_of_head[r].rows * records_of_head[r].dim));
      if (!rows[r].empty()) std::memcpy(rows[r].data(), records, rows[r].size() * sizeof(float));
      uint64_t record = 0;
      open_record_bytes(records_of_head[r].rows, records_of_head[r].dim, &record);
      records += record;
    }
    if (records_of_head[0].rows > 0) into.restore_sink_tokens(layer, g, rows[0].data(), rows[1].data());
    into.restore_open_tokens(layer, g, rows[2].data(), rows[3].data(), int(records_of_head[2].rows));
  }
}

// A transfer's layer (its bytes in place in `data`) into `into`, as restore_kv_transfer_blocks and
// restore_kv_transfer_open restore it from pieces.
void restore_layer(const uint8_t* data, const KvTransferInfo& info, int layer, KvStore& into) {
  const Layout layout = layout_of(info);
  const KvTransferLayerRanges range = kv_transfer_layer_ranges(info)[size_t(layer)];
  const int blocks = kv_transfer_sealed_blocks(info, layer);
  const uint8_t* cursor = data + range.sealed_offset;
  for (int g = 0; g < info.shape.num_kv_heads; ++g) {
    const uint64_t stride = layout.stride_of(layer, g);
    for (int b = 0; b < blocks; ++b, cursor += stride) into.restore_sealed_block(layer, g, cursor);
  }
  restore_open_layer(data + range.open_offset, info, layer, into);
}

}  // namespace

Expected<KvTransferInfo> check_kv_transfer_for(const uint8_t* data, size_t size, std::string_view source,
                                               std::string_view model_id, const KvStore& into,
                                               std::optional<uint32_t> received_crc) {
  SLIMKV_ASSIGN_OR_RETURN(ParsedTransfer parsed, parse_transfer(data, size, source, received_crc));
  SLIMKV_RETURN_IF_ERROR(check_kv_transfer_head_for(parsed.info, source, model_id, into));
  const std::vector<KvTransferLayerRanges> ranges = kv_transfer_layer_ranges(parsed.info);
  for (int l = 0; l < into.shape().num_layers; ++l) {
    SLIMKV_RETURN_IF_ERROR(check_open_values(data + ranges[size_t(l)].open_offset, parsed.info, l, where_of(source), into));
  }
  return std::move(parsed.info);
}

Status read_kv_transfer(const uint8_t* data, size_t size, std::string_view source, std::string_view model_id,
                        KvStore& into, std::optional<uint32_t> received_crc) {
  SLIMKV_ASSIGN_OR_RETURN(const KvTransferInfo info, check_kv_transfer_for(data, size, source, model_id, into, received_crc));
  restore_kv_transfer(data, info, into);  // everything is checked
  return Status::ok();
}

void restore_kv_transfer(const uint8_t* data, const KvTransferInfo& info, KvStore& into) {
  into.clear();
  for (int l = 0; l < info.shape.num_layers; ++l) restore_layer(data, info, l, into);
}

namespace {

// A received block's slot padding: zero, so that the store's export gives back the bytes that came
// (the format is canonical).
Status check_block_padding(const uint8_t* slot, const KvTransferInfo& info, int layer, int head, int block,
                           std::string_view source) {
  const Layout layout = layout_of(info);
  const uint64_t bytes = layout.block_bytes_of(layer, head), stride = layout.stride_of(layer, head);
  if (!all_zero(slot + bytes, stride - bytes)) {
    return error(where_of(source), ": layer ", layer, " KV head ", head, " block ", block,
                 ": the padding after the sealed block is not zero");
  }
  return Status::ok();
}

}  // namespace

Status restore_kv_transfer_blocks(const uint8_t* slots, int count, const KvTransferInfo& info, int layer, int head,
                                  int first_block, std::string_view source, KvStore& into) {
  const uint64_t stride = layout_of(info).stride_of(layer, head);
  for (int b = 0; b < count; ++b, slots += stride) {
    SLIMKV_RETURN_IF_ERROR(check_block_padding(slots, info, layer, head, first_block + b, source));
    into.restore_sealed_block(layer, head, slots);
  }
  return Status::ok();
}

Status keep_kv_transfer_blocks(std::span<uint8_t* const> slots, const KvTransferInfo& info, int layer, int head,
                               int first_block, std::string_view source, KvStore& into) {
  for (size_t b = 0; b < slots.size(); ++b) {
    SLIMKV_RETURN_IF_ERROR(check_block_padding(slots[b], info, layer, head, first_block + int(b), source));
    into.keep_restored_block(layer, head, slots[b]);
  }
  return Status::ok();
}

Status restore_kv_transfer_open(const uint8_t* records, const KvTransferInfo& info, int layer, std::string_view source,
                                KvStore& into) {
  const std::string where = where_of(source);
  SLIMKV_RETURN_IF_ERROR(check_open_padding(records, info, layer, where));
  SLIMKV_RETURN_IF_ERROR(check_open_values(records, info, layer, where, into));
  restore_open_layer(records, info, layer, into);
  return Status::ok();
}

Status check_kv_transfer_trailer(const uint8_t* trailer, const KvTransferInfo& info, uint32_t body_crc,
                                 std::string_view source) {
  return check_trailer(trailer, info.trailer_offset, body_crc, where_of(source));
}

void restore_kv_transfer_open_tokens(const uint8_t* data, const KvTransferInfo& info, KvStore& into) {
  const std::vector<KvTransferLayerRanges> ranges = kv_transfer_layer_ranges(info);
  for (int l = 0; l < info.shape.num_layers; ++l) restore_open_layer(data + ranges[size_t(l)].open_offset, info, l, into);
}

namespace {

// Head `head`'s sealed block (the codec's bytes) into its place in `page`: its piece of every page part.
void copy_block_into_page(const uint8_t* block, uint64_t head, const KvPageLayout& pages, uint8_t* page) {
  size_t at = 0;
  for (size_t p = 0; p < pages.piece_bytes.size(); at += pages.piece_bytes[p], ++p) {
    std::memcpy(page + pages.piece_offsets[p] + head * pages.piece_bytes[p], block + at, pages.piece_bytes[p]);
  }
}

}  // namespace

void copy_kv_transfer_pages(const uint8_t* data, const KvTransferInfo& info, int layer, const KvPageLayout& pages,
                            uint8_t* out) {
  const Layout layout = layout_of(info);
  const KvTransferLayerRanges range = kv_transfer_layer_ranges(info)[size_t(layer)];
  const uint64_t blocks = uint64_t(kv_transfer_sealed_blocks(info, layer));
  const uint8_t* block = data + range.sealed_offset;
  for (uint64_t g = 0; g < uint64_t(info.shape.num_kv_heads); ++g) {
    const uint64_t stride = layout.stride_of(layer, int(g));
    for (uint64_t b = 0; b < blocks; ++b, block += stride) copy_block_into_page(block, g, pages, out + b * pages.page_bytes);
  }
}

void copy_kv_store_pages(const KvStore& store, int layer, int first_block, int blocks, const KvPageLayout& pages,
                         uint8_t* out) {
  for (uint64_t g = 0; g < uint64_t(store.shape().num_kv_heads); ++g) {
    for (int b = 0; b < blocks; ++b) {
      copy_block_into_page(store.sealed_block(layer, int(g), first_block + b), g, pages, out + size_t(b) * pages.page_bytes);
    }
  }
}

Status read_kv_transfer_file(const std::string& path, std::string_view model_id, KvStore& into) {
  SLIMKV_ASSIGN_OR_RETURN(MappedFile file, MappedFile::open(path));
  return read_kv_transfer(file.data(), file.size_bytes(), path, model_id, into);
}

}  // namespace slimkv
