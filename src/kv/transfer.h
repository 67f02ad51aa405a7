// The KV transfer format: one sequence's KV store as bytes, so that a prefill worker can hand a sequence
// to a decode worker (disaggregated serving) or save it to a file. The byte layout is specified in
// docs/kv_transfer_format.md (versions 1 to 3); in short, little-endian, every section 64-byte aligned:
//
//   header (128 B) | metadata: tokens per layer, KV spec, model id | sealed blocks, exactly as the codec
//   stores them | the open blocks' tokens, FP32 | trailer (16 B): CRC32C of everything before it
//
// Lossless: a restored store holds the sender's bytes, so attention over it equals the sender's bit for
// bit, and appending continues as it would have there (block seeds follow from the block's identity).
// Canonical: one store and model id give one byte string, so write → read → write gives the same bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kv/store.h"
#include "slimkv/status.h"
#include "util/crc32c.h"  // the format's checksum

namespace slimkv {

// The newest version this code writes and reads: 1 when every head has the same dims, 2 when they differ
// (ZACK's per-head ranks: each head's dims and block size in the metadata), 3 when the spec keeps FP16
// sink tokens or a recent window (sinks=N, window=W: the counts in the metadata, the rows beside the
// open tokens). It reads all three.
inline constexpr uint32_t kKvTransferVersion = 3;
inline constexpr size_t kKvTransferHeaderBytes = 128;
inline constexpr size_t kKvTransferTrailerBytes = 16;
inline constexpr size_t kKvTransferAlignment = 64;          // every section and sealed block starts here
inline constexpr size_t kKvTransferMaxStringBytes = 4096;   // the longest KV spec or model id

// Replaces `out` with the transfer of `store`. `model_id` names the weights that computed the KV (e.g.
// "qwen2.5-0.5b-instruct@<hash of the safetensors>"); a reader refuses KV made by another model.
// Fails only for a model id longer than kKvTransferMaxStringBytes.
Status write_kv_transfer(const KvStore& store, std::string_view model_id, std::vector<uint8_t>& out);

// Replaces the contents of `into` with the sequence in data [size bytes]. Everything is checked before
// the store is touched (on error it is unchanged): magic, version, truncation (naming the section cut),
// checksums, the structure, then against the receiver: model id, KV spec (pipeline().describe()), shape
// (layers, KV heads, k_dim, v_dim; max_tokens may differ, but every layer's tokens must fit the store).
// Errors start with "kv transfer '<source>'" and name both sides of any mismatch.
// received_crc: the CRC32C of bytes [0, trailer) that a receiver computed as the bytes arrived (src/transfer/'s
// KV stream checks each frame as it lands): it is compared with the trailer's instead of reading every
// byte again. Absent (a file, bytes from anywhere else): computed here.
Status read_kv_transfer(const uint8_t* data, size_t size, std::string_view source, std::string_view model_id,
                        KvStore& into, std::optional<uint32_t> received_crc = std::nullopt);

// The transfer in pieces, for a sender that ships each layer as soon as it is final (src/transfer/'s
// KV stream): the head (header and metadata: bytes [0, sealed_offset)) of the transfer `store` will
// have once every layer holds `tokens_per_layer` tokens; one layer's bytes as the transfer holds them
// (its sealed blocks, `sealed_bytes` of them, then its open tokens: KvTransferLayerRanges); and the
// 16-byte trailer for the CRC32C of everything before it (the head, every layer's sealed bytes in
// order, then every layer's open bytes). Concatenated in that order they are write_kv_transfer's bytes.
// A sender may ship a layer's first sealed blocks earlier, while its later tokens are still being
// computed (a prompt prefilled in chunks): write_kv_transfer_blocks gives blocks [first_block,
// end_block) of every head (head by head, each block in its 64-byte slot: in version 2 each head's
// blocks of its own size), and write_kv_transfer_layer with first_block > 0 leaves the blocks before it
// out of the layer's bytes. Sealed blocks never change.
// part_crcs / head_crcs (nullptr: not computed): the CRC32C of each head's blocks written, then (a
// layer's) of its open tokens, computed as the bytes are copied (in cache), for a sender whose frames
// carry CRCs of those parts (src/transfer/kv_frame.h) and need not read them again.
Status write_kv_transfer_head(const KvStore& store, std::string_view model_id, int tokens_per_layer,
                              std::vector<uint8_t>& out);
Status write_kv_transfer_layer(const KvStore& store, int layer, int first_block, std::vector<uint8_t>& out,
                               size_t& sealed_bytes, std::vector<uint32_t>* part_crcs = nullptr);
Status write_kv_transfer_blocks(const KvStore& store, int layer, int first_block, int end_block, std::vector<uint8_t>& out,
                                std::vector<uint32_t>* head_crcs = nullptr);
std::array<uint8_t, kKvTransferTrailerBytes> kv_transfer_trailer(uint32_t crc);

// The same through a file (written to a temporary name and renamed, so no reader sees half a file).
Status write_kv_transfer_file(const KvStore& store, std::string_view model_id, const std::string& path);
Status read_kv_transfer_file(const std::string& path, std::string_view model_id, KvStore& into);

// What a transfer holds, once its structure and checksums are checked (no receiver yet): for a worker
// that picks its pipeline from the sender's spec, and for tools that list transfers.
struct KvTransferInfo {
  uint32_t version = 0;
  std::string spec;                 // the sender's KvPipeline::describe()
  std::string model_id;
  KvShape shape;                    // the sender's, max_tokens included (version 2: each head's dims)
  int block_tokens = 0;
  uint64_t sealed_block_bytes = 0;  // Codec::block_bytes of the sender's block shape (version 2: the largest)
  std::vector<uint64_t> head_block_bytes;  // version 2: each (layer, KV head)'s, layer by layer; else empty
  std::vector<int> layer_tokens;    // tokens held by each layer [num_layers]
  int sink_tokens = 0, recent_tokens = 0;  // version 3: the spec's sinks=N and window=W; else 0
  uint64_t total_bytes = 0;
  uint64_t sealed_offset = 0, open_offset = 0, trailer_offset = 0;  // where the sections start
};
// A layer's sealed blocks, FP16 sink rows and open tokens, as the transfer holds them.
int kv_transfer_sealed_blocks(const KvTransferInfo& info, int layer);
int kv_transfer_sink_tokens(const KvTransferInfo& info, int layer);
int kv_transfer_open_tokens(const KvTransferInfo& info, int layer);
Expected<KvTransferInfo> inspect_kv_transfer(const uint8_t* data, size_t size, std::string_view source);
// The same with the CRC32C of bytes [0, trailer_offset) given: a receiver that checksummed each piece
// as it arrived (src/transfer/'s KV stream) has every check but without reading the bytes again.
Expected<KvTransferInfo> inspect_kv_transfer_with_crc(const uint8_t* data, size_t size, std::string_view source,
                                                      uint32_t body_crc);

// The same for a transfer's head alone: the header and metadata, bytes [0, sealed_offset) of data [size
// bytes], with every check of the full reader that needs no later byte. For a receiver that gets the
// rest in pieces (src/transfer/'s KV stream sends a layer at a time); the rest is checked once
// assembled (inspect_kv_transfer_with_crc), or piece by piece as it is restored (restore_kv_transfer_blocks
// below).
Expected<KvTransferInfo> inspect_kv_transfer_head(const uint8_t* data, size_t size, std::string_view source);

// Where each layer's bytes lie in a transfer [num_layers]: its sealed blocks (every KV head's, one
// range) and its open tokens (every head's K and V records, one range; version 3: each head's sink K
// and V records before them).
struct KvTransferLayerRanges {
  uint64_t sealed_offset = 0, sealed_bytes = 0, open_offset = 0, open_bytes = 0;
};
std::vector<KvTransferLayerRanges> kv_transfer_layer_ranges(const KvTransferInfo& info);

// read_kv_transfer in parts, for a receiver that does not keep the sealed blocks in a KvStore (a GPU
// cache: kv/cuda/gpu_kv_transfer.h): every check of read_kv_transfer against `into` (which is not
// touched; received_crc as there); then, on the info it returns, the open tokens restored into the
// cleared `into` (each layer's tokens after its sealed blocks, as open tokens), and each layer's sealed
// blocks copied into pages.
Expected<KvTransferInfo> check_kv_transfer_for(const uint8_t* data, size_t size, std::string_view source,
                                               std::string_view model_id, const KvStore& into,
                                               std::optional<uint32_t> received_crc = std::nullopt);
void restore_kv_transfer_open_tokens(const uint8_t* data, const KvTransferInfo& info, KvStore& into);
// The rest of read_kv_transfer after check_kv_transfer_for: `into` cleared, then every layer's sealed
// blocks and open tokens restored (for a caller that decides something on the info in between).
void restore_kv_transfer(const uint8_t* data, const KvTransferInfo& info, KvStore& into);

// check_kv_transfer_for and restore_kv_transfer from a transfer's pieces as they arrive, with no buffer
// of the whole transfer (src/transfer/'s KV stream receiver restores each piece of a layer's frame into
// a staging store while it is still in cache, and later layers are still on the wire). In this order:
//   check_kv_transfer_head_for: `into` against the head alone (model, spec, shape, blocks; `info` from
//     inspect_kv_transfer_head), then into.clear();
//   per layer 0, 1, ...: its sealed blocks, head by head, each head's in order, in runs of whole 64-byte
//     block slots as the transfer holds them (restore_kv_transfer_blocks: `count` slots from block
//     `first_block` of the head; each slot's padding must be zero; or, read straight into the store's
//     own slots, KvStore::restore_slot, keep_kv_transfer_blocks), then its open tokens
//     (restore_kv_transfer_open: the layer's open range, every head's K and V records, checked as
//     check_kv_transfer_for checks them: zero padding, values this spec's open block holds);
//   check_kv_transfer_trailer: the trailer, its CRC against `body_crc`, the CRC32C of every byte before
//     it as the receiver computed it while they arrived.
// A piece is in the store before the CRC of the frame that brought it is checked: a receiver that gets
// an error anywhere drops `into`. Errors name the layer, head and block.
Status check_kv_transfer_head_for(const KvTransferInfo& info, std::string_view source, std::string_view model_id,
                                  const KvStore& into);
Status restore_kv_transfer_blocks(const uint8_t* slots, int count, const KvTransferInfo& info, int layer, int head,
                                  int first_block, std::string_view source, KvStore& into);
Status keep_kv_transfer_blocks(std::span<uint8_t* const> slots, const KvTransferInfo& info, int layer, int head,
                               int first_block, std::string_view source, KvStore& into);
Status restore_kv_transfer_open(const uint8_t* records, const KvTransferInfo& info, int layer, std::string_view source,
                                KvStore& into);
Status check_kv_transfer_trailer(const uint8_t* trailer, const KvTransferInfo& info, uint32_t body_crc,
                                 std::string_view source);

// How a GPU cache lays out one block of every KV head (a page; GpuKvCache::device_page_layout): head
// g's sealed block is the concatenation of pieces p, each at page offset piece_offsets[p] + g *
// piece_bytes[p] (dense FP16 pages: K of every head, then V of every head: two pieces; hack/quant pages:
// every head's codec bytes: one).
struct KvPageLayout {
  size_t page_bytes = 0;
  std::vector<size_t> piece_offsets, piece_bytes;
};
// Layer `layer`'s sealed blocks (of a transfer checked by check_kv_transfer_for) into out [blocks,
// page_bytes], blocks = the layer's tokens / block_tokens; bytes of a page no piece covers are untouched.
void copy_kv_transfer_pages(const uint8_t* data, const KvTransferInfo& info, int layer, const KvPageLayout& pages,
                            uint8_t* out);
// The same from a store the transfer was restored into (a staged import: engine/kv_staging.h): layer
// `layer`'s sealed blocks [first_block, first_block + blocks) of `store` (it holds them) into out [blocks,
// page_bytes]; for a store restored from a transfer, copy_kv_transfer_pages's bytes of those blocks.
void copy_kv_store_pages(const KvStore& store, int layer, int first_block, int blocks, const KvPageLayout& pages,
                         uint8_t* out);
// The transfer of a sequence whose first `blocks` blocks of every layer are pages, layer l's [blocks,
// page_bytes] at layer_pages(l) (read before the next call), and whose remaining tokens, fewer than a
// block per layer, are `open`'s open tokens (a store of the sequence's pipeline and shape holding only
// them). write_kv_transfer's bytes for the same sequence, each block written straight from its page.
Status write_kv_transfer_from_pages(const KvPageLayout& pages, int blocks,
                                    const std::function<Expected<const uint8_t*>(int layer)>& layer_pages,
                                    const KvStore& open, std::string_view model_id, std::vector<uint8_t>& out);

}  // namespace slimkv
