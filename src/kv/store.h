// The paged KV store of one sequence: for every layer and KV head, a list of sealed blocks (encoded by
// the codec) and one open block of the newest tokens in FP16.
//
//   layer l, kv head g:  [ block 0 | block 1 | ... | block n-1 ] [ open: < block_tokens tokens ]
//                          sealed, codec-encoded, from the pool      FP16, appended to
//
// With sinks=N / window=W (KvPipeline::sink_tokens, recent_tokens) the open part holds up to W +
// block_tokens - 1 tokens (a block is sealed once it leaves the W newest), and the first N tokens are
// also kept in FP16 once block 0 is sealed (in full-attention layers: a sliding-window layer's queries
// do not see them).
//
// The open block is FP16 as in HACK (requantization elimination): the newest tokens stay
// unquantized, but at half the bytes of FP32, which is most of the store's memory at 2 bits and a few
// thousand tokens. A codec whose sealed blocks are FP32 (dense) keeps its open block in FP32
// (Codec::open_block_dtype). Attention reads the open rows in place (the FP16 kernel widens in
// registers); a codec sealing the block takes them widened to FP32 (widen_open).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "kv/block_pool.h"
#include "kv/kv_factory.h"
#include "kv/select/selector.h"
#include "slimkv/kv_memory.h"

namespace slimkv {

struct KvShape {
  KvShape() = default;
  KvShape(int num_layers, int num_kv_heads, int k_dim, int v_dim, int max_tokens)
      : num_layers(num_layers), num_kv_heads(num_kv_heads), k_dim(k_dim), v_dim(v_dim), max_tokens(max_tokens) {}

  int num_layers = 0;
  int num_kv_heads = 0;
  int k_dim = 0;        // per-head dims of stored keys (the widest head when heads differ)
  int v_dim = 0;        // per-head dims of stored values (likewise)
  int max_tokens = 0;   // the context length
  // Dims of each (layer, KV head) when heads differ (ZACK's per-head ranks, §5.2), [num_layers *
  // num_kv_heads] each; empty when every head stores k_dim and v_dim.
  std::vector<int> head_k_dims, head_v_dims;
  // Sliding-window layers (Gemma 3), [num_layers]: a query at position p of layer l sees only positions
  // p - window_tokens[l] + 1 .. p, so the store keeps only the blocks some later query can still see.
  // 0: the layer sees the whole context. Empty: no layer slides.
  std::vector<int> window_tokens;

  bool heads_differ() const { return !head_k_dims.empty(); }
  int window_of(int layer) const { return window_tokens.empty() ? 0 : window_tokens[size_t(layer)]; }
  bool any_window() const;
  int k_dim_of(int layer, int head) const { return heads_differ() ? head_k_dims[head_index(layer, head)] : k_dim; }
  int v_dim_of(int layer, int head) const { return heads_differ() ? head_v_dims[head_index(layer, head)] : v_dim; }
  // A token's row of one layer's keys / values: its heads' vectors back to back, Σ_g k_dim_of(layer, g).
  int layer_k_dims(int layer) const;
  int layer_v_dims(int layer) const;

 private:
  size_t head_index(int layer, int head) const { return size_t(layer) * size_t(num_kv_heads) + size_t(head); }
};


class KvStore {
 public:
  KvStore(const KvShape& shape, const KvPipeline& pipeline);

  const KvShape& shape() const { return shape_; }
  const BlockShape& block_shape(int layer, int head) const { return head_of(layer, head).block_shape; }
  size_t block_bytes(int layer, int head) const { return head_of(layer, head).block_bytes; }
  // The codec of a head's sealed blocks: the pipeline's, or its wide codec for the heads hibits names.
  const Codec& codec(int layer, int head) const { return *head_of(layer, head).codec; }
  int block_tokens() const { return pipeline_.block_tokens; }
  // K and V are stored Hadamard-rotated (kv/rotation.h): queries must be rotated alike, and outputs back.
  bool rotated() const { return pipeline_.hadamard; }

  // Appends n tokens to `layer`: k [n, layer_k_dims(layer)], v [n, layer_v_dims(layer)] (each row the
  // heads' vectors back to back: [num_kv_heads, k_dim] when heads do not differ).
  // Every block that fills is sealed by the codec. The caller keeps num_tokens <= max_tokens.
  void append(int layer, const float* k, const float* v, int n);

