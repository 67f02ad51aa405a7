// The FlashAttention-2 tile both tensor-core prefill kernels run (prefill_attention.cuh: the paged FP16 KV,
// its sealed blocks dequantized or skipped; zack_prefill_attention.cuh: ZACK's blocks at each head's ranks):
// kPrefillTileRows query rows of one KV head over a range of 64-token blocks, Q·Kᵀ and P·V as mma.sync
// m16n8k16 (FP16 in, FP32 accumulation), S and the online softmax in registers, K/V blocks staged in shared
// memory with cp.async double buffering; each CTA writes its rows' output (one split) or split partial.
//
// What differs between the kernels is where a block comes from and how it lies in shared memory, a policy
// the tile takes (`Blocks`, plain member functions; each kernel's file defines its own):
//   int first_block() const                     the first block the tile's rows read
//   TileSplit split(int split, int num_blocks) const    the blocks of the CTA's split (of the grid's
//                                               p.num_splits) before num_blocks, and the partial slot it writes
//   int q_dims() const                          Q's dims the tile reads (the rest staged as zeros)
//   int k_steps() const                         k16 steps of Q·Kᵀ (dims of K read, in 16s)
//   int v_tiles() const                         n8 tiles of O (dims of V read, in 8s; even)
//   void stage(int block, __half* k, __half* v)       issues block's cp.async copies into a stage's tiles
//   void land(int block, __half* k, __half* v)        after they landed: anything to finish in shared memory
//   void k_fragments(unsigned (&b)[4], const __half* k, int kk, int j, int lane)
//       the B fragments of k-steps kk (b[0], b[1]) and kk + 1 (b[2], b[3]) for token tile j (tokens 8j..)
//   void v_fragments(unsigned (&b)[4], const __half* v, int t, int d, int lane)
//       the B fragments of dim tiles d (b[0], b[1]) and d + 1 (b[2], b[3]) for tokens 16t..16t + 15
// A paged policy's counts are compile-time constants (the loops unroll to exactly the dense kernel's); a
// ZACK policy's are the head's ranks rounded up to 16, and the loops stop there: a head of rank r costs r's
// share of the mma work, its padding rows staged as zeros.
#pragma once

#include <cuda_fp16.h>

#include "attention/cuda/device_ops.cuh"
#include "attention/cuda/prefill_attention.cuh"
#include "attention/cuda/softmax_state.cuh"

