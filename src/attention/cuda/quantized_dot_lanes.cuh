// The quantized decode kernel's blocks read on CUDA cores (DotLanes): `hack` with dp4a on the codes
// (HACK's layout and KIVI's), `quant` in FP32, any bits, ZACK's heads. Included by quantized_attention.cu.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "attention/cuda/quantized_decode.cuh"

namespace slimkv::cuda::quantized_decode {

// How a lane reads codes. Each lane holds 2 tokens for the scores and kHeadDim / 32 columns for P·V.
// The 2-bit hack path is "transposed": a lane gathers 4 packed bytes of one token (4 dim groups) or of
// one V column (4 token groups); the codes at bits 2i of the 4 bytes are then 4 terms of one dot
// product, ready for dp4a after one AND (and a shift), instead of each byte being spread to 4 codes.
// Q' and P' are stored permuted to match: operand word (quad, i) holds the codes of 16·quad + 4j + i,
// j = 0..3. The other paths (4/8-bit, and `quant`) spread each packed group to one code per byte.
template <int kBits, bool kHack>
struct BlockLanes {
  static constexpr bool kTransposed = kHack && kBits == 2;
  // The byte of code x (a dim of Q', a token of P') in the 8-bit operand words.
  __device__ static int operand_byte(int x) { return kTransposed ? x / 16 * 16 + x % 4 * 4 + x % 16 / 4 : x; }
};

// K per channel: U' and its parameters for every (token group, row, K partition) of the block staged at
// `b` into the warp's scratch. A K partition's T dims are spread over 32 / kPartitions lanes, so every
// partition of a row is made at once: u'_d = lrint(q̂_d ŝ_d) (product_code's IEEE operations, so the
// codes are the reference's), stored offset by +128 as unsigned bytes (the -128 step in the meta
// undoes it with the stored Σk').
template <int kHeadDim, int kRows, int kBits, bool kHack>
__device__ __forceinline__ void quantize_u(const QuantizedLaunch& L, const SealedHead& head, const uint8_t* b,
                                           const CtaShared<kHeadDim, kRows>& s, uint8_t* scratch, int lane) {
  constexpr int kPartitions = kHeadDim / T, kLanes = 32 / kPartitions, kValues = T / kLanes;
  const __half* k_mins = reinterpret_cast<const __half*>(b + head.offsets.k_mins);
  const __half* k_scales = reinterpret_cast<const __half*>(b + head.offsets.k_scales);
  const int part = lane / kLanes, first = part * T + lane % kLanes * kValues;
  float q_max[kRows], q_factor[kRows];  // max|q| over the lane's partition, 127 / max|q|
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    q_max[r] = 0.0f;
#pragma unroll
    for (int x = 0; x < kValues; ++x) q_max[r] = fmaxf(q_max[r], fabsf(s.q[r][first + x]));
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2) q_max[r] = fmaxf(q_max[r], __shfl_xor_sync(kFullMask, q_max[r], offset));
    q_factor[r] = operand_factor(q_max[r], 127.0f);
  }
  for (int group = 0; group < T / L.sealed.k_group_tokens; ++group) {
    float k_scale[kValues], k_min[kValues], s_max = 0.0f;
#pragma unroll
    for (int x = 0; x < kValues; ++x) {
      k_scale[x] = __half2float(k_scales[group * kHeadDim + first + x]);
      k_min[x] = __half2float(k_mins[group * kHeadDim + first + x]);
      s_max = fmaxf(s_max, k_scale[x]);
    }
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2) s_max = fmaxf(s_max, __shfl_xor_sync(kFullMask, s_max, offset));
    const float s_factor = operand_factor(s_max, 1.0f);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float constant = 0.0f;
      const int row = group * kRows + r;
      uint8_t* codes = scratch + L.scratch.u_codes + row * kHeadDim;
#pragma unroll
      for (int x = 0; x < kValues; ++x) {
        const float q = s.q[r][first + x];
        constant = fmaf(q, k_min[x], constant);
        const int code = __float2int_rn(__fmul_rn(__fmul_rn(q, q_factor[r]), __fmul_rn(k_scale[x], s_factor)));
        codes[BlockLanes<kBits, kHack>::operand_byte(first + x)] = uint8_t(min(max(code, -127), 127) + 128);
      }
