#include "attention/cuda/prefill_attention.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "attention/cuda/device_ops.cuh"
#include "attention/cuda/softmax_state.cuh"

namespace slimkv::cuda {
namespace {

// Byte kA of x and byte kB of y, two codes below 1024, as the FP16 pair (x_A, y_B): each put in the low
// mantissa bits of 1024.0 (0x6400), exact, then 1024 taken off: two integer operations and one FP16
// subtraction instead of two quarter-rate int-to-float conversions.
template <int kA, int kB>
__device__ __forceinline__ __half2 code_pair(uint32_t x, uint32_t y) {
  const uint32_t bits = (__byte_perm(x, y, unsigned(kA | (4 + kB) << 8)) & 0x00ff00ffu) | 0x64006400u;
  return __hsub2(*reinterpret_cast<const __half2*>(&bits), __float2half2_rn(1024.0f));
}

// Writes a sealed block (tensor/quantized_block.h's layout, K and V of kBits) dequantized,
// x = min + scale · x' (one FP16 FMA: the nearest FP16 to the exact value), into the FP16 tiles k and v
// [token][dim] (swizzled as the FP16 blocks are staged). A thread takes a K field (4 dims of a token:
// one 8-byte store) or the V fields of two neighbouring columns (4 tokens each: four 4-byte stores).
// KIVI's layouts (issue 28): K's 4 dims have a min and scale each (their channels' in the token's
// group), V's 4 tokens each their own (the two columns are in one group). A ZACK head's (`head` at its
// own dims) dims and columns past its k_dim / v_dim are written 0.
template <int kHeadDim, int kBits>
__device__ inline void dequantize_sealed_block(const uint8_t* block, const QuantizedKvView& sealed, const SealedHead& head,
                                               __half* k, __half* v) {
  constexpr int T = kCudaBlockTokens;
  constexpr int kPartition = kHeadDim < T ? kHeadDim : T;  // K partition dims: min(Π, head_dim); a head's dims end earlier
  const QuantizedBlockOffsets& o = head.offsets;
  const __half* k_mins = reinterpret_cast<const __half*>(block + o.k_mins);
  const __half* k_scales = reinterpret_cast<const __half*>(block + o.k_scales);
  const __half2* v_mins = reinterpret_cast<const __half2*>(block + o.v_mins);
  const __half2* v_scales = reinterpret_cast<const __half2*>(block + o.v_scales);
  for (int i = threadIdx.x; i < kHeadDim / 4 * T; i += kPrefillThreads) {  // dim group g = i / T, token t = i % T
    const int dim = 4 * (i / T), t = i % T;
    if (dim >= head.k_dim) {
      *reinterpret_cast<uint2*>(k + swizzled<kHeadDim>(t, dim / 8) + dim % 8) = make_uint2(0u, 0u);
      continue;
    }
    const uint32_t codes = spread_codes<kBits>(load_field<kBits>(block + i * kBits / 2));
    __half2 lo[2], scale[2];  // of dims (dim, dim + 1), (dim + 2, dim + 3)
    if (sealed.k_per_channel) {
      const int slot = t / sealed.k_group_tokens * kHeadDim + dim;
      for (int x = 0; x < 2; ++x) {
        lo[x] = *reinterpret_cast<const __half2*>(k_mins + slot + 2 * x);
        scale[x] = *reinterpret_cast<const __half2*>(k_scales + slot + 2 * x);
      }
    } else {
      const int slot = dim / kPartition * T + t;
      lo[0] = lo[1] = __half2half2(k_mins[slot]);
      scale[0] = scale[1] = __half2half2(k_scales[slot]);
    }
    const __half2 low = __hfma2(scale[0], code_pair<0, 1>(codes, codes), lo[0]);
    const __half2 high = __hfma2(scale[1], code_pair<2, 3>(codes, codes), lo[1]);
    *reinterpret_cast<uint2*>(k + swizzled<kHeadDim>(t, dim / 8) + dim % 8) =
        make_uint2(*reinterpret_cast<const uint32_t*>(&low), *reinterpret_cast<const uint32_t*>(&high));
  }
  for (int i = threadIdx.x; i < T / 4 * kHeadDim / 2; i += kPrefillThreads) {  // tokens 4u.. of columns c, c + 1
    const int first = 4 * (i / (kHeadDim / 2)), c = 2 * (i % (kHeadDim / 2));
    if (c >= head.v_dim) {
#pragma unroll
      for (int j = 0; j < 4; ++j) *reinterpret_cast<__half2*>(v + swizzled<kHeadDim>(first + j, c / 8) + c % 8) = __float2half2_rn(0.0f);
      continue;
    }
    const uint8_t* fields = block + o.v_codes + (first / 4 * head.v_dim + c) * kBits / 2;
    const uint32_t left = spread_codes<kBits>(load_field<kBits>(fields));
    const uint32_t right = spread_codes<kBits>(load_field<kBits>(fields + kBits / 2));
    __half2 lo[4], scale[4];  // of token first + j's two values
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (sealed.v_per_token) {
        const int slot = c / sealed.v_group_dims * T + first + j;
        lo[j] = __half2half2(reinterpret_cast<const __half*>(v_mins)[slot]);
        scale[j] = __half2half2(reinterpret_cast<const __half*>(v_scales)[slot]);
      } else {
        lo[j] = v_mins[c / 2];
        scale[j] = v_scales[c / 2];
      }
    }
    const __half2 values[4] = {__hfma2(scale[0], code_pair<0, 0>(left, right), lo[0]), __hfma2(scale[1], code_pair<1, 1>(left, right), lo[1]),
                               __hfma2(scale[2], code_pair<2, 2>(left, right), lo[2]), __hfma2(scale[3], code_pair<3, 3>(left, right), lo[3])};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      *reinterpret_cast<__half2*>(v + swizzled<kHeadDim>(first + j, c / 8) + c % 8) = values[j];
    }
  }
}

