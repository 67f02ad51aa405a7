// Decode attention over sealed `hack` / `quant` blocks (kv/cuda/quantized_kv_pool.h) plus each
// sequence's open FP16 block: CudaPagedAttention::run_quantized. The work split, the tiles (a GQA group
// reads each KV block once) and the merge of the splits are the dense kernel's (split_k.cuh); what
// differs is how a warp reads one block:
//   hack (HACK §5.2–5.3): Q quantized to 8 bits per K partition once per CTA; Σ q'k' with dp4a on
//     codes unpacked in registers from the block staged in shared memory; Eq. 4's corrections with the
//     stored Σk'; softmax in FP32; P quantized to 8 bits over the block (one V partition); Σ p'v' with
//     dp4a, corrected with the stored Σv'. Held to attend_hack_block_reference (FP64).
//   quant (the KIVI-style fused baseline): the same staging and unpacking, each code converted to FP32
//     in registers and multiplied with FP32 q and p (FFMA on CUDA cores); the scale and min applied once
//     per partition (s·Σ q k' + m·Σ q), so no dequantized value is ever stored.
//   hack over KIVI's layouts (K per channel, V per token; issue 28, attend_hack_block_reference): the
//     scales vary along the dot products, so they are folded into the operands per block and warp:
//     u = q∘s per K token group and K partition, U' = lrint(q̂ ŝ) in the range its factors bound
//     (q̂ = q · 127 / max|q|, ŝ = s / max s: attention/hack_operands.h), Σ_d q_d m_d exact; w = p∘s per
//     V column group over the block's tokens, W' = lrint(w · 255 / max w), Σ_t p_t m_t and Σ_t p_t
//     exact. The integer products are the same dp4a on U', W' instead of Q', P'.
// The open block is read in FP16 and computed in FP32, as the dense kernel does.
// ZACK's heads (zack:...+hack / +quant: QuantizedKvView::heads): each KV head's blocks at its own K and V
// dims (multiples of 4, at most kHeadDim), the same kernels: Q' per K partition over the head's dims (the
// last partition shorter), dim groups and V columns past them not read (a lane's columns are all in or
// all out), their outputs 0.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "attention/cuda/softmax_state.cuh"
#include "attention/cuda/device_ops.cuh"
#include "attention/cuda/paged_attention.h"
#include "attention/cuda/split_k.cuh"
#include "backend/cuda/cuda_check.h"