#pragma unroll
      for (int offset = kLanes / 2; offset > 0; offset /= 2) constant += __shfl_xor_sync(kFullMask, constant, offset);
      if (lane % kLanes == 0) {
        const float step = __fdiv_rn(__fmul_rn(q_max[r], s_max), 127.0f);
        reinterpret_cast<float4*>(scratch + L.scratch.u_meta)[row * kPartitions + part] =
            make_float4(step, -128.0f * step, constant, 0.0f);
      }
    }
  }
  __syncwarp();
}

// Scores (natural units) of the lane's tokens 2·lane, 2·lane + 1 for a sealed block staged at `b`
// (K per channel: against U' in the warp's scratch, which quantize_u filled), over the head's k_dim dims.
template <int kHeadDim, int kRows, int kBits, bool kHack, bool kLayouts>
__device__ __forceinline__ void block_scores(const QuantizedLaunch& L, const SealedHead& head, const uint8_t* b,
                                             const CtaShared<kHeadDim, kRows>& s, const uint8_t* scratch, int lane,
                                             float (&score)[2][kRows]) {
  constexpr int kPartitions = kHeadDim / T, kBytes = kBits / 2;
  const __half* k_mins = reinterpret_cast<const __half*>(b + head.offsets.k_mins);
  const __half* k_scales = reinterpret_cast<const __half*>(b + head.offsets.k_scales);
  const int16_t* k_sums = reinterpret_cast<const int16_t*>(b + head.offsets.k_sums);
  const int dim_groups = head.k_dim / 4;
  const int t0 = 2 * lane;
  // Row r's 8-bit operand: operand + r · kHeadDim / 4 (Q', or U' of the lane's token group).
  const bool per_channel = kLayouts && L.sealed.k_per_channel;
  const int k_group = per_channel ? t0 / L.sealed.k_group_tokens : 0;
  const uint32_t* operand = per_channel ? reinterpret_cast<const uint32_t*>(scratch + L.scratch.u_codes) + k_group * kRows * (kHeadDim / 4)
                                        : s.q_codes[0];
#pragma unroll
  for (int r = 0; r < kRows; ++r) score[0][r] = score[1][r] = 0.0f;
#pragma unroll
  for (int part = 0; part < kPartitions; ++part) {
    if (part * T >= head.k_dim) break;  // a ZACK head's dims end before the kernel's
    uint32_t dot[2][kRows];
    float dot_f[2][kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) dot[0][r] = dot[1][r] = 0u, dot_f[0][r] = dot_f[1][r] = 0.0f;
    if constexpr (BlockLanes<kBits, kHack>::kTransposed) {
#pragma unroll
      for (int quad = part * T / 16; quad < (part + 1) * T / 16 && 4 * quad < dim_groups; ++quad) {  // dim groups 4·quad + k
        uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) w[k] = 4 * quad + k < dim_groups ? *reinterpret_cast<const uint16_t*>(b + (4 * quad + k) * T + t0) : 0u;
        uint32_t x[2];  // per token
        interleave_bytes(w[0], w[1], w[2], w[3], 0, x);
        uint4 q[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r) q[r] = *reinterpret_cast<const uint4*>(operand + r * (kHeadDim / 4) + 4 * quad);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint32_t codes = code_plane(x[j], i);  // dims 16·quad + 4k + i
#pragma unroll
            for (int r = 0; r < kRows; ++r) dot[j][r] = __dp4a(codes, word_at(q[r], i), dot[j][r]);
          }
        }
      }
    } else {
#pragma unroll 4
      for (int g = part * T / 4; g < min((part + 1) * T / 4, dim_groups); ++g) {
        const Fields<kBits, 2> fields(b + (g * T + t0) * kBytes);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const uint32_t k = fields.codes(j);
          if constexpr (kHack) {
#pragma unroll
            for (int r = 0; r < kRows; ++r) dot[j][r] = __dp4a(k, operand[r * (kHeadDim / 4) + g], dot[j][r]);
          } else {
            const float k0 = byte_to_float(k, 0), k1 = byte_to_float(k, 1), k2 = byte_to_float(k, 2), k3 = byte_to_float(k, 3);
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
              const float4 q = *reinterpret_cast<const float4*>(&s.q[r][4 * g]);
              dot_f[j][r] = fmaf(q.x, k0, fmaf(q.y, k1, fmaf(q.z, k2, fmaf(q.w, k3, dot_f[j][r]))));
            }
          }
        }
      }
    }
    if (per_channel) {  // Σ_d u_d k'_d + Σ_d q_d m_d = step Σ(u'+128)k' - 128 step Σk' + the constant
      const float4* u_meta = reinterpret_cast<const float4*>(scratch + L.scratch.u_meta) + k_group * kRows * kPartitions;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float k_sum = float(k_sums[part * T + t0 + j]);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const float4 u = u_meta[r * kPartitions + part];
          score[j][r] += fmaf(u.x, float(dot[j][r]), fmaf(u.y, k_sum, u.z));
        }
      }
      continue;
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int slot = part * T + t0 + j;
      const float k_min = __half2float(k_mins[slot]), k_scale = __half2float(k_scales[slot]), k_sum = float(k_sums[slot]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if constexpr (kHack) {
          score[j][r] += hack_score(s.q_meta[r][part], dot[j][r], k_scale, k_min, k_sum);
        } else {  // Σ q (m + s k') = s Σ q k' + m Σ q
          score[j][r] += fmaf(k_scale, dot_f[j][r], k_min * s.q_meta[r][part].x);
        }
      }
    }
  }
}

