// Attention of a query tile over one block of FP32 (or FP16/BF16) keys and values, folded into running
// partials. Used by the `dense` codec and for every codec's open (not yet sealed) block.
#pragma once

#include <cstdint>
#include <span>

#include "attention/partial.h"
#include "tensor/block_shape.h"
#include "tensor/dtype.h"

namespace slimkv {

// The largest block this kernel takes (scores of one query live on the stack).
inline constexpr int kMaxBlockTokens = 256;

// k: [block_tokens, k_dim], v: [block_tokens, v_dim]; for each query i of the tile, tokens
// [0, tile.visible[i]) are folded into partials(first_partial + i).
void attend_block_f32(const QueryTile& tile, const float* k, const float* v, int k_dim, int v_dim,
                      AttentionPartials& partials, int first_partial = 0);

// The same over keys and values stored in FP16 or BF16 (`dtype`), widened in registers as they are
// read (a dense:dtype=f16 block needs no FP32 copy): the bits attend_block_f32 gives over the widened rows.
void attend_block_half(const QueryTile& tile, const uint16_t* k, const uint16_t* v, DType dtype, int k_dim, int v_dim,
                       AttentionPartials& partials, int first_partial = 0);

// The same over a run of blocks (a head's sealed blocks, in order), each K [block_tokens, k_dim] then
// V [block_tokens, v_dim] in `dtype` (FP32, FP16 or BF16): the bits of attend_block_f32/half a block at a
// time. While one block is read the next one's cache lines are asked for a slice at a time (the blocks lie
// apart in the pool, where the hardware prefetcher cannot follow; spread_prefetch.h).
void attend_dense_blocks(std::span<const uint8_t* const> blocks, DType dtype, const BlockShape& shape,
                         const QueryTile& tile, AttentionPartials& partials, int first_partial = 0);

// The same fold with the scores given instead of keys (tokens a selector has scored exactly: the keys
// need not be read again). scores [n, n_queries]: q_i·k_j, unscaled (multiplied by `scale` here);
// v [n, v_dim]; every query sees all n tokens. n <= kMaxBlockTokens.
void attend_scored_f32(const float* scores, float scale, int n_queries, const float* v, int n, int v_dim,
                       AttentionPartials& partials, int first_partial = 0);

}  // namespace slimkv