  int num_tokens(int layer) const { return layers_[size_t(layer)].num_tokens; }
  // Sealed blocks, freed ones included: indices 0 .. num_sealed_blocks - 1 name the same tokens as ever.
  int num_sealed_blocks(int layer) const;
  // A sliding-window layer frees its oldest blocks: those before first_live_block are gone (sealed_block
  // must not be asked for them). 0 for a layer that sees the whole context.
  int first_live_block(int layer) const { return layers_[size_t(layer)].first_live_block; }
  // Frees the sealed blocks of a sliding-window layer that no query after the last appended token can see
  // (all their tokens before num_tokens - window + 1): called once the layer's queries have attended.
  // Nothing for a layer without a window.
  void release_outside_window(int layer);
  const uint8_t* sealed_block(int layer, int head, int index) const {
    const uint8_t* block = head_of(layer, head).sealed[size_t(index)];
    return offload_ ? offload_->read(block) : block;
  }
  // The unsealed tokens: fewer than block_tokens, or fewer than block_tokens + recent_tokens with window=W.
  int open_tokens(int layer) const { return num_tokens(layer) - num_sealed_blocks(layer) * block_tokens(); }
  // sinks=N: how many of block 0's first tokens attention reads from sink_keys / sink_values (FP16 rows
  // in open_dtype(), [N, k_dim_of] and [N, v_dim_of]) instead of the block: N once block 0 is sealed in a
  // full-attention layer, else 0. The block's own rows for them are not those tokens (sealed without them).
  int sink_tokens(int layer) const {
    return num_sealed_blocks(layer) > 0 && shape_.window_of(layer) == 0 ? pipeline_.sink_tokens : 0;
  }
  const uint8_t* sink_keys(int layer, int head) const { return head_of(layer, head).sink_k.data(); }
  const uint8_t* sink_values(int layer, int head) const { return head_of(layer, head).sink_v.data(); }
  // The sink rows of one head widened to FP32: k [sink_tokens(layer), k_dim_of], v likewise.
  void widen_sinks(int layer, int head, float* k, float* v) const;
  // Asks for the rows (keys, values or both) of sealed tokens of one head ahead of reading them: a token
  // selection's rows are scattered, and asked for a few tokens ahead (kPrefetchTokens) their cache misses
  // overlap (measured on this machine, 512-byte rows: 87 ns a row without, 41 at 8-16 rows ahead, 45 at
  // 64; a block ahead at once queued them and gained less). tokens: ascending, all sealed.
  static constexpr int kPrefetchTokens = 16;
  void prefetch_sealed_tokens(int layer, int head, const int* tokens, int n, bool keys, bool values) const;
  // The open block of one head as stored, in open_dtype() (FP16, or FP32 for the dense FP32 codec): keys
  // [pipeline().unsealed_rows(), k_dim_of], values likewise, the first open_tokens(layer) rows filled.
  // Attention reads it in place (attend_block_half), with no FP32 copy.
  DType open_dtype() const { return open_dtype_; }
  const uint8_t* open_keys(int layer, int head) const { return head_of(layer, head).open_k.data(); }
  const uint8_t* open_values(int layer, int head) const { return head_of(layer, head).open_v.data(); }
  // The open block's first n tokens of one head, widened to FP32: k [n, k_dim_of], v [n, v_dim_of].
  void widen_open(int layer, int head, int n, float* k, float* v) const {
    widen_open(head_of(layer, head), n, k, v);
  }

  // prefill=exact: the last append of more than one token (a prefill chunk) as appended, FP32 and
  // rotated as the store keeps K/V, so that the chunk's queries can read their own tokens exactly
  // (kv/store_attention.h). Scratch of one chunk, like the model's activations: each such append
  // replaces it, any other append to its layer drops it, and memory() does not count it.
  struct ExactChunk {
    int first_token = 0, n = 0;  // tokens [first_token, first_token + n) of the layer; n = 0: none
    const float* k = nullptr;    // [n, k_dim_of(layer, head)]
    const float* v = nullptr;    // [n, v_dim_of(layer, head)]
  };
  ExactChunk exact_chunk(int layer, int head) const;

  // The selector's choice for one decode query per head (q: [num_heads, k_dim], as attention gets it),
  // one HeadSelection per KV head; every token for a prefill chunk (n > 1) and for the `all` selector.
  const std::vector<HeadSelection>& select(int layer, const float* q, int n, int num_heads, ThreadPool& pool);
  // What select() last chose for (layer, KV head): the token indices of the last decode step (for
  // fidelity measurements: recall of the selection against the exact top-k).
  const HeadSelection& last_selection(int layer, int head) const { return selections_[size_t(layer)][size_t(head)]; }

  KvMemory memory() const;
  // The offload tier's cache hits, misses and bytes moved (all zero for the fast tier).
  TierStats tier_stats() const { return offload_ ? offload_->stats() : TierStats{}; }
  void clear();  // back to an empty sequence, keeping allocations

  // The pipeline the store encodes with; its describe() is the spec a KV transfer must match.
  const KvPipeline& pipeline() const { return pipeline_; }

