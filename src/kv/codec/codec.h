// A codec says how a sealed KV block is encoded and how attention reads it. A block holds the keys and
// values of `block_tokens` consecutive tokens of one layer and one KV head. The newest tokens sit in
// the store's open block, in FP16 (open_block_dtype), until it fills; then the codec seals it (HACK's
// requantization elimination is exactly this: the partial block is never quantized).
//
// Implementations: dense (kv/codec/dense.h); hack, quant and zack come with their issues.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "attention/partial.h"
#include "slimkv/status.h"
#include "tensor/block_shape.h"
#include "tensor/dtype.h"

namespace slimkv {

struct GpuBlockFormat;  // kv/codec/gpu_block_format.h

class Codec {
 public:
  virtual ~Codec() = default;

  // The codec as a canonical spec stage, every option spelled out: "dense:dtype=f32".
  virtual std::string describe() const = 0;

  // Whether this codec can encode blocks of this shape (e.g. head dims a multiple of 4); checked
  // once when a store is made for a model, so that attend() never meets a shape it cannot read.
  virtual Status check_shape(const BlockShape& /*shape*/) const { return Status::ok(); }

  // What the GPU's KV caches run of this codec (kv/codec/gpu_block_format.h); by default nothing.
  virtual GpuBlockFormat gpu_block_format() const;
  // What the store keeps the open block in: FP16, as HACK specifies (half the memory of FP32, and
  // precision to spare for a codec that quantizes); a codec whose sealed blocks keep more says so.
  virtual DType open_block_dtype() const { return DType::kF16; }

  // Bytes of one sealed block of this shape: what the store allocates, and what is sent.
  virtual size_t block_bytes(const BlockShape& shape) const = 0;

  // Encodes a full block. k: [block_tokens, k_dim], v: [block_tokens, v_dim], FP32.
  // `seed` makes stochastic rounding reproducible (the store derives it from the block's identity).
  virtual void seal(const BlockShape& shape, const float* k, const float* v, uint64_t seed,
                    uint8_t* block) const = 0;

  // Work that depends only on the queries (HACK quantizes Q), done once per tile instead of once per
  // block: the store's read path (kv/store_attention.cc) calls this, then passes `prepared` as
  // tile.prepared to attend().
  virtual void prepare_queries(const BlockShape& /*shape*/, const QueryTile& /*tile*/,
                               std::vector<uint8_t>& prepared) const {
    prepared.clear();
  }

  // For each query i of the tile, folds tokens [0, tile.visible[i]) of each sealed block, in order, into
  // partials(first_partial + i). Queries are already scaled by the softmax scale. A run of a head's
  // blocks comes in one call, so that a codec can ask for the next block's cache lines while it reads one
  // (the blocks lie apart in the pool, where the hardware prefetcher cannot follow).
  virtual void attend(const BlockShape& shape, std::span<const uint8_t* const> blocks, const QueryTile& tile,
                      AttentionPartials& partials, int first_partial) const = 0;

  // Whether the open (partial) block must be requantized at every append: HACK without its
  // requantization elimination (the HACK/RQE ablation). Asked once, when a store is made.
  virtual bool requantizes_open_block() const { return false; }
  // Replaces the open block's values by what a cache that keeps the partial block quantized holds
  // after appending tokens [first_new, tokens): the new tokens' K quantized per token, and every V
  // column re-quantized over all `tokens` (dequantized values re-quantized, so error accumulates).
  // k: [tokens, k_dim], v: [tokens, v_dim], FP32, in place.
  virtual void requantize_open_block(const BlockShape& /*shape*/, float* /*k*/, float* /*v*/, int /*first_new*/,
                                     int /*tokens*/, uint64_t /*seed*/) const {}

  // Decodes a sealed block back to FP32 k [block_tokens, k_dim], v [block_tokens, v_dim]: for tests,
  // for moving blocks between codecs, and for fidelity measurements.
  virtual void decode(const BlockShape& shape, const uint8_t* block, float* k, float* v) const = 0;

  // Decodes only some tokens (ascending indices into the block): k [n, k_dim], v [n, v_dim] (v null:
  // the keys only, what pq's re-rank reads; k null: the values only, what attention reads of tokens pq
  // has scored). What attention over a token selection reads (kv/select). By default the whole block,
  // then the rows.
  virtual void decode_tokens(const BlockShape& shape, const uint8_t* block, const int* tokens, int n, float* k,
                             float* v) const;
  // Bytes of the block decode_tokens reads for n tokens' keys and/or values: what such a read moves out
  // of a slower tier (the offload tier counts pq's re-rank reads by it). By default (the whole block
  // decoded, then the rows) the block.
  virtual size_t token_read_bytes(const BlockShape& shape, int /*n*/, bool /*keys*/, bool /*values*/) const {
    return block_bytes(shape);
  }
  // Asks for the rows decode_tokens will read of these tokens (keys, values or both) ahead of time: a
  // selection's rows are scattered, so the hardware prefetcher does not see them coming, and callers
  // ask a few tokens ahead to overlap the misses (KvStore::prefetch_sealed_tokens). A hint: by default
  // nothing.
  virtual void prefetch_tokens(const BlockShape& /*shape*/, const uint8_t* /*block*/, const int* /*tokens*/,
                               int /*n*/, bool /*keys*/, bool /*values*/) const {}
};

// Attention over blocks through their decoded FP32 form: codec.decode() into this thread's buffers,
// then the FP32 block kernel, a block at a time. The `quant` baseline's whole method.
void attend_decoded(const Codec& codec, const BlockShape& shape, std::span<const uint8_t* const> blocks,
                    const QueryTile& tile, AttentionPartials& partials, int first_partial);

// Asks for all of a block's cache lines, into L2 (prefetcht1): what a codec whose kernel reads a block
// whole asks for the next block before it reads one.
void prefetch_block(const uint8_t* block, size_t bytes);

}  // namespace slimkv