// --- the kernel's parts (FlashInfer's compute_qk / update_mdo_states / compute_sfm_v shape) ---

constexpr int kRowTiles = kPrefillRowTilesPerWarp;
constexpr int kRows = 2 * kRowTiles;               // rows of S and O a lane holds
constexpr int kTokenTiles = kCudaBlockTokens / 8;  // n8 tiles of S per block

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

// Q rows of the tile (zeros for inactive rows) into shared memory, through cp.async.
template <int kHeadDim>
__device__ __forceinline__ void stage_queries(const AttentionLaunch& p, const TileQueries& tq, int kv_head, __half* q_shared) {
  constexpr int kChunks = kHeadDim / 8;
  for (int i = threadIdx.x; i < kPrefillTileRows * kChunks; i += kPrefillThreads) {
    const int r = i / kChunks, chunk = i % kChunks;
    const bool active = r < tq.active_rows;
    const int head = kv_head * p.group + r % p.group;
    const size_t query = size_t(tq.query_begin + tq.first_query + (active ? r / p.group : 0));
    cp_async_16(q_shared + swizzled<kHeadDim>(r, chunk), p.q + (query * p.num_heads + (active ? head : 0)) * kHeadDim + chunk * 8,
                active);
  }
}

// Block `block` of the sequence into stage tiles k, v (tokens past kv_end zero-filled), through
// cp.async; a sealed block (kDequantize) arrives packed in `packed` instead, dequantized once in.
template <int kHeadDim, SealedPrefix kPrefix>
__device__ __forceinline__ void stage_block(const AttentionLaunch& p, const QuantizedKvView& sealed, const TileQueries& tq,
                                            int sequence, const int* table, int sealed_blocks, int kv_head, int block,
                                            __half* k, __half* v, uint8_t* packed) {
  constexpr int kChunks = kHeadDim / 8;
  constexpr int kBlockHalves = kCudaBlockTokens * kHeadDim;
  if constexpr (kPrefix == SealedPrefix::kDequantize) {
    if (block < sealed_blocks) {
      const uint8_t* source = sealed_block_address(sealed, p, sequence, block, kv_head);
      const int bytes = sealed_head(sealed, kv_head, kHeadDim).offsets.block_bytes;
      for (int i = threadIdx.x * 16; i < bytes; i += kPrefillThreads * 16) cp_async_16(packed + i, source + i);
      return;
    }
  }
  const size_t offset = (size_t(table[block]) * p.num_kv_heads + kv_head) * kBlockHalves;
  for (int i = threadIdx.x; i < kCudaBlockTokens * kChunks; i += kPrefillThreads) {
    const int token = i / kChunks, chunk = i % kChunks;
    const int at = block * kCudaBlockTokens + token;
    const bool valid = at < tq.kv_end && at >= tq.kv_begin;  // zeros elsewhere (a freed block's stale values)
    const size_t source = offset + size_t(token) * kHeadDim + chunk * 8;
    cp_async_16(k + swizzled<kHeadDim>(token, chunk), p.k_pool + source, valid);
    cp_async_16(v + swizzled<kHeadDim>(token, chunk), p.v_pool + source, valid);
  }
}

// S = Q · Kᵀ for the warp's rows × the block's 64 tokens (K rows are Kᵀ's columns), two k16 steps at a
// time; Q's fragments come from shared memory each time (registers hold S and O). Each K fragment
// serves the warp's kRowTiles row tiles: half the shared-memory traffic per mma of one tile.
template <int kHeadDim>
__device__ __forceinline__ void compute_qk(const __half* q_shared, const __half* k_block, int warp_row, int lane, Scores& s) {
  constexpr int kKSteps = kHeadDim / 16;  // k16 steps of Q·Kᵀ
#pragma unroll
  for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.0f;
  }
