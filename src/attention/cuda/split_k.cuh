// What the paged attention kernels share (attention/cuda/paged_attention.h): the launch parameters,
// where a query tile's rows sit, and how a CTA's warps combine their partials into the CTA's split
// partial, which merge_split_partials (paged_attention.cu) then merges over the splits. The dense FP16
// kernel (paged_attention.cu) and the quantized ones (quantized_attention.cu) differ only in how a
// warp reads a block.
#pragma once

#include <cuda_fp16.h>

#include "attention/cuda/paged_attention.h"
#include "attention/cuda/kv_views.h"
#include "attention/cuda/softmax_state.cuh"
#include "attention/split_rule.h"

namespace slimkv::cuda {

constexpr int kWarps = 4;  // per CTA; each warp takes every kWarps-th block of the CTA's range
constexpr int kThreads = kWarps * 32;
constexpr int kMaxResidentCtas = 8;  // per multiprocessor, of any attention kernel (sizes the partials)
constexpr float kLog2e = 1.4426950408889634f;  // scores are kept in base 2: exp2f is one instruction

struct AttentionLaunch {
  const __half* q;                 // [queries, num_heads, head_dim]
  __half* out;                     // [queries, num_heads, head_dim]
  const __half* k_pool;            // [num_blocks, num_kv_heads, kCudaBlockTokens, head_dim]
  const __half* v_pool;
  const int* block_tables;         // [sequences, block_table_stride]
  int block_table_stride;
  const int* sequence_ids;         // [batch]
  const int* kv_lens;              // [batch]
  const int* query_starts;         // [batch + 1]
  const int2* tiles;               // [num_tiles]: (batch index, first query of the sequence's)
  int num_heads, num_kv_heads, head_dim, group, positions_per_tile, rows_per_tile;
  // How a tile's blocks are split (tile_split below): about splits_per_tile splits for a sequence of one
  // tile (the kernel's resident CTAs over the KV heads: one wave for a sequence alone), each of at least
  // min_blocks_per_split blocks (split_rule.h); num_splits, the grid's, is the most of any tile of the step.
  int splits_per_tile, min_blocks_per_split, num_splits, num_tiles;
  // Partials per row (>= the splits of every kernel writing the row): the merge's splits. Two kernels
  // whose blocks of one row differ (sealed blocks on INT8 tensor cores, the rest in FP16) write disjoint
  // splits of the same rows: the second's come after the first's splits of that tile, which it counts
  // with the first's splits_per_tile (and the same min_blocks_per_split), given as after_splits_per_tile
  // (0: no kernel before). With one split in all (and a kernel that can), the kernel writes the output
  // itself.
  int split_stride, after_splits_per_tile;
  // Sliding-window layers: a query at position p sees tokens p - window_tokens + 1 .. p (0: all before
  // it). Blocks wholly before a tile's first query's window are not read at all.
  int window_tokens;
  float scale;                     // softmax scale
  float scale_log2;                // softmax scale · log2(e)
  float* partial_acc;              // [num_tiles, num_kv_heads, rows_per_tile, split_stride, head_dim]
  float2* partial_max_sum;         // [num_tiles, num_kv_heads, rows_per_tile, split_stride]: base-2 max, sum
};

// Points p's per-step arrays at a step's metadata on the device (lay_out_attention_batch's layout).
inline void point_at_batch(AttentionLaunch& p, const int* metadata, int max_batch) {
  p.sequence_ids = metadata;
  p.kv_lens = metadata + max_batch;
  p.query_starts = metadata + 2 * max_batch;
  p.tiles = reinterpret_cast<const int2*>(metadata + attention_tiles_offset(max_batch));
}

// What every launch over a step's tiles sets alike (the dense and quantized kernels, HACK's INT8 prefill,
// ZACK's prefill): its queries and outputs, the blocks' tables, the step's metadata, the heads, the softmax
// scale and the split partials' buffers. The caller adds its tiles' shape, its splits and its KV.
inline AttentionLaunch step_launch(const uint16_t* q, uint16_t* out, const int* block_tables, int block_table_stride,
                                   const int* metadata, int max_batch, int num_heads, int num_kv_heads, int head_dim,
                                   float scale, float* partial_acc, float* partial_max_sum) {
  AttentionLaunch p{};
  p.q = reinterpret_cast<const __half*>(q);
  p.out = reinterpret_cast<__half*>(out);
  p.block_tables = block_tables;
  p.block_table_stride = block_table_stride;
  point_at_batch(p, metadata, max_batch);
  p.num_heads = num_heads;
  p.num_kv_heads = num_kv_heads;
  p.head_dim = head_dim;
  p.group = num_heads / num_kv_heads;
  p.min_blocks_per_split = kMinBlocksPerSplit;
  p.scale = scale;
  p.scale_log2 = scale * kLog2e;
  p.partial_acc = partial_acc;
  p.partial_max_sum = reinterpret_cast<float2*>(partial_max_sum);
  return p;
}

// Where a tile's queries sit: rows r < active_rows are query head kv_head·group + r % group at query
// first_query + r / group of the sequence, whose position is first_position + that query. Its rows see
// tokens [kv_begin, kv_end) between them (kv_begin > 0 only in a sliding window).
struct TileQueries {
  int batch_index, first_query, query_begin, n_queries, first_position, active_rows, kv_begin, kv_end;

