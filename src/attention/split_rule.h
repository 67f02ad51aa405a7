// How the GPU's attention kernels cut a query tile's KV blocks into splits (split-K: each split a CTA's
// partial, merged after; attention/cuda/split_k.cuh): by the tile's own sequence alone — the tile's
// blocks and the sequence's number of tiles — never by the rest of the step. A split's blocks, each
// warp's within it and the merge's order are then the same whatever shares the step, so a sequence's
// attention has the bits it has alone (a server's greedy outputs equal the request's alone, issue 22).
// A sequence alone fills about one wave of the kernel (splits_per_tile: its resident CTAs over the KV
// heads; each of a sequence's tiles takes splits_per_tile / its tiles), in at most ceil(blocks /
// min_blocks) splits (more than min_blocks / 2 blocks each; min_blocks when it divides them): a big batch
// of long sequences then keeps its partials (and their merge) to fewer than one-block splits would, and a
// kernel whose CTA costs more than its blocks' bytes (the quantized decode kernel's:
// cuda/quantized_attention.cu) gives each warp several. Plain functions of ints, for the kernels and the
// planners alike.
#pragma once

#include "util/host_device.h"

namespace slimkv {

inline constexpr int kMinBlocksPerSplit = 2;

// Blocks of each split of a tile of `blocks` blocks (at least 1).
SLIMKV_HOST_DEVICE inline int blocks_per_split(int blocks, int sequence_tiles, int splits_per_tile,
                                                int min_blocks = kMinBlocksPerSplit) {
  const int wanted = splits_per_tile / (sequence_tiles > 1 ? sequence_tiles : 1);
  int splits = (blocks + min_blocks - 1) / min_blocks;
  if (splits > wanted) splits = wanted;
  if (splits < 1) splits = 1;
  return blocks > splits ? (blocks + splits - 1) / splits : 1;
}

// The splits that hold a tile's `blocks` blocks (0 for none).
SLIMKV_HOST_DEVICE inline int splits_of(int blocks, int sequence_tiles, int splits_per_tile,
                                         int min_blocks = kMinBlocksPerSplit) {
  const int per_split = blocks_per_split(blocks, sequence_tiles, splits_per_tile, min_blocks);
  return (blocks + per_split - 1) / per_split;
}

// The most splits of any tile of up to `blocks` blocks (at least 1): a grid's bound. splits_of is not
// monotone in the blocks — 31 blocks cut into 16 splits of 2, 33 into 11 of 3 — and a tile's blocks are
// its own (causal prefill tiles, sliding windows), so the planner, which knows the sequence's blocks,
// bounds them all.
SLIMKV_HOST_DEVICE inline int most_splits_of(int blocks, int sequence_tiles, int splits_per_tile,
                                              int min_blocks = kMinBlocksPerSplit) {
  const int wanted = splits_per_tile / (sequence_tiles > 1 ? sequence_tiles : 1);
  const int most = (blocks + min_blocks - 1) / min_blocks;
  return most < wanted ? (most > 1 ? most : 1) : (wanted > 1 ? wanted : 1);
}

}  // namespace slimkv