#pragma unroll
  for (int kk = 0; kk < kKSteps; kk += 2) {
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
      ldmatrix_x4(b, k_block + swizzled<kHeadDim>(8 * j + lane % 8, 2 * kk + lane / 8));
#pragma unroll
      for (int m = 0; m < kRowTiles; ++m) {
        mma_16816(s[m][j], a[m][0], b[0], b[1]);
        mma_16816(s[m][j], a[m][1], b[2], b[3]);
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
// quad of lanes sharing a row agrees by shuffles) rescales its O and sum; reference[h] is what the
// block's weights are taken against.
template <int kHeadDim>
__device__ __forceinline__ void update_mdo_states(const Scores& s, float scale_log2, RowState<kHeadDim>& state,
                                                  float (&reference)[kRows]) {
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
      state.o[m][d][e0] *= rescale;
      state.o[m][d][e0 + 1] *= rescale;
    }
  }
}

// O += P · V with P = exp2(S · scale_log2 − reference), 16 tokens at a time: S's accumulators for token
// tiles 2t, 2t+1 are exactly the A fragment of P for k-step t (rounded to FP16).
template <int kHeadDim>
__device__ __forceinline__ void compute_sfm_v(const Scores& s, const float (&reference)[kRows], float scale_log2,
                                              const __half* v_block, int lane, RowState<kHeadDim>& state) {
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
      unsigned b[4];
      ldmatrix_x4_trans(b, v_block + swizzled<kHeadDim>(16 * t + lane % 8 + (lane / 8 % 2) * 8, d + lane / 16));
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

// --- the kernel ---

// The attention of one tile of kPrefillTileRows query rows (row r: query head kv_head·group + r % group
// at query first_query + r / group) over one split of its KV blocks. Warp w owns kRowTiles m16 tiles
// of rows, 16·kRowTiles·w onwards (RowState). K/V blocks are double-buffered in shared memory: the next
// block's copy runs while this one is computed.
// kPrefix, kBits: what it does with the sealed blocks before each sequence's step (SealedPrefix; kBits
// for kDequantize).
template <int kHeadDim, SealedPrefix kPrefix, int kBits>
__global__ __launch_bounds__(kPrefillThreads) void prefill_attention_partials(AttentionLaunch p, QuantizedKvView sealed) {
  constexpr int kBlockHalves = kCudaBlockTokens * kHeadDim;
  extern __shared__ uint4 shared_raw[];
  __half* q_shared = reinterpret_cast<__half*>(shared_raw);   // [kPrefillTileRows, kHeadDim]
  __half* k_shared = q_shared + kPrefillTileRows * kHeadDim;  // [2 stages, block tokens, kHeadDim]
  __half* v_shared = k_shared + 2 * kBlockHalves;
  uint8_t* packed = reinterpret_cast<uint8_t*>(v_shared + 2 * kBlockHalves);  // a sealed block (kDequantize)

  // The longest tiles (a sequence's last) are launched first, so short ones fill the tail of the grid.
  const int split = blockIdx.x, kv_head = blockIdx.y, tile = p.num_tiles - 1 - int(blockIdx.z);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const TileQueries tq(p, tile);
  const int num_blocks = (tq.kv_end + kCudaBlockTokens - 1) / kCudaBlockTokens;
  const int sealed_blocks = kPrefix == SealedPrefix::kNone ? 0 : tq.first_position / kCudaBlockTokens;
  const int first_block = max(kPrefix == SealedPrefix::kSkip ? sealed_blocks : 0, tq.kv_begin / kCudaBlockTokens);
  const TileSplit range(p, tq, split, first_block, num_blocks, sealed_blocks);
  if (range.slot >= p.split_stride) return;  // past the row's splits (after a kernel before it: see below)
  const int block_begin = range.begin, block_end = range.end;
  const int sequence = p.sequence_ids[tq.batch_index];
  const int* table = p.block_tables + size_t(sequence) * p.block_table_stride;
  const auto stage = [&](int block, int index) {
    stage_block<kHeadDim, kPrefix>(p, sealed, tq, sequence, table, sealed_blocks, kv_head, block,
                                   k_shared + index * kBlockHalves, v_shared + index * kBlockHalves, packed);
  };

  stage_queries<kHeadDim>(p, tq, kv_head, q_shared);
  if (block_begin < block_end) stage(block_begin, 0);
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
    cp_async_wait<0>();
    __syncthreads();
    if constexpr (kPrefix == SealedPrefix::kDequantize) {
      if (block < sealed_blocks) {
        dequantize_sealed_block<kHeadDim, kBits>(packed, sealed, sealed_head(sealed, kv_head, kHeadDim),
                                                 k_shared + index * kBlockHalves, v_shared + index * kBlockHalves);
        __syncthreads();  // the stage is written and `packed` free for the next block
      }
    }
    if (block + 1 < block_end) {
      stage(block + 1, index ^ 1);
      cp_async_commit();
    }
    Scores s;
    compute_qk<kHeadDim>(q_shared, k_shared + index * kBlockHalves, warp_row, lane, s);
    // Blocks reaching past the tile's first position, or (sliding window) before its last one's window.
    const bool before_window = p.window_tokens > 0 && block * kCudaBlockTokens <= tq.kv_end - 1 - p.window_tokens;
    if ((block + 1) * kCudaBlockTokens - 1 > first_position || before_window) {
      mask_causal(block, column, state.position, p.window_tokens, s);
    }
    float reference[kRows];
    update_mdo_states(s, p.scale_log2, state, reference);
    compute_sfm_v(s, reference, p.scale_log2, v_shared + index * kBlockHalves, lane, state);
    __syncthreads();  // the stage is refilled by the next iteration
  }
  cp_async_wait<0>();  // a CTA with no blocks still has its Q copy in flight
  write_rows(p, tq, tile, kv_head, range.slot, warp_row, lane, state);
}

