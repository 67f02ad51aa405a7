// What the GPU attention kernels read of a KV cache: plain views of device memory (pointers, strides and
// block tables), filled by the caches of kv/cuda/ and never a cache itself, so that attention/ knows no
// store (ARCHITECTURE.md: "each reading a plain view struct").
//
//   FP16 pages (PagedKvView), layer l: K, V [num_blocks, num_kv_heads, kCudaBlockTokens, head_dim]
//   sealed blocks (QuantizedKvView):   [num_blocks, num_kv_heads, block_bytes] in the CPU codec's byte
//                                      layout (tensor/quantized_block.h); zack+hack / zack+quant: each
//                                      block [heads' blocks at their own ranks, back to back]
//   ZACK blocks (ZackKvView), layer l: [num_blocks, block_elements] FP16, each KV head at its own ranks
#pragma once

#include <cstdint>

namespace slimkv::cuda {

constexpr int kCudaBlockTokens = 64;  // tokens of a GPU KV block: HACK's Π, like the CPU store's default

// One layer's FP16 pages.
struct PagedKvView {
  const uint16_t* k = nullptr;  // FP16 [num_blocks, num_kv_heads, kCudaBlockTokens, head_dim]
  const uint16_t* v = nullptr;
  const int* block_tables = nullptr;  // [sequences, block_table_stride]: sequence s's block j
  int block_table_stride = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

// A quantized block's size and the byte offsets of its layout's sections (K codes at 0), as the kernels
// that seal and read blocks take them (QuantizedBlockLayout's, in ints).
struct QuantizedBlockOffsets {
  int block_bytes = 0;
  int k_mins = 0, k_scales = 0, k_sums = 0, v_codes = 0, v_mins = 0, v_scales = 0, v_sums = 0;
};

// One KV head's sealed block when heads differ (ZACK's ranks followed by a quantizing codec): the
// layout of tensor/quantized_block.h at BlockShape{kCudaBlockTokens, k_dim, v_dim}, byte_offset bytes
// into the block of every head (a multiple of 64: every section stays 16-byte aligned).
struct QuantizedHeadLayout {
  int byte_offset = 0;
  int k_dim = 0, v_dim = 0;  // multiples of 4, at most the kernels' head_dim
  QuantizedBlockOffsets offsets;
};

// One layer's sealed `hack` / `quant` blocks.
struct QuantizedKvView {
  const uint8_t* blocks = nullptr;  // [num_blocks, num_kv_heads, block_bytes]
  // [sequences, the FP16 view's block_table_stride]: sequence s's block j is sealed block
  // block_tables[s·stride + j] >> table_shift.
  const int* block_tables = nullptr;
  bool hack = true;                 // integer attention (HACK Eq. 4); false: `quant`, dequantized in FP32
  int k_bits = 2, v_bits = 2;
  QuantizedBlockOffsets offsets;
  // Which values share a min and scale (QuantizationConfig's layouts, issue 28): HACK's K per (token,
  // partition) and V per column, or K per channel over groups of k_group_tokens and V per token over
  // groups of v_group_dims columns.
  bool k_per_channel = false, v_per_token = false;
  int k_group_tokens = kCudaBlockTokens, v_group_dims = 0;
  // 1: the host tiers' staging, whose tables (shared with the FP16 view) name FP16 blocks 2s for
  // staging slot s (kv/cuda/host_kv_tier.h).
  int table_shift = 0;
  // ZACK's heads at their own dims (device [num_kv_heads]; HACK's layout only): block i of the pool is
  // blocks + i · block_stride, head g's part of it at heads[g]; offsets.block_bytes is then the largest
  // head's (what a kernel stages). Null: every head head_dim wide, `offsets` alike.
  const QuantizedHeadLayout* heads = nullptr;
  long long block_stride = 0;
};

// Where one KV head's part of a ZACK block sits (ZACK §5.2: every (layer, KV head) keeps its own
// ranks), in FP16 elements from the block's start: K' then V', both dim-major ([rank, kCudaBlockTokens]:
// a dim's 64 tokens are one 128-byte row, so every rank stages in whole 16-byte pieces and no padding
// is stored), V' right after K' (v_offset = k_offset + k_rank · kCudaBlockTokens: the kernel copies a
// head's part of a block as one range).
struct ZackHeadLayout {
  int k_offset = 0, k_rank = 0, v_offset = 0, v_rank = 0;
};

// One layer's ZACK blocks: [num_blocks, block_elements] FP16, head g at heads[g].
struct ZackKvView {
  const uint16_t* blocks = nullptr;
  long long block_elements = 0;
  const ZackHeadLayout* heads = nullptr;  // device [num_kv_heads]
  const int* block_tables = nullptr;      // [sequences, block_table_stride]: sequence s's block j
  int block_table_stride = 0;
  int num_kv_heads = 0;
};

}  // namespace slimkv::cuda
