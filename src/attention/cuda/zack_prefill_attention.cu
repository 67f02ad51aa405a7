#include "attention/cuda/zack_prefill_attention.cuh"

#include <cuda_fp16.h>

#include "attention/cuda/device_ops.cuh"
#include "attention/cuda/prefill_attention_tile.cuh"

namespace slimkv::cuda {
namespace {

// ZACK's blocks (prefill_attention_tile.cuh's policy): the head's K' and V' of a block staged dim-major as
// they are stored, each dim's 64 tokens one 128-byte row of the stage tile ([dims, 64 tokens], swizzled),
// dims up to the rank rounded to 16 (the pad rows zero); tokens past what the tile's rows see are zeros
// (stale values, maybe NaN, would meet P's zeros in P·V').
template <int kHeadDim>
struct ZackBlocks {
  const __half* blocks;
  long long block_elements;
  ZackHeadLayout head;
  const int* table;
  int kv_end, k_rows, v_rows;  // k_rows, v_rows: the ranks rounded up to 16
  const AttentionLaunch& p;
  const TileQueries& tq;
  int splits_per_tile;         // the head's (split_rule.h)

  __device__ ZackBlocks(const AttentionLaunch& p, const ZackKvView& kv, const int* head_splits_per_tile,
                        const TileQueries& tq, int kv_head)
      : blocks(reinterpret_cast<const __half*>(kv.blocks)), block_elements(kv.block_elements), head(kv.heads[kv_head]),
        table(p.block_tables + size_t(p.sequence_ids[tq.batch_index]) * p.block_table_stride), kv_end(tq.kv_end),
        k_rows((head.k_rank + 15) / 16 * 16), v_rows((head.v_rank + 15) / 16 * 16), p(p), tq(tq),
        splits_per_tile(head_splits_per_tile[kv_head]) {}

  __device__ int first_block() const { return 0; }
  // The tile's blocks cut by its sequence alone, at its head's splits_per_tile.
  __device__ TileSplit split(int split, int num_blocks) const {
    return tile_split_at(p, tq, splits_per_tile, split, first_block(), num_blocks);
  }
  __device__ int q_dims() const { return head.k_rank; }
  __device__ int k_steps() const { return k_rows / 16; }
  __device__ int v_tiles() const { return v_rows / 8; }

  // A thread copies chunk threadIdx.x % 8 (tokens 8·chunk..) of rows threadIdx.x / 8 + 16i: its chunk,
  // and so the bytes of it the tile sees, stay fixed.
  __device__ void stage(int block, __half* k, __half* v) const {
    static_assert(kPrefillThreads == 16 * 8, "16 rows of 8 chunks per pass");
    const int chunk = threadIdx.x % 8, first_row = threadIdx.x / 8;
    const int bytes = 2 * min(8, max(0, kv_end - block * kCudaBlockTokens - 8 * chunk));
    const __half* base = blocks + size_t(table[block]) * size_t(block_elements) + chunk * 8;
    for (int row = first_row; row < k_rows; row += 16) {
      const bool stored = row < head.k_rank;
      cp_async_16_partial(k + swizzled<kCudaBlockTokens>(row, chunk),
                          base + head.k_offset + (stored ? row : 0) * kCudaBlockTokens, stored ? bytes : 0);
    }
    for (int row = first_row; row < v_rows; row += 16) {
      const bool stored = row < head.v_rank;
      cp_async_16_partial(v + swizzled<kCudaBlockTokens>(row, chunk),
                          base + head.v_offset + (stored ? row : 0) * kCudaBlockTokens, stored ? bytes : 0);
    }
  }
  __device__ void land(int, __half*, __half*) const {}

  // K' rows are dims, so Kᵀ's columns come transposed: matrix m = lane / 8 is dims 16kk + 8m.. of tokens
  // 8j.. (chunk j); lane l addresses row l % 8 of matrix m, dim 16kk + l.
  __device__ static void k_fragments(unsigned (&b)[4], const __half* k, int kk, int j, int lane) {
    ldmatrix_x4_trans(b, k + swizzled<kCudaBlockTokens>(16 * kk + lane, j));
  }
  // V' rows are dims (B's columns), its tokens B's k: matrix m is dims 8(d + m / 2).. of tokens
  // 16t + 8(m % 2).. (chunk 2t + m % 2).
  __device__ static void v_fragments(unsigned (&b)[4], const __half* v, int t, int d, int lane) {
    ldmatrix_x4(b, v + swizzled<kCudaBlockTokens>(8 * d + 8 * (lane / 16) + lane % 8, 2 * t + lane / 8 % 2));
  }
};

// One CTA per (split, KV head, tile), the longest tiles (a sequence's last) first.
template <int kHeadDim>
__global__ __launch_bounds__(kPrefillThreads) void zack_prefill_attention_partials(AttentionLaunch p, ZackKvView kv,
                                                                                   const int* head_splits_per_tile) {
  extern __shared__ uint4 shared_raw[];
  const int split = blockIdx.x, kv_head = blockIdx.y, tile = p.num_tiles - 1 - int(blockIdx.z);
  const TileQueries tq(p, tile);
  ZackBlocks<kHeadDim> blocks(p, kv, head_splits_per_tile, tq, kv_head);
  attend_prefill_tile<kHeadDim>(p, tq, tile, kv_head, split, blocks, shared_raw);
}

using ZackPrefillKernel = void (*)(AttentionLaunch, ZackKvView, const int*);

ZackPrefillKernel pick(int head_dim) {
  return head_dim == 64 ? zack_prefill_attention_partials<64> : zack_prefill_attention_partials<128>;
}
size_t shared_bytes(int head_dim) {
  return head_dim == 64 ? prefill_tile_shared_bytes<64>() : prefill_tile_shared_bytes<128>();
}

}  // namespace

int zack_prefill_attention_setup(int head_dim) {
  if (!prefill_head_dim_supported(head_dim) ||
      cudaFuncSetAttribute(pick(head_dim), cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes(head_dim))) != cudaSuccess) {
    return 0;
  }
  int ctas = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, pick(head_dim), kPrefillThreads, shared_bytes(head_dim)) != cudaSuccess) {
    return 0;
  }
  return ctas;
}

void launch_zack_prefill_attention(const AttentionLaunch& p, const ZackKvView& kv, const int* head_splits_per_tile) {
  const dim3 grid(unsigned(p.num_splits), unsigned(p.num_kv_heads), unsigned(p.num_tiles));
  pick(p.head_dim)<<<grid, kPrefillThreads, shared_bytes(p.head_dim)>>>(p, kv, head_splits_per_tile);
}

}  // namespace slimkv::cuda