  __device__ TileQueries(const AttentionLaunch& p, int tile) {
    const int2 t = p.tiles[tile];
    batch_index = t.x;
    first_query = t.y;
    query_begin = p.query_starts[batch_index];
    n_queries = p.query_starts[batch_index + 1] - query_begin;
    first_position = p.kv_lens[batch_index] - n_queries;
    const int tile_queries = min(p.positions_per_tile, n_queries - first_query);
    active_rows = p.group * tile_queries;
    kv_end = first_position + first_query + tile_queries;  // the tokens its last query sees (causal)
    kv_begin = p.window_tokens > 0 ? max(0, first_position + first_query - p.window_tokens + 1) : 0;
  }
};

// A CTA's split of its tile's blocks: blocks [begin, end) (empty past the tile's splits: the CTA writes an
// empty partial) and the partial slot it writes.
struct TileSplit {
  int begin, end, slot;
};

// The tiles of the tile's sequence (split_rule.h's sequence_tiles).
__device__ inline int sequence_tiles(const AttentionLaunch& p, const TileQueries& tq) {
  return (tq.n_queries + p.positions_per_tile - 1) / p.positions_per_tile;
}

// Split `split` of a tile's blocks [first_block, end_block) at splits_per_tile, cut by its sequence alone
// (split_rule.h), written to slot `split`: ZACK's prefill gives each KV head a splits_per_tile of its own.
__device__ inline TileSplit tile_split_at(const AttentionLaunch& p, const TileQueries& tq, int splits_per_tile, int split,
                                          int first_block, int end_block) {
  const int per_split =
      blocks_per_split(max(end_block - first_block, 0), sequence_tiles(p, tq), splits_per_tile, p.min_blocks_per_split);
  const int begin = first_block + split * per_split;
  return {begin, min(begin + per_split, end_block), split};
}

// Split `split` of a tile's blocks [first_block, end_block) at the launch's splits_per_tile; its slot after
// the splits of a kernel before it over the same rows (AttentionLaunch::after_splits_per_tile, whose
// blocks were [0, after_blocks)).
__device__ inline TileSplit tile_split(const AttentionLaunch& p, const TileQueries& tq, int split, int first_block,
                                       int end_block, int after_blocks = 0) {
  TileSplit range = tile_split_at(p, tq, p.splits_per_tile, split, first_block, end_block);
  if (p.after_splits_per_tile > 0) {
    range.slot += splits_of(after_blocks, sequence_tiles(p, tq), p.after_splits_per_tile, p.min_blocks_per_split);
  }
  return range;
}

// Whether a token lies outside what a query at `position` sees: after it (causal), or before its window.
__device__ __forceinline__ bool masked_token(int token, int position, int window_tokens) {
  return token > position || (window_tokens > 0 && token <= position - window_tokens);
}

// After __syncthreads: merges the warps' partials (warp_acc[w][r][c], warp_max_sum[w][r] = (base-2
// max, sum)) of the CTA (split blockIdx.x, KV head blockIdx.y, tile blockIdx.z) and stores them as the
// CTA's split partial.
template <int kHeadDim, int kRows>
__device__ void store_cta_partial(const AttentionLaunch& p, int active_rows, const float (&warp_acc)[kWarps][kRows][kHeadDim],
                                  const float2 (&warp_max_sum)[kWarps][kRows]) {
  const int split = blockIdx.x, kv_head = blockIdx.y, tile = blockIdx.z;
  for (int i = threadIdx.x; i < kRows * kHeadDim; i += kThreads) {
    const int r = i / kHeadDim, c = i % kHeadDim;
    if (r >= active_rows) continue;
    float max_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) max_all = fmaxf(max_all, warp_max_sum[w][r].x);
    const float reference = softmax_reference(max_all);
    float total = 0.0f, weighted = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float factor = exp2f(warp_max_sum[w][r].x - reference);
      total += factor * warp_max_sum[w][r].y;
      weighted += factor * warp_acc[w][r][c];
    }
    const size_t row = (size_t(tile) * p.num_kv_heads + kv_head) * kRows + r;
    p.partial_acc[(row * p.split_stride + split) * kHeadDim + c] = weighted;
    if (c == 0) p.partial_max_sum[row * p.split_stride + split] = make_float2(max_all, total);
  }
}

// Where KV head kv_head's part of block `block` of sequence `sequence` starts among the sealed blocks
// (the quantized kernels: decode and prefill), through the sealed blocks' own tables.
__device__ __forceinline__ const uint8_t* sealed_block_address(const QuantizedKvView& sealed, const AttentionLaunch& p,
                                                               int sequence, int block, int kv_head) {
  const int entry = sealed.block_tables[size_t(sequence) * p.block_table_stride + block];
  if (sealed.heads != nullptr) {
    return sealed.blocks + size_t(entry >> sealed.table_shift) * size_t(sealed.block_stride) + sealed.heads[kv_head].byte_offset;
  }
  return sealed.blocks + (size_t(entry >> sealed.table_shift) * p.num_kv_heads + kv_head) * sealed.offsets.block_bytes;
}

// KV head kv_head's block layout and dims: its own (ZACK's ranks), or the view's at the kernel's head_dim.
struct SealedHead {
  QuantizedBlockOffsets offsets;
  int k_dim, v_dim;
};
__device__ __forceinline__ SealedHead sealed_head(const QuantizedKvView& sealed, int kv_head, int head_dim) {
  if (sealed.heads == nullptr) return {sealed.offsets, head_dim, head_dim};
  const QuantizedHeadLayout& head = sealed.heads[kv_head];
  return {head.offsets, head.k_dim, head.v_dim};
}

// Merges the split partials of every row and writes the attention output (paged_attention.cu).
void launch_merge_split_partials(const AttentionLaunch& p);

}  // namespace slimkv::cuda
