// What the quantized decode kernel's two ways of reading a block (quantized_dot_lanes.cuh,
// quantized_mma_lanes.cuh) share: the launch, the warps' staging copy, the running partial, the CTA's
// shared queries and weights, and Eq. 4's corrections. Included by quantized_attention.cu only.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "attention/cuda/device_ops.cuh"
#include "attention/cuda/kv_views.h"
#include "attention/cuda/softmax_state.cuh"
#include "attention/cuda/split_k.cuh"

namespace slimkv::cuda::quantized_decode {

constexpr int T = kCudaBlockTokens;  // tokens per block: one V partition (HACK's Π)

// Per warp, after the staging buffers, for KIVI's layouts: the 8-bit operands of the block the warp
// reads and their parameters (byte offsets in the warp's scratch).
struct LayoutScratch {
  int u_codes = 0;  // U': uint32 [k groups][kRows][head_dim / 4], 4 codes per word as Q'
  int u_meta = 0;   // float4 [k groups][kRows][K partitions]: (step, -128 step, Σ q_d m_d over the partition, 0)
  int w_codes = 0;  // W': uint32 [v groups][kRows][T / 4], 4 tokens per word as P'
  int w_meta = 0;   // float4 [v groups][kRows]: (step, 0, Σ_t p_t m_t, 0)
  int bytes = 0;    // per warp
  int offset = 0;   // of warp 0's scratch in the dynamic shared memory
};

struct QuantizedLaunch {
  AttentionLaunch a;
  QuantizedKvView sealed;  // the sealed blocks (their tables: a.block_tables)
  LayoutScratch scratch;
};

// Byte i of w as a float: 2^23 + byte, less 2^23 (one PRMT and one FADD).
__device__ __forceinline__ float byte_to_float(uint32_t w, int i) {
  return __uint_as_float(__byte_perm(w, 0x4b00u, 0x5440u | unsigned(i))) - 8388608.0f;
}

// The packed fields of kFields consecutive groups of kBits codes (kFields · kBits / 2 bytes, aligned).
template <int kBits, int kFields>
struct Fields {
  static constexpr int kBytes = kFields * kBits / 2;
  static constexpr int kWords = kBytes >= 4 ? kBytes / 4 : 1;
  uint32_t words[kWords];
  __device__ __forceinline__ explicit Fields(const uint8_t* p) {
    if constexpr (kBytes == 2) {
      words[0] = *reinterpret_cast<const uint16_t*>(p);
    } else if constexpr (kBytes == 4) {
      words[0] = *reinterpret_cast<const uint32_t*>(p);
    } else if constexpr (kBytes == 8) {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      words[0] = v.x, words[1] = v.y;
    } else {
      static_assert(kBytes == 16, "1 to 4 fields");
      const uint4 v = *reinterpret_cast<const uint4*>(p);
      words[0] = v.x, words[1] = v.y, words[2] = v.z, words[3] = v.w;
    }
  }
  // Field i's codes, one per byte.
  __device__ __forceinline__ uint32_t codes(int i) const {
    constexpr int kFieldBits = 4 * kBits;
    const uint32_t word = words[i * kFieldBits / 32];
    const uint32_t field = kFieldBits == 32 ? word : (word >> (i * kFieldBits % 32)) & ((1u << kFieldBits) - 1u);
    return spread_codes<kBits>(field);
  }
};

// A block's `bytes` global → shared by the warp in 16-byte chunks, the chunk at offset i placed at
// place(i) (the identity, or the tensor-core path's swizzle).
template <class Place>
__device__ __forceinline__ void copy_block_async(uint8_t* shared, const uint8_t* global, int bytes, int lane, Place place) {
  for (int i = lane * 16; i < bytes; i += 32 * 16) {
    const unsigned destination = unsigned(__cvta_generic_to_shared(shared + place(i)));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(destination), "l"(global + i));
  }
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// 2^x, approximate (2 ulp), subnormals flushed: softmax weights need no more.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The warp's running partial (attention/partial.h), base-2 max; lane l holds columns l·kCols.. of acc.
template <int kRows, int kCols>
struct WarpPartial {
  float max[kRows], sum[kRows], acc[kRows][kCols];

  __device__ WarpPartial() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      max[r] = -INFINITY;
      sum[r] = 0.0f;
#pragma unroll
      for (int i = 0; i < kCols; ++i) acc[r][i] = 0.0f;
    }
  }
  // Moves row r to the running max including block_max; returns the reference the block's weights
  // are taken against (0 while everything is masked, so exp2 gives 0, not NaN).
  __device__ __forceinline__ float rescale(int r, float block_max) {
    const float new_max = fmaxf(max[r], block_max);
    const float reference = softmax_reference(new_max);
    const float factor = fast_exp2(max[r] - reference);
    max[r] = new_max;
    sum[r] *= factor;
#pragma unroll
    for (int i = 0; i < kCols; ++i) acc[r][i] *= factor;
    return reference;
  }
};