template <int kHeadDim>
constexpr size_t prefill_shared_bytes() {
  return size_t(kPrefillTileRows + 4 * kCudaBlockTokens) * kHeadDim * sizeof(__half);  // Q, 2 stages of K and V
}

using PrefillKernel = void (*)(AttentionLaunch, QuantizedKvView);

template <int kHeadDim>
PrefillKernel pick(SealedPrefix prefix, int bits) {
  switch (prefix) {
    case SealedPrefix::kNone: return prefill_attention_partials<kHeadDim, SealedPrefix::kNone, 0>;
    case SealedPrefix::kSkip: return prefill_attention_partials<kHeadDim, SealedPrefix::kSkip, 0>;
    default:
      return bits == 2   ? prefill_attention_partials<kHeadDim, SealedPrefix::kDequantize, 2>
             : bits == 4 ? prefill_attention_partials<kHeadDim, SealedPrefix::kDequantize, 4>
                         : prefill_attention_partials<kHeadDim, SealedPrefix::kDequantize, 8>;
  }
}
PrefillKernel pick(int head_dim, SealedPrefix prefix, int bits) {
  return head_dim == 64 ? pick<64>(prefix, bits) : pick<128>(prefix, bits);
}
// Q and two stages of K and V; with kDequantize, a packed sealed block too (sealed_block_bytes).
size_t shared_bytes(int head_dim, SealedPrefix prefix, int sealed_block_bytes) {
  const size_t fp16 = head_dim == 64 ? prefill_shared_bytes<64>() : prefill_shared_bytes<128>();
  return prefix == SealedPrefix::kDequantize ? fp16 + size_t(sealed_block_bytes) : fp16;
}

}  // namespace

int prefill_attention_setup(int head_dim) {
  // The dequantizing kernels may take any sealed block (its bytes depend on the layout and groups): their
  // limit is the device's, their launches take what the block needs.
  int device = 0, most = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    return 0;
  }
  for (const SealedPrefix prefix : {SealedPrefix::kNone, SealedPrefix::kSkip, SealedPrefix::kDequantize}) {
    for (const int bits : {2, 4, 8}) {
      const int bytes = prefix == SealedPrefix::kDequantize ? most : int(shared_bytes(head_dim, prefix, 0));
      if (cudaFuncSetAttribute(pick(head_dim, prefix, bits), cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess) {
        return 0;
      }
    }
  }
  // The dense kernel's residency sizes the waves (the 2- and 4-bit dequantizing ones have the same).
  int ctas = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, pick(head_dim, SealedPrefix::kNone, 0), kPrefillThreads,
                                                    shared_bytes(head_dim, SealedPrefix::kNone, 0)) != cudaSuccess) {
    return 0;
  }
  return ctas;
}

void launch_prefill_attention(const AttentionLaunch& p, SealedPrefix prefix, const QuantizedKvView& sealed) {
  const dim3 grid(unsigned(p.num_splits), unsigned(p.num_kv_heads), unsigned(p.num_tiles));
  pick(p.head_dim, prefix, sealed.k_bits)<<<grid, kPrefillThreads, shared_bytes(p.head_dim, prefix, sealed.offsets.block_bytes)>>>(
      p, sealed);
}

}  // namespace slimkv::cuda