// V per token: for each column group of the block staged at `b`, w = p∘s ≥ 0 over the block's tokens
// (the lane's two are p) into W' of row r: lrint(w · 255 / max w) (product_code's IEEE operations), with
// (step, 0, Σ_t p_t m_t).
template <int kHeadDim, int kRows, int kBits, bool kHack>
__device__ __forceinline__ void weigh_v_groups(const QuantizedLaunch& L, const SealedHead& head, const uint8_t* b,
                                               const float (&p)[2], int r, uint8_t* scratch, int lane) {
  const __half* v_mins = reinterpret_cast<const __half*>(b + head.offsets.v_mins);
  const __half* v_scales = reinterpret_cast<const __half*>(b + head.offsets.v_scales);
  const int t0 = 2 * lane;
  for (int group = 0; group < kHeadDim / L.sealed.v_group_dims; ++group) {
    const int slot = group * T + t0;
    const float w0 = __fmul_rn(p[0], __half2float(v_scales[slot])), w1 = __fmul_rn(p[1], __half2float(v_scales[slot + 1]));
    float constant = fmaf(p[0], __half2float(v_mins[slot]), p[1] * __half2float(v_mins[slot + 1]));
    const float w_max = warp_max(fmaxf(w0, w1)), factor = operand_factor(w_max, 255.0f);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) constant += __shfl_xor_sync(kFullMask, constant, offset);
    const int row = group * kRows + r;
    uint8_t* codes = scratch + L.scratch.w_codes + row * T;
    codes[BlockLanes<kBits, kHack>::operand_byte(t0)] = uint8_t(min(max(__float2int_rn(__fmul_rn(w0, factor)), 0), 255));
    codes[BlockLanes<kBits, kHack>::operand_byte(t0 + 1)] = uint8_t(min(max(__float2int_rn(__fmul_rn(w1, factor)), 0), 255));
    if (lane == 0) reinterpret_cast<float4*>(scratch + L.scratch.w_meta)[row] = make_float4(w_max / 255.0f, 0.0f, constant, 0.0f);
  }
}