  // Restoring a sequence written by another worker (kv/transfer.h), which validates every size first.
  // Into a cleared store, per layer: restore_sealed_block for each block of each head, in order (every
  // head the same number), then (sinks=N, once block 0 is sealed) restore_sink_tokens for each head,
  // then restore_open_tokens for each head, n = 0 included: it sets the layer's token count. The store
  // then holds exactly what the sender's did, and appending continues as there.
  // block: block_bytes(layer, head) bytes, copied. Sinks: k [sink_tokens(layer), k_dim_of], v likewise.
  // Open: k [n, k_dim_of], v [n, v_dim_of], n < block_tokens + recent_tokens (and at least recent_tokens
  // once a block is sealed). Rows in FP32 as widen_sinks / widen_open give them: rounding them back to
  // the store's FP16 is exact.
  void restore_sealed_block(int layer, int head, const uint8_t* block);
  void restore_sink_tokens(int layer, int head, const float* k, const float* v);
  void restore_open_tokens(int layer, int head, const float* k, const float* v, int n);
  // restore_sealed_block in place, for a receiver that reads a block straight into the store (no copy):
  // the slot that restore_sealed_block would copy the next block of (layer, head) into, block_bytes
  // rounded up to 64 bytes, or nullptr when sealed blocks do not stay where they are written (the
  // offload tier moves each to its slow tier: restore_sealed_block then). Once filled, the slot becomes
  // the block by keep_restored_block, in the order the slots of the (layer, head) were taken; a slot
  // never kept stays taken until clear() (a receiver that fails drops the store).
  uint8_t* restore_slot(int layer, int head);
  void keep_restored_block(int layer, int head, uint8_t* slot);

 private:
  struct Head {
    BlockShape block_shape;  // this head's dims
    const Codec* codec = nullptr;  // KvPipeline::codec_of(layer, head)
    size_t block_bytes = 0;  // codec->block_bytes(block_shape)
    BlockPool* pool = nullptr;  // the pool of blocks of that size
    std::vector<const uint8_t*> sealed;
    // [block_tokens + recent_tokens, k_dim] and [.., v_dim] in open_dtype_
    std::vector<uint8_t> open_k, open_v;
    std::vector<uint8_t> sink_k, sink_v;  // sinks=N: [N, k_dim], [N, v_dim] in open_dtype_; else empty
  };
  struct Layer {
    std::vector<Head> heads;
    int num_tokens = 0;
    int first_live_block = 0;  // sliding-window layers: the blocks before it are freed
  };
  const Head& head_of(int layer, int head) const { return layers_[size_t(layer)].heads[size_t(head)]; }
  void widen_open(const Head& head, int n, float* k, float* v) const;
  // Seals the open part's first block_tokens rows of every head of a layer, then moves the rest (the
  // recent window) to the front.
  void seal_oldest(int layer_index, std::vector<float>& k, std::vector<float>& v);
  // Rounds FP32 rows to open_dtype_ into the open block from token `first`: k [n, k_dim], v [n, v_dim].
  void narrow_open(const float* k, const float* v, int first, int n, Head& head) const;
  // Rounds `count` FP32 values to open_dtype_ into `out` (rows of the open block or the sinks).
  void narrow_to_open_dtype(const float* in, size_t count, uint8_t* out) const;
  uint64_t block_seed(int layer, int head, int index) const;
  // Where a block is sealed (a pool slot, or the offload tier's scratch), and where it then stays.
  uint8_t* seal_destination(Head& head) { return offload_ ? offload_->scratch() : head.pool->allocate(); }
  const uint8_t* keep_sealed(uint8_t* block) { return offload_ ? offload_->slow_block(offload_->write(block)) : block; }
  // Brings the sealed blocks a layer's attention will read into the fast tier (offload only).
  void stage_blocks(int layer, const std::vector<HeadSelection>& selection);

  KvShape shape_;
  KvPipeline pipeline_;
  std::map<size_t, BlockPool> pools_;  // by block bytes: one for all heads unless ZACK's ranks differ
  bool requantizes_open_;  // the codec's answer, asked once
  DType open_dtype_;       // likewise: FP16, or FP32 for the dense FP32 codec
  std::vector<Layer> layers_;
  struct Chunk {  // what exact_chunk() returns, for every head of one layer
    int layer = -1, first_token = 0, n = 0;
    std::vector<std::vector<float>> k, v;  // [num_kv_heads][n, k_dim_of / v_dim_of]
  } chunk_;
  std::unique_ptr<OffloadTier> offload_;                 // kv/tier: null for the fast tier
  std::unique_ptr<Selector> selector_;                   // kv/select: all, pq, oracle
  std::vector<std::vector<HeadSelection>> selections_;  // [layer][kv head], from the last select()
};

}  // namespace slimkv
