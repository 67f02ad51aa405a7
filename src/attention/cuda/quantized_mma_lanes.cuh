// The quantized decode kernel's 2-bit HACK blocks read on INT8 tensor cores (MmaLanes). Included by
// quantized_attention.cu.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "attention/cuda/quantized_decode.cuh"

namespace slimkv::cuda::quantized_decode {

// 2-bit HACK blocks (HACK's layout, every KV head at head_dim 128) on INT8 tensor cores. The dp4a path
// spends most of a block unpacking codes and issuing one dp4a per 4 codes and query row; here the
// integer products are mma m16n8k32 (u8): the scores K'·Q'ᵀ (the block's 64 tokens in four m-tiles of 16,
// the 128 dims in four k-steps of 32) and P·V as V'ᵀ·P'ᵀ (the 128 columns in eight m-tiles, the 64
// tokens in two k-steps). The 8 columns of an mma hold 4 query rows twice: for the scores, a row's dot
// over K partition 0 and over partition 1 (B is Q' on that partition's dims and 0 on the other's); for
// P·V, a row's dot over each of two halves of the tokens. So no column is padding and a lane's results
// are one row's. Integer products are exact, and every float operation per (token, row) and (column, row)
// is the dp4a path's, in its order: the two paths give the same bits (tests hold them to it).
// Lane (g = lane / 4, c = lane % 4) holds, for each group rg of 4 rows (rows c + 4·rg), the scores of
// tokens 8g..8g+7 and the accumulators of columns 16g..16g+15.
// The operands: an m16n8k32 lane gives its A rows' k values 4c..4c+3 (a0, a1) and 16 + 4c.. (a2, a3),
// B's the same k. Which dim (token) each k is does not matter as long as A and B agree. A lane takes the
// packed bytes of one token (column) in four dim (token) groups, 16p + c + 4k for k = 0..3 (within K
// partition p; for tokens p = 0); bit pair i of those bytes holds dims 64p + 4c + 16k + i, and k-step
// (p, h) gives pairs 2h (k 4c..) and 2h + 1 (k 16 + 4c..). Q' and P' are laid out so that their word
// (p, c, i) holds the same dims' codes (mma_operand_byte).
// Staging: four lanes c read the same columns of four code rows at once (K: rows of 64 bytes, V: of 128),
// which would fall in one bank; the 16-byte chunks are placed XOR-swizzled (K by bit 1 of the row, V by
// the row mod 4) so that those reads take every bank once (mma_staged_offset).
__device__ __forceinline__ int mma_operand_byte(int x) { return x / 64 * 64 + x % 16 / 4 * 16 + x % 4 * 4 + x % 64 / 16; }

constexpr int kMmaHeadDim = 128;
constexpr int kMmaKCodeBytes = kMmaHeadDim / 4 * T;  // K codes: row G (dim group G) of T bytes, from 0
constexpr int kMmaVCodeBytes = T / 4 * kMmaHeadDim;  // V codes: row u (token group u) of head_dim bytes

// Where byte `offset` of a 2-bit block (head_dim 128) is staged; v_codes is a multiple of 128.
__device__ __forceinline__ int mma_staged_offset(int offset, int v_codes) {
  if (offset < kMmaKCodeBytes) return offset ^ ((offset >> 2) & 0x20);  // chunk bit 1 ^= row bit 1
  const int v = offset - v_codes;
  if (v >= 0 && v < kMmaVCodeBytes) return offset ^ ((v >> 2) & 0x60);  // chunk bits 1-2 ^= row bits 0-1
  return offset;
}

__device__ __forceinline__ float half_at(const uint4& v, int i) {
  return __half2float(__ushort_as_half(uint16_t(word_at(v, i / 2) >> (16 * (i % 2)))));
}
__device__ __forceinline__ float int16_at(const uint4& v, int i) { return float(int16_t(word_at(v, i / 2) >> (16 * (i % 2)))); }

// x over the 8 lanes that share lane % 4 (the lanes holding one row's tokens), reduced.
__device__ __forceinline__ float row_max(float x) {
#pragma unroll
  for (int offset = 4; offset < 32; offset *= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, offset));
  return x;
}
__device__ __forceinline__ float row_min(float x) {
#pragma unroll
  for (int offset = 4; offset < 32; offset *= 2) x = fminf(x, __shfl_xor_sync(kFullMask, x, offset));
  return x;
}
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int offset = 4; offset < 32; offset *= 2) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

template <int kRows_>
struct MmaLanes {
  static constexpr int kHeadDim = kMmaHeadDim, kRows = kRows_, kGroups = kRows / 4, kPartitions = kHeadDim / T;
  static constexpr bool kHack = true;
  static constexpr int kTokens = 8, kColumns = 16;  // a lane's, per row
  using Partial = WarpPartial<kGroups, kColumns>;    // the lane's rows c + 4·rg
  static_assert(kRows % 4 == 0 && kPartitions == 2, "4 or 8 rows, head_dim 128");

  int g, c;
  uint32_t q_words[kGroups][kPartitions][2][2];  // scores' B: [rg][p][h][b0, b1], 0 off partition g % 2
  float3 q_meta[kGroups][kPartitions];           // the lane's rows' (s, m, s Σq' + T m)

