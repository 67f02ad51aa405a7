// ZACK's prefill attention on tensor cores (ZACK §5.1–5.3 at the dense prefill kernel's speed): the
// FlashAttention-2 tile of prefill_attention_tile.cuh over ZACK's blocks (kv_views.h ZackKvView), each KV
// head at its own ranks. A CTA takes kPrefillTileRows query rows of one KV head (positions × the GQA
// group) over a split of their blocks, as the paged FP16 kernel does, and stages each block's K' and V'
// once for all of them; Q'·K'ᵀ runs over the head's k_rank dims and P·V' over its v_rank dims (each
// rounded up to 16 with zero rows in shared memory), so a head at half the dims costs half the mma work.
// The blocks are dim-major ([rank, 64 tokens]), the transpose of the paged layout, so the fragments
// come by ldmatrix.trans for K' and plain ldmatrix for V' (the other way round from the paged kernel).
//
// Why not the decode kernel (zack_attention.h) for prefill: its tiles hold 4 or 8 rows (one position at
// GQA 4), so a 512-query chunk made 512 tiles per KV head, each staging every block of its context again,
// and its mma used 4 of 16 rows: on H100 (Llama-3-8B, a 16K prompt) it took 2473 ms of attention against
// the dense prefill kernel's 271 ms.
#pragma once

#include "attention/cuda/prefill_attention.cuh"

namespace slimkv::cuda {

// Opts the kernel for head_dim (64 or 128: prefill_head_dim_supported) into its shared memory and returns
// how many of its CTAs are resident per multiprocessor (0 on an error, which the launch then reports).
int zack_prefill_attention_setup(int head_dim);

// Grid (split, KV head, tile) as launch_prefill_attention, reading the blocks of kv (p.block_tables are
// kv's, p.head_dim the model's, each head's q holding its reduced query in the first k_rank dims; its
// output's dims past v_rank are written 0). head_splits_per_tile: device [num_kv_heads], each head's
// splits_per_tile (split_rule.h; p.splits_per_tile unused), so that a head of higher ranks takes more
// splits and every CTA about the same work (ZACK §5.3's balance), a tile's blocks cut by its own sequence
// and head alone: a sequence's output has the same bits whatever shares the step (issue 22). p.num_splits
// bounds every tile's splits; those past a tile's own write empty partials. With one split in all it
// writes the output directly, with several the split partials, for launch_merge_split_partials.
void launch_zack_prefill_attention(const AttentionLaunch& p, const ZackKvView& kv, const int* head_splits_per_tile);

}  // namespace slimkv::cuda