template <int kHeadDim, int kRows>
struct alignas(16) CtaShared {
  static constexpr int kPartitions = kHeadDim / T;  // K partitions of Π = T dims
  alignas(16) float q[kRows][kHeadDim];                         // the scaled queries
  alignas(16) uint32_t q_codes[kRows][kHeadDim / 4];            // hack: Q', 4 codes per word
  float3 q_meta[kRows][kPartitions];                // hack: (s, m, s Σq' + T m); quant: (Σq, 0, 0)
  alignas(16) float p[kWarps][kRows][T];                        // quant and open blocks: the block's weights
  alignas(16) uint32_t p_codes[kWarps][kRows][T / 4];           // hack: P', 4 tokens per word
  float2 warp_max_sum[kWarps][kRows];
};

__device__ __forceinline__ uint32_t word_at(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// Eq. 4 for one token and K partition: s_q s_k Σq'k' + m_q s_k Σk' + m_k (s_q Σq' + Z m_q), with the
// stored Σk' (q = (s_q, m_q, s_q Σq' + Z m_q), Z = T dims).
__device__ __forceinline__ float hack_score(float3 q, uint32_t dot, float k_scale, float k_min, float k_sum) {
  return fmaf(k_scale, fmaf(q.x, float(dot), q.y * k_sum), k_min * q.z);
}

// Eq. 4 for one V column over a block's tokens (Z = T): s_v (s_p Σp'v' + m_p Σv') + m_v (s_p Σp' + T m_p),
// with the stored Σv'; each fused step written out, so that both decode paths round alike.
__device__ __forceinline__ float hack_value(float p_scale, float p_min, float p_sum, uint32_t dot, float v_scale, float v_min,
                                            float v_sum) {
  return fmaf(v_scale, fmaf(p_scale, float(dot), p_min * v_sum), v_min * fmaf(p_scale, p_sum, float(T) * p_min));
}

// Of four words w0..w3, x[0] = their bytes 2j (w0's in the lowest byte) and x[1] their bytes 2j + 1, for
// j = 0 or 1: a token's (or column's) packed bytes of four dim (token) groups from 16-bit pairs.
__device__ __forceinline__ void interleave_bytes(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, int j, uint32_t (&x)[2]) {
  const unsigned pick = j == 0 ? 0x5140u : 0x7362u;
  const uint32_t low01 = __byte_perm(w0, w1, pick), low23 = __byte_perm(w2, w3, pick);
  x[0] = __byte_perm(low01, low23, 0x5410);
  x[1] = __byte_perm(low01, low23, 0x7632);
}

// The open block (FP16 rows in the dense pool): a query row q (scaled, FP32) times key row k_row, summed
// in this order (attend_open sums in the same order, each K chunk feeding all its rows at once); and
// kCount values of a V row from its first, in FP32.
template <int kHeadDim>
__device__ __forceinline__ float open_score(const float* q, const __half* k_row) {
  float score = 0.0f;
  for (int c = 0; c < kHeadDim; c += 8) {
    const uint4 raw = *reinterpret_cast<const uint4*>(k_row + c);
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const float2 kk = __half22float2(h[x]);
      score = fmaf(q[c + 2 * x], kk.x, fmaf(q[c + 2 * x + 1], kk.y, score));
    }
  }
  return score;
}
template <int kCount>
__device__ __forceinline__ void open_values(const __half* v_row, float (&values)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; i += 2) {
    const float2 pair = __half22float2(*reinterpret_cast<const __half2*>(v_row + i));
    values[i] = pair.x, values[i + 1] = pair.y;
  }
}

// HACK's P' of one row over a block (quantize_operand8's rule, nearest): the weights against the running
// max's reference span [lo, hi] — exp2 is monotonic, so the block's extreme scores (base 2) give them —
// quantized to 8 bits as lo + scale · code.
struct BlockWeightCodes {
  float lo, scale, inverse;
  __device__ __forceinline__ BlockWeightCodes(float block_min, float block_max, float reference) {
    const float hi = fast_exp2(block_max - reference);
    lo = fast_exp2(block_min - reference);
    scale = (hi - lo) * (1.0f / 255.0f);
    // Fast division: P' needs no bit-exact twin (the reference quantizes against another running max).
    inverse = hi > lo ? __fdividef(255.0f, hi - lo) : 0.0f;
  }
  // The code of the weight of a token of base-2 score s2.
  __device__ __forceinline__ int code(float s2, float reference) const {
    return min(max(__float2int_rn((fast_exp2(s2 - reference) - lo) * inverse), 0), 255);
  }
};

// The 2-bit codes at bit pair i of each byte of x, one per byte.
__device__ __forceinline__ uint32_t code_plane(uint32_t x, int i) { return (x >> (2 * i)) & 0x03030303u; }

// operand_factor (attention/hack_operands.h) in the same IEEE operations: levels / max, 0 for a
// factor too small to matter.
__device__ __forceinline__ float operand_factor(float max, float levels) { return max > 1e-30f ? __fdiv_rn(levels, max) : 0.0f; }

}  // namespace slimkv::cuda::quantized_decode