  __device__ static int operand_byte(int x) { return mma_operand_byte(x); }
  __device__ MmaLanes(const CtaShared<kHeadDim, kRows>& s, int lane) : g(lane / 4), c(lane % 4) {
#pragma unroll
    for (int rg = 0; rg < kGroups; ++rg) {
      const uint32_t* row = s.q_codes[g / 2 + 4 * rg];  // B column g: row g / 2 of the group, partition g % 2
#pragma unroll
      for (int p = 0; p < kPartitions; ++p) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int x = 0; x < 2; ++x) q_words[rg][p][h][x] = g % 2 == p ? row[16 * p + 4 * c + 2 * h + x] : 0u;
        }
        q_meta[rg][p] = s.q_meta[c + 4 * rg][p];
      }
    }
  }
  __device__ void stage(uint8_t* shared, const uint8_t* global, int bytes, const QuantizedLaunch& L, int lane) const {
    const int v_codes = L.sealed.offsets.v_codes;
    copy_block_async(shared, global, bytes, lane, [v_codes](int i) { return mma_staged_offset(i, v_codes); });
  }

  __device__ void sealed(const QuantizedLaunch& L, const SealedHead&, const uint8_t* b, CtaShared<kHeadDim, kRows>& s, uint8_t*,
                         int warp, int, Partial& partial) const {
    const QuantizedBlockOffsets& o = L.sealed.offsets;
    // Scores: dot[j][rg] = (token 8g + 2j: partition 0, 1; token 8g + 2j + 1: partition 0, 1) of row c + 4·rg.
    int dot[4][kGroups][4] = {};
    const int k_column = (8 * g) ^ ((c & 2) << 4);  // tokens 8g.. of rows 16p + c + 4k, staged
#pragma unroll
    for (int p = 0; p < kPartitions; ++p) {
      uint2 w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) w[k] = *reinterpret_cast<const uint2*>(b + (16 * p + c + 4 * k) * T + k_column);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t x[2];  // tokens 8g + 2j, 8g + 2j + 1: A rows g, g + 8
        if (j < 2) {
          interleave_bytes(w[0].x, w[1].x, w[2].x, w[3].x, j, x);
        } else {
          interleave_bytes(w[0].y, w[1].y, w[2].y, w[3].y, j - 2, x);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t a[4] = {code_plane(x[0], 2 * h), code_plane(x[1], 2 * h), code_plane(x[0], 2 * h + 1),
                                 code_plane(x[1], 2 * h + 1)};
#pragma unroll
          for (int rg = 0; rg < kGroups; ++rg) mma_16832_u8(dot[j][rg], a, q_words[rg][p][h][0], q_words[rg][p][h][1]);
        }
      }
    }
    float score[kGroups][kTokens];
    {
      uint4 k_mins[kPartitions], k_scales[kPartitions], k_sums[kPartitions];  // tokens 8g..8g+7
#pragma unroll
      for (int p = 0; p < kPartitions; ++p) {
        const int at = (p * T + kTokens * g) * 2;
        k_mins[p] = *reinterpret_cast<const uint4*>(b + o.k_mins + at);
        k_scales[p] = *reinterpret_cast<const uint4*>(b + o.k_scales + at);
        k_sums[p] = *reinterpret_cast<const uint4*>(b + o.k_sums + at);
      }
#pragma unroll
      for (int rg = 0; rg < kGroups; ++rg) {
#pragma unroll
        for (int t = 0; t < kTokens; ++t) {
          float sum = 0.0f;
#pragma unroll
          for (int p = 0; p < kPartitions; ++p) {
            sum += hack_score(q_meta[rg][p], uint32_t(dot[t / 2][rg][2 * (t % 2) + p]), half_at(k_scales[p], t),
                              half_at(k_mins[p], t), int16_at(k_sums[p], t));
          }
          score[rg][t] = sum;
        }
      }
    }
    // The weights (block_weights' hack branch, per row): P' into s.p_codes in the operand order.
    float p_scale[kGroups], p_min[kGroups], p_sum[kGroups];
#pragma unroll
    for (int rg = 0; rg < kGroups; ++rg) {
      float s2[kTokens], local_max = -INFINITY, local_min = INFINITY;
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        s2[t] = score[rg][t] * kLog2e;
        local_max = fmaxf(local_max, s2[t]);
        local_min = fminf(local_min, s2[t]);
      }
      const float block_max = row_max(local_max);
      const float reference = partial.rescale(rg, block_max);
      const BlockWeightCodes weights(row_min(local_min), block_max, reference);
      p_min[rg] = weights.lo;
      p_scale[rg] = weights.scale;
      uint8_t* codes = reinterpret_cast<uint8_t*>(s.p_codes[warp][c + 4 * rg]);
      float sum = 0.0f;
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        const int code = weights.code(s2[t], reference);
        codes[mma_operand_byte(kTokens * g + t)] = uint8_t(code);
        sum += float(code);
      }
      p_sum[rg] = row_sum(sum);  // exact: at most 255 · T
    }
    __syncwarp();

    // P·V: pv[m][rg] = (column 16g + 2m: half 0, 1; column 16g + 2m + 1: half 0, 1) of row c + 4·rg.
    uint4 v[4];  // columns 16g..16g+15 of token groups c + 4k, staged
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = *reinterpret_cast<const uint4*>(b + o.v_codes + (c + 4 * k) * kHeadDim + ((16 * g) ^ (32 * c)));
    uint32_t p_words[kGroups][2];  // B column g: row g / 2 of the group over half g % 2 (k-step g % 2)