namespace slimkv::cuda {

constexpr int kRowTiles = kPrefillRowTilesPerWarp;
constexpr int kRows = 2 * kRowTiles;               // rows of S and O a lane holds
constexpr int kTokenTiles = kCudaBlockTokens / 8;  // n8 tiles of S per block

// Shared memory of the tile: Q [kPrefillTileRows, kHeadDim], then 2 stages of K and V tiles of
// kCudaBlockTokens · kHeadDim halves each (a policy may lay a stage out as it likes within that).
template <int kHeadDim>
__host__ __device__ constexpr size_t prefill_tile_shared_bytes() {
  return size_t(kPrefillTileRows + 4 * kCudaBlockTokens) * kHeadDim * sizeof(__half);
}

// What a lane holds of its warp's rows, in the mma accumulator layout: in row tile m it holds rows
// g = lane / 4 and g + 8, and columns 2(lane % 4), +1 of every 8-column tile of S and O; its row
// h = 2m + (0 or 1). The softmax state is in base 2 (scores · scale · log2 e).
template <int kHeadDim>
struct RowState {
  static constexpr int kDimTiles = kHeadDim / 8;  // n8 tiles of O
  int position[kRows];  // the row's query position (inactive rows: the tile's last)
  float running_max[kRows], sum[kRows];
  float o[kRowTiles][kDimTiles][4];
};
using Scores = float[kRowTiles][kTokenTiles][4];  // S of the warp's rows × one block

// Q rows of the tile (zeros for inactive rows and for dims from q_dims on) into shared memory, through
// cp.async.
template <int kHeadDim>
__device__ __forceinline__ void stage_queries(const AttentionLaunch& p, const TileQueries& tq, int kv_head, int q_dims,
                                              __half* q_shared) {
  constexpr int kChunks = kHeadDim / 8;
  for (int i = threadIdx.x; i < kPrefillTileRows * kChunks; i += kPrefillThreads) {
    const int r = i / kChunks, chunk = i % kChunks;
    const bool active = r < tq.active_rows;
    const int head = kv_head * p.group + r % p.group;
    const size_t query = size_t(tq.query_begin + tq.first_query + (active ? r / p.group : 0));
    const int bytes = active ? 2 * min(8, max(0, q_dims - 8 * chunk)) : 0;
    cp_async_16_partial(q_shared + swizzled<kHeadDim>(r, chunk),
                        p.q + (query * p.num_heads + (active ? head : 0)) * kHeadDim + chunk * 8, bytes);
  }
}

// S = Q · Kᵀ for the warp's rows × the block's 64 tokens, two k16 steps at a time (the last one alone when
// the policy's count is odd); Q's fragments come from shared memory each time (registers hold S and O).
// Each K fragment serves the warp's kRowTiles row tiles: half the shared-memory traffic per mma of one tile.
template <int kHeadDim, typename Blocks>
__device__ __forceinline__ void compute_qk(const Blocks& blocks, const __half* q_shared, const __half* k_block, int warp_row,
                                           int lane, Scores& s) {
  constexpr int kKSteps = kHeadDim / 16;  // k16 steps of Q·Kᵀ at most
  const int k_steps = blocks.k_steps();
#pragma unroll
  for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.0f;
  }
#pragma unroll
  for (int kk = 0; kk < kKSteps; kk += 2) {
    if (kk >= k_steps) break;
    const bool second = kk + 1 < k_steps;
    unsigned a[kRowTiles][2][4];
#pragma unroll
    for (int m = 0; m < kRowTiles; ++m) {
      const int r = warp_row + 16 * m + lane % 8 + (lane / 8 % 2) * 8;
      ldmatrix_x4(a[m][0], q_shared + swizzled<kHeadDim>(r, 2 * kk + lane / 16));
      ldmatrix_x4(a[m][1], q_shared + swizzled<kHeadDim>(r, 2 * kk + 2 + lane / 16));
    }
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j) {
      unsigned b[4];
      blocks.k_fragments(b, k_block, kk, j, lane);
#pragma unroll
      for (int m = 0; m < kRowTiles; ++m) {
        mma_16816(s[m][j], a[m][0], b[0], b[1]);
        if (second) mma_16816(s[m][j], a[m][1], b[2], b[3]);
      }
    }
  }
}

// The causal mask (and the sequence's end) and the sliding window: -inf where a token lies after the
// row's position or before its window.
__device__ __forceinline__ void mask_causal(int block, int column, const int (&position)[kRows], int window_tokens,
                                            Scores& s) {
#pragma unroll
  for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j) {
      const int token = block * kCudaBlockTokens + 8 * j + column;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (masked_token(token + e % 2, position[2 * m + e / 2], window_tokens)) s[m][j][e] = -INFINITY;
      }
    }
  }
}

// Online softmax (FlashAttention-2 Algorithm 1, lines 9-10): each row's new max over the block (the
// quad of lanes sharing a row agrees by shuffles) rescales its O (the policy's v_tiles: the rest stays 0)
// and sum; reference[h] is what the block's weights are taken against.
template <int kHeadDim, typename Blocks>
__device__ __forceinline__ void update_mdo_states(const Blocks& blocks, const Scores& s, float scale_log2,
                                                  RowState<kHeadDim>& state, float (&reference)[kRows]) {
  const int v_tiles = blocks.v_tiles();
#pragma unroll
  for (int h = 0; h < kRows; ++h) {
    const int m = h / 2, e0 = 2 * (h % 2);
    float block_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j) block_max = fmaxf(block_max, fmaxf(s[m][j][e0], s[m][j][e0 + 1]));
    block_max = fmaxf(block_max, __shfl_xor_sync(kFullMask, block_max, 1));
    block_max = fmaxf(block_max, __shfl_xor_sync(kFullMask, block_max, 2));
    const float new_max = fmaxf(state.running_max[h], block_max * scale_log2);
    reference[h] = softmax_reference(new_max);  // all masked so far: exp2 gives 0, not NaN
    const float rescale = exp2f(state.running_max[h] - reference[h]);
    state.running_max[h] = new_max;
    state.sum[h] *= rescale;
#pragma unroll
    for (int d = 0; d < RowState<kHeadDim>::kDimTiles; ++d) {
      if (d >= v_tiles) break;
      state.o[m][d][e0] *= rescale;
      state.o[m][d][e0 + 1] *= rescale;
    }
  }
}