// The block's softmax weights (base 2) against the running max. hack: P quantized to 8 bits over the
// block's tokens (quantize_operand8, nearest) into s.p_codes, with (scale, min, Σp') per row; V per
// token: W' per column group into the warp's scratch, with Σp per row; quant: P in FP32 into s.p,
// with Σp.
template <int kHeadDim, int kRows, int kBits, bool kHack, bool kLayouts>
__device__ __forceinline__ void block_weights(const QuantizedLaunch& L, const SealedHead& head, const uint8_t* b,
                                              const float (&score)[2][kRows],
                                              CtaShared<kHeadDim, kRows>& s, uint8_t* scratch, int warp, int lane,
                                              WarpPartial<kRows, kHeadDim / 32>& partial, float (&p_scale)[kRows],
                                              float (&p_min)[kRows], float (&p_sum)[kRows]) {
  constexpr int kTokens = 2;
  const int t0 = 2 * lane;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float s2[kTokens], local_max = -INFINITY, local_min = INFINITY;
#pragma unroll
    for (int j = 0; j < kTokens; ++j) {
      s2[j] = score[j][r] * kLog2e;
      local_max = fmaxf(local_max, s2[j]);
      local_min = fminf(local_min, s2[j]);
    }
    const float block_max = warp_max(local_max);
    const float reference = partial.rescale(r, block_max);
    float sum = 0.0f;
    if (kLayouts && L.sealed.v_per_token) {
      const float p[kTokens] = {fast_exp2(s2[0] - reference), fast_exp2(s2[1] - reference)};
      sum = p[0] + p[1];
      weigh_v_groups<kHeadDim, kRows, kBits, kHack>(L, head, b, p, r, scratch, lane);
    } else if constexpr (kHack) {
      const BlockWeightCodes weights(warp_min(local_min), block_max, reference);
      p_min[r] = weights.lo;
      p_scale[r] = weights.scale;
      uint8_t* codes = reinterpret_cast<uint8_t*>(s.p_codes[warp][r]);
#pragma unroll
      for (int j = 0; j < kTokens; ++j) {
        const int code = weights.code(s2[j], reference);
        codes[BlockLanes<kBits, kHack>::operand_byte(t0 + j)] = uint8_t(code);
        sum += float(code);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kTokens; ++j) {
        const float weight = fast_exp2(s2[j] - reference);
        s.p[warp][r][t0 + j] = weight;
        sum += weight;
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
    p_sum[r] = sum;  // exact for hack: at most 255 · T
  }
  __syncwarp();
}

// One sealed block, staged at `b`, folded into the warp's partial.
template <int kHeadDim, int kRows, int kBits, bool kHack, bool kLayouts>
__device__ __forceinline__ void attend_sealed(const QuantizedLaunch& L, const SealedHead& head, const uint8_t* b,
                                              CtaShared<kHeadDim, kRows>& s, uint8_t* scratch, int warp, int lane,
                                              WarpPartial<kRows, kHeadDim / 32>& partial) {
  constexpr int kCols = kHeadDim / 32, kBytes = kBits / 2;
  if (kLayouts && L.sealed.k_per_channel) quantize_u<kHeadDim, kRows, kBits, kHack>(L, head, b, s, scratch, lane);
  float score[2][kRows];
  block_scores<kHeadDim, kRows, kBits, kHack, kLayouts>(L, head, b, s, scratch, lane, score);
  float p_scale[kRows], p_min[kRows], p_sum[kRows];
  block_weights<kHeadDim, kRows, kBits, kHack, kLayouts>(L, head, b, score, s, scratch, warp, lane, partial, p_scale, p_min,
                                                         p_sum);

  // P·V for the lane's kCols columns, against row r's operand + r · T / 4 (P', or W' of the lanes'
  // column group; a group holds whole lanes' columns). V' rows are v_dim columns; a lane whose columns
  // lie past them (a ZACK head's) reads none and adds nothing to them.
  const int c0 = lane * kCols, v_dim = head.v_dim;
  const bool has_columns = c0 < v_dim;
  const bool per_token = kLayouts && L.sealed.v_per_token;
  const int v_group = per_token ? c0 / L.sealed.v_group_dims : 0;
  const uint32_t* operand = per_token ? reinterpret_cast<const uint32_t*>(scratch + L.scratch.w_codes) + v_group * kRows * (T / 4)
                                      : s.p_codes[warp][0];
  uint32_t pv[kRows][kCols];
  float pv_f[kRows][kCols];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int i = 0; i < kCols; ++i) pv[r][i] = 0u, pv_f[r][i] = 0.0f;
  }
  if (!has_columns) {
  } else if constexpr (BlockLanes<kBits, kHack>::kTransposed) {
#pragma unroll
    for (int quad = 0; quad < T / 16; ++quad) {  // token groups u = 4·quad + k
      uint32_t w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) w[k] = Fields<2, kCols>(b + head.offsets.v_codes + (4 * quad + k) * v_dim + c0).words[0];
      uint4 p[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) p[r] = *reinterpret_cast<const uint4*>(operand + r * (T / 4) + 4 * quad);
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const unsigned pick = unsigned(c) | unsigned(c + 4) << 4;  // byte c of two words
        const uint32_t x = __byte_perm(__byte_perm(w[0], w[1], pick), __byte_perm(w[2], w[3], pick), 0x5410);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint32_t codes = code_plane(x, i);  // tokens 16·quad + 4k + i of column c0 + c
#pragma unroll
          for (int r = 0; r < kRows; ++r) pv[r][c] = __dp4a(codes, word_at(p[r], i), pv[r][c]);
        }
      }
    }
  } else {
#pragma unroll 4
    for (int u = 0; u < T / 4; ++u) {
      const Fields<kBits, kCols> fields(b + head.offsets.v_codes + (u * v_dim + c0) * kBytes);
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        const uint32_t v = fields.codes(i);  // tokens 4u..4u+3 of column c0 + i
        if constexpr (kHack) {
#pragma unroll
          for (int r = 0; r < kRows; ++r) pv[r][i] = __dp4a(v, operand[r * (T / 4) + u], pv[r][i]);
        } else {
          const float v0 = byte_to_float(v, 0), v1 = byte_to_float(v, 1), v2 = byte_to_float(v, 2), v3 = byte_to_float(v, 3);
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            const float4 p = *reinterpret_cast<const float4*>(&s.p[warp][r][4 * u]);
            pv_f[r][i] = fmaf(p.x, v0, fmaf(p.y, v1, fmaf(p.z, v2, fmaf(p.w, v3, pv_f[r][i]))));
          }
        }
      }
    }
  }
  const __half* v_mins = reinterpret_cast<const __half*>(b + head.offsets.v_mins);
  const __half* v_scales = reinterpret_cast<const __half*>(b + head.offsets.v_scales);
  const int16_t* v_sums = reinterpret_cast<const int16_t*>(b + head.offsets.v_sums);
  if (per_token) {  // Σ_t w_t v'_tc + Σ_t p_t m_t = step Σw'v' + the constant; the sum Σp
    const float4* w_meta = reinterpret_cast<const float4*>(scratch + L.scratch.w_meta) + v_group * kRows;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float4 w = w_meta[r];
#pragma unroll
      for (int i = 0; i < kCols && has_columns; ++i) partial.acc[r][i] += fmaf(w.x, float(pv[r][i]), fmaf(w.y, float(v_sums[c0 + i]), w.z));
      partial.sum[r] += p_sum[r];
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kCols && has_columns; ++i) {
    const float v_min = __half2float(v_mins[c0 + i]), v_scale = __half2float(v_scales[c0 + i]);
    const float v_sum = float(v_sums[c0 + i]);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if constexpr (kHack) {
        partial.acc[r][i] += hack_value(p_scale[r], p_min[r], p_sum[r], pv[r][i], v_scale, v_min, v_sum);
      } else {
        partial.acc[r][i] += fmaf(v_scale, pv_f[r][i], v_min * p_sum[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if constexpr (kHack) {
      partial.sum[r] += fmaf(p_scale[r], p_sum[r], float(T) * p_min[r]);
    } else {
      partial.sum[r] += p_sum[r];
    }
  }
}

// The open block: tokens [first, kv_end) in FP16 from the dense pool, in FP32 (unquantized q and p).
template <int kHeadDim, int kRows>
__device__ __forceinline__ void attend_open(const __half* k, const __half* v, int n,
                                            CtaShared<kHeadDim, kRows>& s, int warp, int lane,
                                            WarpPartial<kRows, kHeadDim / 32>& partial) {
  constexpr int kCols = kHeadDim / 32;
  float score[2][kRows];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int t = 2 * lane + j;
#pragma unroll
    for (int r = 0; r < kRows; ++r) score[j][r] = 0.0f;
    if (t < n) {
      // Each K chunk feeds every row at once (open_score's order per row: the same sums).
      for (int c = 0; c < kHeadDim; c += 8) {
        const uint4 raw = *reinterpret_cast<const uint4*>(k + t * kHeadDim + c);
        const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const float2 kk = __half22float2(h[x]);
#pragma unroll
          for (int r = 0; r < kRows; ++r) score[j][r] = fmaf(s.q[r][c + 2 * x], kk.x, fmaf(s.q[r][c + 2 * x + 1], kk.y, score[j][r]));
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float s0 = 2 * lane < n ? score[0][r] * kLog2e : -INFINITY;
    const float s1 = 2 * lane + 1 < n ? score[1][r] * kLog2e : -INFINITY;
    const float reference = partial.rescale(r, warp_max(fmaxf(s0, s1)));
    *reinterpret_cast<float2*>(&s.p[warp][r][2 * lane]) = make_float2(fast_exp2(s0 - reference), fast_exp2(s1 - reference));
  }
  __syncwarp();
  const int c0 = lane * kCols;
  for (int t = 0; t < n; ++t) {
    float values[kCols];
    open_values(v + t * kHeadDim + c0, values);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float weight = s.p[warp][r][t];
      partial.sum[r] += weight;
#pragma unroll
      for (int i = 0; i < kCols; ++i) partial.acc[r][i] = fmaf(weight, values[i], partial.acc[r][i]);
    }
  }
  __syncwarp();
}

// The kernel's reading of blocks (quantized_attention_partials<Lanes>): its staging copy, a sealed block,
// the open block, and the warp's partial written for the CTA's merge — here on CUDA cores, every codec
// and layout.
template <int kHeadDim_, int kRows_, int kBits, bool kHack_, bool kLayouts>
struct DotLanes {
  static constexpr int kHeadDim = kHeadDim_, kRows = kRows_, kCols = kHeadDim / 32;
  static constexpr bool kHack = kHack_;
  using Partial = WarpPartial<kRows, kCols>;  // lane l: columns l·kCols.. of every row

  __device__ static int operand_byte(int x) { return BlockLanes<kBits, kHack>::operand_byte(x); }
  __device__ DotLanes(const CtaShared<kHeadDim, kRows>&, int) {}
  __device__ void stage(uint8_t* shared, const uint8_t* global, int bytes, const QuantizedLaunch&, int lane) const {
    copy_block_async(shared, global, bytes, lane, [](int i) { return i; });
  }
  __device__ void sealed(const QuantizedLaunch& L, const SealedHead& head, const uint8_t* b, CtaShared<kHeadDim, kRows>& s,
                         uint8_t* scratch, int warp, int lane, Partial& partial) const {
    attend_sealed<kHeadDim, kRows, kBits, kHack, kLayouts>(L, head, b, s, scratch, warp, lane, partial);
  }
  __device__ void open(const __half* k, const __half* v, int n, CtaShared<kHeadDim, kRows>& s, int warp, int lane,
                       Partial& partial) const {
    attend_open<kHeadDim, kRows>(k, v, n, s, warp, lane, partial);
  }
  __device__ void write(const Partial& partial, float (&warp_acc)[kWarps][kRows][kHeadDim], float2 (&warp_max_sum)[kWarps][kRows],
                        int warp, int lane) const {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int i = 0; i < kCols; ++i) warp_acc[warp][r][lane * kCols + i] = partial.acc[r][i];
      if (lane == 0) warp_max_sum[warp][r] = make_float2(partial.max[r], partial.sum[r]);
    }
  }
};

}  // namespace slimkv::cuda::quantized_decode