#pragma unroll
    for (int rg = 0; rg < kGroups; ++rg) {
      const uint32_t* row = s.p_codes[warp][g / 2 + 4 * rg];
      p_words[rg][0] = row[4 * c + 2 * (g % 2)];
      p_words[rg][1] = row[4 * c + 2 * (g % 2) + 1];
    }
    int pv[8][kGroups][4] = {};
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      uint32_t x[2];  // columns 16g + 2m, + 1: A rows g, g + 8
      interleave_bytes(word_at(v[0], m / 2), word_at(v[1], m / 2), word_at(v[2], m / 2), word_at(v[3], m / 2), m % 2, x);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t a[4] = {code_plane(x[0], 2 * h), code_plane(x[1], 2 * h), code_plane(x[0], 2 * h + 1),
                               code_plane(x[1], 2 * h + 1)};
        const bool mine = g % 2 == h;
#pragma unroll
        for (int rg = 0; rg < kGroups; ++rg) mma_16832_u8(pv[m][rg], a, mine ? p_words[rg][0] : 0u, mine ? p_words[rg][1] : 0u);
      }
    }
    uint4 v_mins[2], v_scales[2], v_sums[2];  // columns 16g..16g+15
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int at = (kColumns * g + 8 * half) * 2;
      v_mins[half] = *reinterpret_cast<const uint4*>(b + o.v_mins + at);
      v_scales[half] = *reinterpret_cast<const uint4*>(b + o.v_scales + at);
      v_sums[half] = *reinterpret_cast<const uint4*>(b + o.v_sums + at);
    }
#pragma unroll
    for (int i = 0; i < kColumns; ++i) {
      const float v_min = half_at(v_mins[i / 8], i % 8), v_scale = half_at(v_scales[i / 8], i % 8);
      const float v_sum = int16_at(v_sums[i / 8], i % 8);
#pragma unroll
      for (int rg = 0; rg < kGroups; ++rg) {
        const uint32_t dot = uint32_t(pv[i / 2][rg][2 * (i % 2)] + pv[i / 2][rg][2 * (i % 2) + 1]);
        partial.acc[rg][i] += hack_value(p_scale[rg], p_min[rg], p_sum[rg], dot, v_scale, v_min, v_sum);
      }
    }
#pragma unroll
    for (int rg = 0; rg < kGroups; ++rg) partial.sum[rg] += fmaf(p_scale[rg], p_sum[rg], float(T) * p_min[rg]);
  }

  // The open block as attend_open computes it (the same operations per token and row), at this layout.
  __device__ void open(const __half* k, const __half* v, int n, CtaShared<kHeadDim, kRows>& s, int warp, int,
                       Partial& partial) const {
#pragma unroll
    for (int rg = 0; rg < kGroups; ++rg) {
      const int r = c + 4 * rg;
      float s2[kTokens], local_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kTokens; ++j) {
        const int t = kTokens * g + j;
        s2[j] = t < n ? open_score<kHeadDim>(s.q[r], k + t * kHeadDim) * kLog2e : -INFINITY;
        local_max = fmaxf(local_max, s2[j]);
      }
      const float reference = partial.rescale(rg, row_max(local_max));
#pragma unroll
      for (int j = 0; j < kTokens; ++j) s.p[warp][r][kTokens * g + j] = fast_exp2(s2[j] - reference);
    }
    __syncwarp();
    for (int t = 0; t < n; ++t) {
      float values[kColumns];
      open_values(v + t * kHeadDim + kColumns * g, values);
#pragma unroll
      for (int rg = 0; rg < kGroups; ++rg) {
        const float weight = s.p[warp][c + 4 * rg][t];
        partial.sum[rg] += weight;
#pragma unroll
        for (int i = 0; i < kColumns; ++i) partial.acc[rg][i] = fmaf(weight, values[i], partial.acc[rg][i]);
      }
    }
    __syncwarp();
  }

  __device__ void write(const Partial& partial, float (&warp_acc)[kWarps][kRows][kHeadDim], float2 (&warp_max_sum)[kWarps][kRows],
                        int warp, int) const {
#pragma unroll
    for (int rg = 0; rg < kGroups; ++rg) {
#pragma unroll
      for (int i = 0; i < kColumns; ++i) warp_acc[warp][c + 4 * rg][kColumns * g + i] = partial.acc[rg][i];
      if (g == 0) warp_max_sum[warp][c + 4 * rg] = make_float2(partial.max[rg], partial.sum[rg]);
    }
  }
};

}  // namespace slimkv::cuda::quantized_decode
