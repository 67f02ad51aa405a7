// Prefill attention on tensor cores (attention/cuda/prefill_attention.cu): the same query tiles,
// split-K and partials as the CUDA-core kernel (split_k.cuh), but a tile holds kPrefillTileRows query
// rows (positions × the GQA group sharing one KV head), and Q·Kᵀ and P·V run as mma.sync m16n8k16
// (FP16 in, FP32 accumulation) in the FlashAttention-2 structure (Dao 2023, Algorithm 1): each warp
// owns 32 rows, S and the online softmax stay in registers, K/V blocks (64 tokens) are staged in shared
// memory with cp.async double buffering; the causal mask is applied only where a block reaches past
// the tile's first position. The tile itself is prefill_attention_tile.cuh's, which ZACK's prefill kernel
// (zack_prefill_attention.cuh) runs over its own blocks.
//
// Measured on H100 (batch 1, 32 q / 8 kv heads, d 128; README "Prefill attention"): one m16 tile per
// warp (64-row tiles) reached 250 TFLOP/s on a full 8K prefill, two (128-row tiles) 312; 8 warps
// (256-row tiles) 314 at 16K but slower at 4K; 32-token steps within a block 289; skipping O's
// rescale when no row max changed 284 (more spills). The kernel sits at ~300 TFLOP/s, FA2-class;
// past that needs Hopper's wgmma.
//
// With quantized KV (kv/cuda/quantized_kv_cache.h) the blocks of a sequence wholly before its
// step's first new token are sealed: the kernel then either dequantizes them into its shared-memory
// tiles (the `quant` baseline: KIVI-style fused dequantization, so `quant` prefill runs at FP16
// tensor-core speed with 2-bit reads) or skips them (`hack`: the INT8 kernel,
// hack_prefill_attention.cuh, attends them and writes other splits of the same rows).
#pragma once

#include "attention/cuda/split_k.cuh"

namespace slimkv::cuda {

constexpr int kPrefillWarps = 4;
constexpr int kPrefillThreads = kPrefillWarps * 32;
constexpr int kPrefillRowTilesPerWarp = 2;  // m16 row tiles per warp
constexpr int kPrefillTileRows = kPrefillWarps * 16 * kPrefillRowTilesPerWarp;

inline bool prefill_head_dim_supported(int head_dim) { return head_dim == 64 || head_dim == 128; }

// Opts the kernel for head_dim into its shared memory and returns how many of its CTAs are resident
// per multiprocessor (0 on an error, which the launch then reports).
int prefill_attention_setup(int head_dim);

// What the kernel does with each sequence's blocks before first_position / kCudaBlockTokens (the
// sealed ones, when the KV is quantized): its splits cover the blocks it reads.
enum class SealedPrefix {
  kNone,        // every block is FP16 (dense KV)
  kDequantize,  // read the sealed blocks of `sealed` (quant), dequantized into the FP16 tiles
  kSkip,        // leave them to another kernel: the splits cut the blocks from the first unsealed one
};

// Grid (split, KV head, tile) as the CUDA-core kernel; with one split it writes the output directly,
// with several the split partials, for launch_merge_split_partials. sealed: for kDequantize.
void launch_prefill_attention(const AttentionLaunch& p, SealedPrefix prefix = SealedPrefix::kNone,
                              const QuantizedKvView& sealed = {});

}  // namespace slimkv::cuda