namespace slimkv::cuda {
namespace {

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

// The 2-bit codes at bit pair i of each byte of x, one per byte.
__device__ __forceinline__ uint32_t code_plane(uint32_t x, int i) { return (x >> (2 * i)) & 0x03030303u; }

// operand_factor (attention/hack_operands.h) in the same IEEE operations: levels / max, 0 for a
// factor too small to matter.
__device__ __forceinline__ float operand_factor(float max, float levels) { return max > 1e-30f ? __fdiv_rn(levels, max) : 0.0f; }

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
      // exp2 is monotonic: the block's least and greatest weights are those of its extreme scores.
      const float lo = fast_exp2(warp_min(local_min) - reference), hi = fast_exp2(block_max - reference);
      p_min[r] = lo;
      p_scale[r] = (hi - lo) * (1.0f / 255.0f);
      // Fast division: P' needs no bit-exact twin (the reference quantizes against another running max).
      const float inverse = hi > lo ? __fdividef(255.0f, hi - lo) : 0.0f;
      uint8_t* codes = reinterpret_cast<uint8_t*>(s.p_codes[warp][r]);
#pragma unroll
      for (int j = 0; j < kTokens; ++j) {
        const int code = min(max(__float2int_rn((fast_exp2(s2[j] - reference) - lo) * inverse), 0), 255);
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
#pragma unroll
    for (int i = 0; i < kCols; i += 2) {
      const float2 pair = __half22float2(*reinterpret_cast<const __half2*>(v + t * kHeadDim + c0 + i));
      values[i] = pair.x, values[i + 1] = pair.y;
    }
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

// How a warp reads blocks, for the kernel below (the "lanes" of a decode kernel): its staging copy, a
// sealed block, the open block, and its partial written for the CTA's merge. Two: DotLanes (dp4a or
// FP32 on CUDA cores, every codec and layout) and MmaLanes (2-bit HACK blocks on INT8 tensor cores).
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
      const float lo = fast_exp2(row_min(local_min) - reference), hi = fast_exp2(block_max - reference);
      p_min[rg] = lo;
      p_scale[rg] = (hi - lo) * (1.0f / 255.0f);
      const float inverse = hi > lo ? __fdividef(255.0f, hi - lo) : 0.0f;
      uint8_t* codes = reinterpret_cast<uint8_t*>(s.p_codes[warp][c + 4 * rg]);
      float sum = 0.0f;
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        const int code = min(max(__float2int_rn((fast_exp2(s2[t] - reference) - lo) * inverse), 0), 255);
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
        float score = 0.0f;
        if (t < n) {
          for (int x = 0; x < kHeadDim; x += 8) {
            const uint4 raw = *reinterpret_cast<const uint4*>(k + t * kHeadDim + x);
            const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
            for (int y = 0; y < 4; ++y) {
              const float2 kk = __half22float2(h[y]);
              score = fmaf(s.q[r][x + 2 * y], kk.x, fmaf(s.q[r][x + 2 * y + 1], kk.y, score));
            }
          }
        }
        s2[j] = t < n ? score * kLog2e : -INFINITY;
        local_max = fmaxf(local_max, s2[j]);
      }
      const float reference = partial.rescale(rg, row_max(local_max));
#pragma unroll
      for (int j = 0; j < kTokens; ++j) s.p[warp][r][kTokens * g + j] = fast_exp2(s2[j] - reference);
    }
    __syncwarp();
    for (int t = 0; t < n; ++t) {
      float values[kColumns];
#pragma unroll
      for (int i = 0; i < kColumns; i += 2) {
        const float2 pair = __half22float2(*reinterpret_cast<const __half2*>(v + t * kHeadDim + kColumns * g + i));
        values[i] = pair.x, values[i + 1] = pair.y;
      }
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

// The attention partial of one decode tile (a sequence's GQA group) over one split of its blocks, each
// block read by Lanes.
template <class Lanes>
__global__ __launch_bounds__(kThreads) void quantized_attention_partials(QuantizedLaunch L) {
  constexpr int kHeadDim = Lanes::kHeadDim, kRows = Lanes::kRows, kPartitions = kHeadDim / T;
  constexpr bool kHack = Lanes::kHack;
  static_assert(kHeadDim % 64 == 0, "head dims of 64 or 128");
  // [kWarps][2][block_bytes]: each warp's blocks, double-buffered (measured on H100 at 64K: 0.174 ms
  // against 0.181 single-buffered); after the loop, the warps' partials.
  extern __shared__ uint4 staging[];
  __shared__ CtaShared<kHeadDim, kRows> s;
  const AttentionLaunch& p = L.a;
  const int split = blockIdx.x, kv_head = blockIdx.y, tile = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const TileQueries tq(p, tile);
  const SealedHead head = sealed_head(L.sealed, kv_head, kHeadDim);

  // The tile's queries, times the softmax scale (rows past the group, and dims past the head's k_dim,
  // stay 0 and are never written).
  for (int i = threadIdx.x; i < kRows * kHeadDim; i += kThreads) {
    const int r = i / kHeadDim, c = i % kHeadDim;
    float x = 0.0f;
    if (r < tq.active_rows && c < head.k_dim) {
      const int query_head = kv_head * p.group + r % p.group, query = tq.first_query + r / p.group;
      x = __fmul_rn(__half2float(p.q[(size_t(tq.query_begin + query) * p.num_heads + query_head) * kHeadDim + c]), p.scale);
    }
    s.q[r][c] = x;
  }
  __syncthreads();
  // Per (row, K partition), one warp each, 2 values per lane: hack quantizes to Q' (quantize_operand8
  // in attention/hack_operands.h, the same IEEE operations; a zero's sign in the min cannot change
  // a code or a sum), quant sums the row. A partition holds the head's dims from part · T on, at most T
  // (fewer in a ZACK head's last one; codes past them are 0); partitions past the head's are not read.
  for (int item = warp; item < kRows * kPartitions; item += kWarps) {
    const int r = item / kPartitions, part = item % kPartitions, dims = min(T, head.k_dim - part * T);
    if (dims <= 0) continue;
    const float x0 = s.q[r][part * T + 2 * lane], x1 = s.q[r][part * T + 2 * lane + 1];
    const bool in0 = 2 * lane < dims, in1 = 2 * lane + 1 < dims;
    if constexpr (kHack) {
      const float lo = warp_min(fminf(in0 ? x0 : INFINITY, in1 ? x1 : INFINITY));
      const float hi = warp_max(fmaxf(in0 ? x0 : -INFINITY, in1 ? x1 : -INFINITY));
      const float scale = __fdiv_rn(__fsub_rn(hi, lo), 255.0f);
      const float inverse = scale > 0.0f ? __fdiv_rn(1.0f, scale) : 0.0f;
      uint8_t* codes = reinterpret_cast<uint8_t*>(s.q_codes[r]);
      int sum = 0;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float x = j == 0 ? x0 : x1;
        const int code = (j == 0 ? in0 : in1) ? min(max(__float2int_rn(__fmul_rn(__fsub_rn(x, lo), inverse)), 0), 255) : 0;
        sum += code;
        codes[Lanes::operand_byte(part * T + 2 * lane + j)] = uint8_t(code);
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
      if (lane == 0) s.q_meta[r][part] = make_float3(scale, lo, fmaf(scale, float(sum), float(dims) * lo));
    } else {
      float sum = x0 + x1;
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
      if (lane == 0) s.q_meta[r][part] = make_float3(sum, 0.0f, 0.0f);
    }
  }
  __syncthreads();
  const Lanes lanes(s, lane);

  // The warp's blocks: block_begin + warp + kWarps·j; those before n_sealed are sealed, the last one
  // may be the open block.
  const int num_blocks = (tq.kv_end + T - 1) / T, n_sealed = tq.kv_end / T;
  const TileSplit range = tile_split(p, tq, split, 0, num_blocks);
  const int block_begin = range.begin, block_end = range.end;
  const int sealed_end = min(block_end, n_sealed);
  const int* table = p.block_tables + size_t(p.sequence_ids[tq.batch_index]) * p.block_table_stride;
  const auto sealed_block = [&](int block) {
    return sealed_block_address(L.sealed, p, p.sequence_ids[tq.batch_index], block, kv_head);
  };
  uint8_t* stage = reinterpret_cast<uint8_t*>(staging) + size_t(warp) * 2 * L.sealed.offsets.block_bytes;
  uint8_t* scratch = reinterpret_cast<uint8_t*>(staging) + L.scratch.offset + warp * L.scratch.bytes;
  typename Lanes::Partial partial;
  int buffer = 0;
  const int head_bytes = head.offsets.block_bytes;  // staged in buffers of the view's block_bytes (the largest head's)
  if (block_begin + warp < sealed_end) lanes.stage(stage, sealed_block(block_begin + warp), head_bytes, L, lane);
  for (int block = block_begin + warp; block < block_end; block += kWarps) {
    if (block < n_sealed) {
      if (block + kWarps < sealed_end) {  // the next block's copy is in flight while this one is read
        lanes.stage(stage + (buffer ^ 1) * L.sealed.offsets.block_bytes, sealed_block(block + kWarps), head_bytes, L, lane);
        wait_copies<1>();
      } else {
        wait_copies<0>();
      }
      __syncwarp();
      lanes.sealed(L, head, stage + buffer * L.sealed.offsets.block_bytes, s, scratch, warp, lane, partial);
      __syncwarp();  // every lane is done with the buffer before it is refilled
      buffer ^= 1;
    } else {
      const size_t offset = (size_t(table[block]) * p.num_kv_heads + kv_head) * T * kHeadDim;
      lanes.open(p.k_pool + offset, p.v_pool + offset, tq.kv_end - block * T, s, warp, lane, partial);
    }
  }

  __syncthreads();  // every warp is done with the staging buffers
  auto& warp_acc = *reinterpret_cast<float(*)[kWarps][kRows][kHeadDim]>(staging);
  lanes.write(partial, warp_acc, s.warp_max_sum, warp, lane);
  __syncthreads();
  store_cta_partial<kHeadDim, kRows>(p, tq.active_rows, warp_acc, s.warp_max_sum);
}

using QuantizedKernel = void (*)(QuantizedLaunch);

// hack: HACK's layout, or KIVI's (`layouts`); quant: HACK's layout only.
template <int kHeadDim, int kRows, int kBits>
QuantizedKernel pick_kind(bool hack, bool layouts) {
  if (!hack) return layouts ? nullptr : quantized_attention_partials<DotLanes<kHeadDim, kRows, kBits, false, false>>;
  return layouts ? quantized_attention_partials<DotLanes<kHeadDim, kRows, kBits, true, true>>
                 : quantized_attention_partials<DotLanes<kHeadDim, kRows, kBits, true, false>>;
}

template <int kHeadDim, int kRows>
QuantizedKernel pick(int bits, bool hack, bool layouts) {
  switch (bits) {
    case 2: return pick_kind<kHeadDim, kRows, 2>(hack, layouts);
    case 4: return pick_kind<kHeadDim, kRows, 4>(hack, layouts);
    case 8: return pick_kind<kHeadDim, kRows, 8>(hack, layouts);
    default: return nullptr;
  }
}

// The one switch from the run-time shape to the decode kernel's template parameters; null when no
// kernel has it (run_quantized's error names the values). `tensor_cores`: 2-bit HACK blocks of head_dim
// 128 at every head (no ZACK heads) take MmaLanes.
QuantizedKernel pick_kernel(int head_dim, int rows, int bits, bool hack, bool layouts, bool tensor_cores) {
  const bool four = rows == 4;
  if (rows != 4 && rows != 8) return nullptr;
  if (tensor_cores && head_dim == kMmaHeadDim && bits == 2 && hack && !layouts) {
    return four ? quantized_attention_partials<MmaLanes<4>> : quantized_attention_partials<MmaLanes<8>>;
  }
  switch (head_dim) {
    case 64: return four ? pick<64, 4>(bits, hack, layouts) : pick<64, 8>(bits, hack, layouts);
    case 128: return four ? pick<128, 4>(bits, hack, layouts) : pick<128, 8>(bits, hack, layouts);
    default: return nullptr;
  }
}

// The warps' scratch for KIVI's layouts (LayoutScratch), after `offset` bytes of staging.
LayoutScratch layout_scratch(const QuantizedKvView& sealed, int rows, int head_dim, size_t offset) {
  LayoutScratch scratch;
  if (!sealed.k_per_channel && !sealed.v_per_token) return scratch;
  const int k_groups = sealed.k_per_channel ? kCudaBlockTokens / sealed.k_group_tokens : 0;
  const int v_groups = sealed.v_per_token ? head_dim / sealed.v_group_dims : 0;
  int bytes = 0;
  const auto section = [&](int size) {
    const int start = bytes;
    bytes += (size + 15) / 16 * 16;
    return start;
  };
  scratch.u_codes = section(k_groups * rows * head_dim);
  scratch.u_meta = section(k_groups * rows * (head_dim / kCudaBlockTokens) * int(sizeof(float4)));
  scratch.w_codes = section(v_groups * rows * kCudaBlockTokens);
  scratch.w_meta = section(v_groups * rows * int(sizeof(float4)));
  scratch.bytes = bytes;
  scratch.offset = int(offset);
  return scratch;
}

}  // namespace

Status CudaPagedAttention::run_quantized(const PagedKvView& kv, const QuantizedKvView& sealed, const uint16_t* q,
                                         float scale, uint16_t* out) {
  SLIMKV_RETURN_IF_ERROR(check_run(kv));
  for (Part& part : parts_) {
    SLIMKV_RETURN_IF_ERROR(part.tensor_cores ? run_quantized_prefill(part, kv, sealed, q, scale, out)
                                             : run_quantized_decode(part, kv, sealed, q, scale, out));
  }
  return Status::ok();
}

Status CudaPagedAttention::run_quantized_decode(Part& part, const PagedKvView& kv, const QuantizedKvView& sealed,
                                                const uint16_t* q, float scale, uint16_t* out) {
  if (part.max_query_count != 1) {
    return error("CUDA quantized attention: steps of several queries per sequence need the tensor-core kernel (head_dim 64 ",
                 "or 128, tensor_core_min_queries > 0); the plan has ", part.max_query_count);
  }
  if (sealed.k_bits != sealed.v_bits) {
    return error("CUDA quantized attention: K and V bits must match on the GPU, got ", sealed.k_bits, " and ", sealed.v_bits);
  }
  const bool layouts = sealed.k_per_channel || sealed.v_per_token;
  if (layouts && !sealed.hack) {
    return error("CUDA quantized attention: quant with klayout=channel or vlayout=token has no GPU decode kernel (hack has)");
  }
  if (layouts && sealed.v_per_token && sealed.v_group_dims % (shape_.head_dim / 32) != 0) {
    return error("CUDA quantized attention: vgroup=", sealed.v_group_dims, " must hold whole lanes' columns (a multiple of ",
                 shape_.head_dim / 32, ")");
  }
  const bool tensor_cores = shape_.integer_tensor_cores && sealed.heads == nullptr && sealed.offsets.v_codes % 128 == 0;
  const QuantizedKernel kernel = pick_kernel(shape_.head_dim, rows_per_tile_, sealed.k_bits, sealed.hack, layouts, tensor_cores);
  if (kernel == nullptr) {
    return error("CUDA quantized attention: no decode kernel for head_dim ", shape_.head_dim, ", ", rows_per_tile_,
                 " rows per tile, ", sealed.k_bits, " bits (there: head_dim 64 or 128, 4 or 8 rows, 2, 4 or 8 bits)");
  }
  // The staging buffers, which also hold the warps' partials at the end; then the warps' scratch.
  const size_t buffers = std::max(size_t(kWarps) * 2 * sealed.offsets.block_bytes,
                                  size_t(kWarps) * rows_per_tile_ * shape_.head_dim * sizeof(float));
  const LayoutScratch scratch = layout_scratch(sealed, rows_per_tile_, shape_.head_dim, buffers);
  const size_t staging_bytes = buffers + size_t(kWarps) * size_t(scratch.bytes);
  // Once per kernel and staging size: its shared-memory limit, and its residency (one wave of this
  // kernel differs from one of the dense kernel).
  const auto known = std::find_if(quantized_residency_.begin(), quantized_residency_.end(), [&](const auto& entry) {
    return entry.first == reinterpret_cast<const void*>(kernel) && entry.second.first == staging_bytes;
  });
  int resident = 1;
  if (known != quantized_residency_.end()) {
    resident = known->second.second;
  } else {
    SLIMKV_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(staging_bytes)));
    SLIMKV_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kThreads, staging_bytes));
    quantized_residency_.push_back({reinterpret_cast<const void*>(kernel), {staging_bytes, resident}});
  }
  // A sequence's splits: half a wave, of at least 16 blocks (four a warp). A CTA's fixed work (its queries
  // read and quantized, the first block's staging latency, the warps' partials combined and written)
  // costs about what ten 2-bit blocks' bytes do, so a sequence alone over a whole wave in splits of two
  // blocks (the dense kernel's rule) spends most of each CTA on it, and a batch of such sequences runs
  // wave after wave of it: at 16K (256 blocks in 66 splits), batch 5, Nsight Compute saw 20% of an H200's
  // DRAM bandwidth in use. Measured by splits (H200, 2-bit, µs at batch 1 / 5 / 8): 16K in 66 splits
  // 22.3 / 67.9 / 94.5, in 16 19.5 / 44.8 / 59.7; 64K in 66 38.8 / 137.5 / 202.8, in 33 38.0 / 123.5 /
  // 184.5; 4K in 32 15.0 / 29.1 / 37.0, in 4 18.4 / 21.5 / 21.7 (docs/cuda.md, "Splits of the quantized
  // decode kernel"). Still a rule of the sequence alone (split_rule.h): its bits do not depend on the batch.
  constexpr int kMinBlocksPerQuantizedSplit = 4 * kWarps;
  const int half_wave = std::max(resident, 1) * multiprocessor_count() / 2;
  SLIMKV_RETURN_IF_ERROR(split_blocks(part, half_wave, kMinBlocksPerQuantizedSplit));

  QuantizedLaunch L{};
  L.a = launch_params(part, kv, q, scale, out);
  L.sealed = sealed;
  L.scratch = scratch;
  const dim3 grid(unsigned(L.a.num_splits), unsigned(L.a.num_kv_heads), unsigned(L.a.num_tiles));
  kernel<<<grid, kThreads, staging_bytes>>>(L);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  launch_merge_split_partials(L.a);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

}  // namespace slimkv::cuda