// O += P · V with P = exp2(S · scale_log2 − reference), 16 tokens at a time: S's accumulators for token
// tiles 2t, 2t+1 are exactly the A fragment of P for k-step t (rounded to FP16). O's tiles past the
// policy's v_tiles stay 0.
template <int kHeadDim, typename Blocks>
__device__ __forceinline__ void compute_sfm_v(const Blocks& blocks, const Scores& s, const float (&reference)[kRows],
                                              float scale_log2, const __half* v_block, int lane, RowState<kHeadDim>& state) {
  const int v_tiles = blocks.v_tiles();
#pragma unroll
  for (int t = 0; t < kTokenTiles / 2; ++t) {
    unsigned a[kRowTiles][4];
#pragma unroll
    for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
      for (int half_tile = 0; half_tile < 2; ++half_tile) {
        float weight[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = 2 * m + e / 2;
          weight[e] = exp2f(fmaf(s[m][2 * t + half_tile][e], scale_log2, -reference[h]));
          state.sum[h] += weight[e];
        }
        a[m][2 * half_tile] = pack_halves(weight[0], weight[1]);
        a[m][2 * half_tile + 1] = pack_halves(weight[2], weight[3]);
      }
    }
#pragma unroll
    for (int d = 0; d < RowState<kHeadDim>::kDimTiles; d += 2) {
      if (d >= v_tiles) break;
      unsigned b[4];
      blocks.v_fragments(b, v_block, t, d, lane);
#pragma unroll
      for (int m = 0; m < kRowTiles; ++m) {
        mma_16816(state.o[m][d], a[m], b[0], b[1]);
        mma_16816(state.o[m][d + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// The lane's active rows: O / sum as the output (one split) or O, max and sum as the partial of `slot`.
template <int kHeadDim>
__device__ __forceinline__ void write_rows(const AttentionLaunch& p, const TileQueries& tq, int tile, int kv_head, int slot,
                                           int warp_row, int lane, RowState<kHeadDim>& state) {
  const int group_row = lane / 4, column = 2 * (lane % 4);
  // Each row's sum over its quad of lanes; the max is already uniform over the quad.
#pragma unroll
  for (int h = 0; h < kRows; ++h) {
    state.sum[h] += __shfl_xor_sync(kFullMask, state.sum[h], 1);
    state.sum[h] += __shfl_xor_sync(kFullMask, state.sum[h], 2);
  }
#pragma unroll
  for (int h = 0; h < kRows; ++h) {
    const int m = h / 2, e0 = 2 * (h % 2);
    const int r = warp_row + 16 * m + group_row + 8 * (h % 2);
    if (r >= tq.active_rows) continue;
    if (p.split_stride == 1) {
      const float inverse = state.sum[h] > 0.0f ? 1.0f / state.sum[h] : 0.0f;
      const int head = kv_head * p.group + r % p.group;
      __half* out = p.out + (size_t(tq.query_begin + tq.first_query + r / p.group) * p.num_heads + head) * kHeadDim + column;
#pragma unroll
      for (int d = 0; d < RowState<kHeadDim>::kDimTiles; ++d) {
        *reinterpret_cast<__half2*>(out + 8 * d) = __floats2half2_rn(state.o[m][d][e0] * inverse, state.o[m][d][e0 + 1] * inverse);
      }
    } else {
      const size_t row = (size_t(tile) * p.num_kv_heads + kv_head) * kPrefillTileRows + r;
      float* acc = p.partial_acc + (row * p.split_stride + slot) * kHeadDim + column;
#pragma unroll
      for (int d = 0; d < RowState<kHeadDim>::kDimTiles; ++d) {
        *reinterpret_cast<float2*>(acc + 8 * d) = make_float2(state.o[m][d][e0], state.o[m][d][e0 + 1]);
      }
      if (lane % 4 == 0) p.partial_max_sum[row * p.split_stride + slot] = make_float2(state.running_max[h], state.sum[h]);
    }
  }
}

// The CTA's work: the tile of kPrefillTileRows query rows (row r: query head kv_head·group + r % group at
// query first_query + r / group) over split `split` of its KV blocks, from blocks.first_block() on. Warp w
// owns kRowTiles m16 tiles of rows, 16·kRowTiles·w onwards (RowState). The next block's copy runs while
// this one is computed. `shared`: prefill_tile_shared_bytes<kHeadDim>() bytes (a policy's own after them).
template <int kHeadDim, typename Blocks>
__device__ __forceinline__ void attend_prefill_tile(const AttentionLaunch& p, const TileQueries& tq, int tile, int kv_head,
                                                    int split, Blocks& blocks, void* shared) {
  constexpr int kBlockHalves = kCudaBlockTokens * kHeadDim;
  __half* q_shared = reinterpret_cast<__half*>(shared);       // [kPrefillTileRows, kHeadDim]
  __half* k_shared = q_shared + kPrefillTileRows * kHeadDim;  // [2 stages, kBlockHalves]
  __half* v_shared = k_shared + 2 * kBlockHalves;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int num_blocks = (tq.kv_end + kCudaBlockTokens - 1) / kCudaBlockTokens;
  const TileSplit range = blocks.split(split, num_blocks);
  if (range.slot >= p.split_stride) return;  // past the row's splits (a kernel after another: paged_attention.cu)
  const int block_begin = range.begin, block_end = range.end;

  stage_queries<kHeadDim>(p, tq, kv_head, blocks.q_dims(), q_shared);
  if (block_begin < block_end) blocks.stage(block_begin, k_shared, v_shared);
  cp_async_commit();

  const int column = 2 * (lane % 4), warp_row = warp * 16 * kRowTiles;
  RowState<kHeadDim> state;
#pragma unroll
  for (int h = 0; h < kRows; ++h) {  // inactive rows attend like the tile's last query and are never written
    const int r = warp_row + 16 * (h / 2) + lane / 4 + 8 * (h % 2);
    state.position[h] = r < tq.active_rows ? tq.first_position + tq.first_query + r / p.group : tq.kv_end - 1;
    state.running_max[h] = -INFINITY;
    state.sum[h] = 0.0f;
  }
#pragma unroll
  for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
    for (int d = 0; d < RowState<kHeadDim>::kDimTiles; ++d) state.o[m][d][0] = state.o[m][d][1] = state.o[m][d][2] = state.o[m][d][3] = 0.0f;
  }
  const int first_position = tq.first_position + tq.first_query;  // the tile's; later blocks need the mask

  for (int block = block_begin; block < block_end; ++block) {
    const int index = (block - block_begin) & 1;
    __half* k_block = k_shared + index * kBlockHalves;
    __half* v_block = v_shared + index * kBlockHalves;
    cp_async_wait<0>();
    __syncthreads();
    blocks.land(block, k_block, v_block);
    if (block + 1 < block_end) {
      blocks.stage(block + 1, k_shared + (index ^ 1) * kBlockHalves, v_shared + (index ^ 1) * kBlockHalves);
      cp_async_commit();
    }
    Scores s;
    compute_qk<kHeadDim>(blocks, q_shared, k_block, warp_row, lane, s);
    // Blocks reaching past the tile's first position, or (sliding window) before its last one's window.
    const bool before_window = p.window_tokens > 0 && block * kCudaBlockTokens <= tq.kv_end - 1 - p.window_tokens;
    if ((block + 1) * kCudaBlockTokens - 1 > first_position || before_window) {
      mask_causal(block, column, state.position, p.window_tokens, s);
    }
    float reference[kRows];
    update_mdo_states(blocks, s, p.scale_log2, state, reference);
    compute_sfm_v<kHeadDim>(blocks, s, reference, p.scale_log2, v_block, lane, state);
    __syncthreads();  // the stage is refilled by the next iteration
  }
  cp_async_wait<0>();  // a CTA with no blocks still has its Q copy in flight
  write_rows(p, tq, tile, kv_head, range.slot, warp_row, lane, state);
}

}  // namespace slimkv::cuda
