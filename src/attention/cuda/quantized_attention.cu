// Decode attention over sealed `hack` / `quant` blocks (backend/cuda/quantized_kv_pool.h) plus each
// sequence's open FP16 block: CudaPagedAttention::run_quantized. The work split, the tiles (a GQA group
// reads each KV block once) and the merge of the splits are the dense kernel's (split_k.cuh); what
// differs is how a warp reads one block:
//   hack (HACK §5.2–5.3): Q quantized to 8 bits per K partition once per CTA; Σ q'k' with dp4a on
//     codes unpacked in registers from the block staged in shared memory; Eq. 4's corrections with the
//     stored Σk'; softmax in FP32; P quantized to 8 bits over the block (one V partition); Σ p'v' with
//     dp4a, corrected with the stored Σv'. Held to attend_hack_block_reference (FP64).
//   quant (the KIVI-style baseline at its best): the same staging and unpacking, each code converted
//     to FP32 in registers and multiplied with FP32 q and p; the scale and min applied once per
//     partition (s·Σ q k' + m·Σ q), so no dequantized value is ever stored.
// The open block is read in FP16 and computed in FP32, as the dense kernel does.
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/cuda/paged_attention.h"
#include "attention/cuda/split_k.cuh"
#include "backend/cuda/cuda_check.h"

namespace slimkv::cuda {
namespace {

constexpr int T = kCudaBlockTokens;  // tokens per block: one V partition (HACK's Π)
constexpr unsigned kFullMask = 0xffffffffu;

struct QuantizedLaunch {
  AttentionLaunch a;
  const uint8_t* blocks;  // [num_blocks, num_kv_heads, block_bytes]
  int block_bytes;
  int k_mins, k_scales, k_sums, v_codes, v_mins, v_scales, v_sums;
};

// 4 codes of kBits each (the low 4·kBits bits of `field`) spread to one byte each.
template <int kBits>
__device__ __forceinline__ uint32_t spread_codes(uint32_t field) {
  if constexpr (kBits == 2) {
    const uint32_t x = field & 0xffu;
    return (x | (x << 6) | (x << 12) | (x << 18)) & 0x03030303u;
  } else if constexpr (kBits == 4) {
    // bytes (c0 | c1 << 4, c2 | c3 << 4) and, shifted by 4, (c1 | .., c3): pick c0, c1, c2, c3.
    return __byte_perm(field, field >> 4, 0x5140) & 0x0f0f0f0fu;
  } else {
    return field;
  }
}

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

__device__ __forceinline__ void copy_block_async(uint8_t* shared, const uint8_t* global, int bytes, int lane) {
  for (int i = lane * 16; i < bytes; i += 32 * 16) {
    const unsigned destination = unsigned(__cvta_generic_to_shared(shared + i));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(destination), "l"(global + i));
  }
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, offset));
  return x;
}
__device__ __forceinline__ float warp_min(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x = fminf(x, __shfl_xor_sync(kFullMask, x, offset));
  return x;
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
    const float reference = new_max == -INFINITY ? 0.0f : new_max;
    const float factor = exp2f(max[r] - reference);
    max[r] = new_max;
    sum[r] *= factor;
#pragma unroll
    for (int i = 0; i < kCols; ++i) acc[r][i] *= factor;
    return reference;
  }
};

template <int kHeadDim, int kRows>
struct CtaShared {
  static constexpr int kPartitions = kHeadDim / T;  // K partitions of Π = T dims
  float q[kRows][kHeadDim];                         // the scaled queries
  uint32_t q_codes[kRows][kHeadDim / 4];            // hack: Q', 4 codes per word
  float3 q_meta[kRows][kPartitions];                // hack: (scale, min, Σq'); quant: (Σq, 0, 0)
  float p[kWarps][kRows][T];                        // quant and open blocks: the block's weights
  uint32_t p_codes[kWarps][kRows][T / 4];           // hack: P', 4 tokens per word
  float warp_acc[kWarps][kRows][kHeadDim];
  float2 warp_max_sum[kWarps][kRows];
};

// One sealed block, staged at `b`, folded into the warp's partial.
template <int kHeadDim, int kRows, int kBits, bool kHack>
__device__ __forceinline__ void attend_sealed(const QuantizedLaunch& L, const uint8_t* b, CtaShared<kHeadDim, kRows>& s,
                                              int warp, int lane, WarpPartial<kRows, kHeadDim / 32>& partial) {
  constexpr int kCols = kHeadDim / 32, kPartitions = kHeadDim / T, kBytes = kBits / 2;
  const __half* k_mins = reinterpret_cast<const __half*>(b + L.k_mins);
  const __half* k_scales = reinterpret_cast<const __half*>(b + L.k_scales);
  const int16_t* k_sums = reinterpret_cast<const int16_t*>(b + L.k_sums);
  const int t0 = 2 * lane;  // this lane's tokens: t0, t0 + 1

  // Scores of the lane's two tokens.
  float score[2][kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) score[0][r] = score[1][r] = 0.0f;
#pragma unroll
  for (int part = 0; part < kPartitions; ++part) {
    uint32_t dot[2][kRows];
    float dot_f[2][kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) dot[0][r] = dot[1][r] = 0u, dot_f[0][r] = dot_f[1][r] = 0.0f;
#pragma unroll 4
    for (int g = part * T / 4; g < (part + 1) * T / 4; ++g) {
      const Fields<kBits, 2> fields(b + (g * T + t0) * kBytes);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint32_t k = fields.codes(j);
        if constexpr (kHack) {
#pragma unroll
          for (int r = 0; r < kRows; ++r) dot[j][r] = __dp4a(k, s.q_codes[r][g], dot[j][r]);
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
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int slot = part * T + t0 + j;
      const float k_min = __half2float(k_mins[slot]), k_scale = __half2float(k_scales[slot]);
      const float k_sum = float(k_sums[slot]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float3 q = s.q_meta[r][part];
        if constexpr (kHack) {  // Eq. 4: s_q s_k Σq'k' + m_k s_q Σq' + m_q s_k Σk' + Z m_q m_k
          score[j][r] += k_scale * fmaf(q.x, float(dot[j][r]), q.y * k_sum) + k_min * fmaf(q.x, q.z, float(T) * q.y);
        } else {  // Σ q (m + s k') = s Σ q k' + m Σ q
          score[j][r] += fmaf(k_scale, dot_f[j][r], k_min * q.x);
        }
      }
    }
  }

  // Softmax (base 2) against the running max; hack quantizes P over the block's tokens (8 bits,
  // nearest: quantize_operand8).
  float p_scale[kRows], p_min[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float s0 = score[0][r] * kLog2e, s1 = score[1][r] * kLog2e;
    const float block_max = warp_max(fmaxf(s0, s1));
    const float reference = partial.rescale(r, block_max);
    const float p0 = exp2f(s0 - reference), p1 = exp2f(s1 - reference);
    if constexpr (kHack) {
      // exp2 is monotonic: the block's least and greatest weights are those of its extreme scores.
      const float lo = exp2f(warp_min(fminf(s0, s1)) - reference), hi = exp2f(block_max - reference);
      p_min[r] = lo;
      p_scale[r] = (hi - lo) / 255.0f;
      const float inverse = p_scale[r] > 0.0f ? 1.0f / p_scale[r] : 0.0f;
      const int c0 = min(max(__float2int_rn((p0 - lo) * inverse), 0), 255);
      const int c1 = min(max(__float2int_rn((p1 - lo) * inverse), 0), 255);
      reinterpret_cast<uint16_t*>(s.p_codes[warp][r])[lane] = uint16_t(c0 | (c1 << 8));
    } else {
      *reinterpret_cast<float2*>(&s.p[warp][r][t0]) = make_float2(p0, p1);
    }
  }
  __syncwarp();

  // P·V for the lane's kCols columns.
  const int c0 = lane * kCols;
  uint32_t pv[kRows][kCols], p_sum[kRows];
  float pv_f[kRows][kCols], p_sum_f[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    p_sum[r] = 0u, p_sum_f[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < kCols; ++i) pv[r][i] = 0u, pv_f[r][i] = 0.0f;
  }
#pragma unroll 4
  for (int u = 0; u < T / 4; ++u) {
    const Fields<kBits, kCols> fields(b + L.v_codes + (u * kHeadDim + c0) * kBytes);
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const uint32_t v = fields.codes(i);  // tokens 4u..4u+3 of column c0 + i
      if constexpr (kHack) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) pv[r][i] = __dp4a(v, s.p_codes[warp][r][u], pv[r][i]);
      } else {
        const float v0 = byte_to_float(v, 0), v1 = byte_to_float(v, 1), v2 = byte_to_float(v, 2), v3 = byte_to_float(v, 3);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const float4 p = *reinterpret_cast<const float4*>(&s.p[warp][r][4 * u]);
          pv_f[r][i] = fmaf(p.x, v0, fmaf(p.y, v1, fmaf(p.z, v2, fmaf(p.w, v3, pv_f[r][i]))));
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if constexpr (kHack) {
        p_sum[r] = __dp4a(s.p_codes[warp][r][u], 0x01010101u, p_sum[r]);  // Σp'
      } else {
        const float4 p = *reinterpret_cast<const float4*>(&s.p[warp][r][4 * u]);
        p_sum_f[r] += (p.x + p.y) + (p.z + p.w);
      }
    }
  }
  const __half* v_mins = reinterpret_cast<const __half*>(b + L.v_mins);
  const __half* v_scales = reinterpret_cast<const __half*>(b + L.v_scales);
  const int16_t* v_sums = reinterpret_cast<const int16_t*>(b + L.v_sums);
#pragma unroll
  for (int i = 0; i < kCols; ++i) {
    const float v_min = __half2float(v_mins[c0 + i]), v_scale = __half2float(v_scales[c0 + i]);
    const float v_sum = float(v_sums[c0 + i]);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if constexpr (kHack) {  // Eq. 4 over the block's tokens (Z = T)
        partial.acc[r][i] += v_scale * fmaf(p_scale[r], float(pv[r][i]), p_min[r] * v_sum) +
                             v_min * fmaf(p_scale[r], float(p_sum[r]), float(T) * p_min[r]);
      } else {
        partial.acc[r][i] += fmaf(v_scale, pv_f[r][i], v_min * p_sum_f[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if constexpr (kHack) {
      partial.sum[r] += fmaf(p_scale[r], float(p_sum[r]), float(T) * p_min[r]);
    } else {
      partial.sum[r] += p_sum_f[r];
    }
  }
}

// The open block: tokens [first, kv_end) in FP16 from the dense pool, in FP32 (unquantized q and p).
template <int kHeadDim, int kRows>
__device__ __forceinline__ void attend_open(const AttentionLaunch& p, const __half* k, const __half* v, int n,
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
    *reinterpret_cast<float2*>(&s.p[warp][r][2 * lane]) = make_float2(exp2f(s0 - reference), exp2f(s1 - reference));
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

// The attention partial of one decode tile (a sequence's GQA group) over one split of its blocks.
template <int kHeadDim, int kRows, int kBits, bool kHack>
__global__ __launch_bounds__(kThreads) void quantized_attention_partials(QuantizedLaunch L) {
  constexpr int kCols = kHeadDim / 32, kPartitions = kHeadDim / T;
  static_assert(kCols % 2 == 0, "head dims of 64 or 128");
  extern __shared__ uint4 staging[];  // [kWarps][2][block_bytes]: each warp's blocks, double-buffered
  __shared__ CtaShared<kHeadDim, kRows> s;
  const AttentionLaunch& p = L.a;
  const int split = blockIdx.x, kv_head = blockIdx.y, tile = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const TileQueries tq(p, tile);

  // The tile's queries, times the softmax scale (rows past the group stay 0 and are never written).
  for (int i = threadIdx.x; i < kRows * kHeadDim; i += kThreads) {
    const int r = i / kHeadDim, c = i % kHeadDim;
    float x = 0.0f;
    if (r < tq.active_rows) {
      const int head = kv_head * p.group + r % p.group, query = tq.first_query + r / p.group;
      x = __fmul_rn(__half2float(p.q[(size_t(tq.query_begin + query) * p.num_heads + head) * kHeadDim + c]), p.scale);
    }
    s.q[r][c] = x;
  }
  __syncthreads();
  if (threadIdx.x < kRows * kPartitions) {
    const int r = threadIdx.x / kPartitions, part = threadIdx.x % kPartitions;
    const float* x = &s.q[r][part * T];
    if constexpr (kHack) {  // quantize_operand8 (attention/hack_operands.h): the same IEEE operations
      float lo = x[0], hi = x[0];
      for (int i = 1; i < T; ++i) lo = x[i] < lo ? x[i] : lo, hi = hi < x[i] ? x[i] : hi;
      const float scale = __fdiv_rn(__fsub_rn(hi, lo), 255.0f);
      const float inverse = scale > 0.0f ? __fdiv_rn(1.0f, scale) : 0.0f;
      int sum = 0;
      for (int g = 0; g < T / 4; ++g) {
        uint32_t word = 0;
        for (int i = 0; i < 4; ++i) {
          const int code = min(max(__float2int_rn(__fmul_rn(__fsub_rn(x[4 * g + i], lo), inverse)), 0), 255);
          sum += code;
          word |= uint32_t(code) << (8 * i);
        }
        s.q_codes[r][part * T / 4 + g] = word;
      }
      s.q_meta[r][part] = make_float3(scale, lo, float(sum));
    } else {
      float sum = 0.0f;
      for (int i = 0; i < T; ++i) sum += x[i];
      s.q_meta[r][part] = make_float3(sum, 0.0f, 0.0f);
    }
  }
  __syncthreads();

  // The warp's blocks: block_begin + warp + kWarps·j; those before n_sealed are sealed, the last one
  // may be the open block.
  const int num_blocks = (tq.kv_end + T - 1) / T, n_sealed = tq.kv_end / T;
  const int block_begin = split * p.blocks_per_split;
  const int block_end = min(block_begin + p.blocks_per_split, num_blocks);
  const int sealed_end = min(block_end, n_sealed);
  const int* table = p.block_tables + size_t(p.sequence_ids[tq.batch_index]) * p.block_table_stride;
  const auto sealed_block = [&](int block) {
    return L.blocks + (size_t(table[block]) * p.num_kv_heads + kv_head) * L.block_bytes;
  };
  uint8_t* stage = reinterpret_cast<uint8_t*>(staging) + size_t(warp) * 2 * L.block_bytes;
  WarpPartial<kRows, kCols> partial;
  int buffer = 0;
  if (block_begin + warp < sealed_end) copy_block_async(stage, sealed_block(block_begin + warp), L.block_bytes, lane);
  for (int block = block_begin + warp; block < block_end; block += kWarps) {
    if (block < n_sealed) {
      if (block + kWarps < sealed_end) {  // the next block's copy is in flight while this one is read
        copy_block_async(stage + (buffer ^ 1) * L.block_bytes, sealed_block(block + kWarps), L.block_bytes, lane);
        wait_copies<1>();
      } else {
        wait_copies<0>();
      }
      __syncwarp();
      attend_sealed<kHeadDim, kRows, kBits, kHack>(L, stage + buffer * L.block_bytes, s, warp, lane, partial);
      __syncwarp();  // every lane is done with the buffer before it is refilled
      buffer ^= 1;
    } else {
      const size_t offset = (size_t(table[block]) * p.num_kv_heads + kv_head) * T * kHeadDim;
      attend_open<kHeadDim, kRows>(p, p.k_pool + offset, p.v_pool + offset, tq.kv_end - block * T, s, warp, lane, partial);
    }
  }

#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int i = 0; i < kCols; ++i) s.warp_acc[warp][r][lane * kCols + i] = partial.acc[r][i];
    if (lane == 0) s.warp_max_sum[warp][r] = make_float2(partial.max[r], partial.sum[r]);
  }
  __syncthreads();
  store_cta_partial<kHeadDim, kRows>(p, tq.active_rows, s.warp_acc, s.warp_max_sum);
}

template <int kHeadDim, int kRows, int kBits, bool kHack>
Status launch(const QuantizedLaunch& L) {
  const auto kernel = quantized_attention_partials<kHeadDim, kRows, kBits, kHack>;
  const size_t staging_bytes = size_t(kWarps) * 2 * L.block_bytes;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(staging_bytes)));
  const dim3 grid(unsigned(L.a.num_splits), unsigned(L.a.num_kv_heads), unsigned(L.a.num_tiles));
  kernel<<<grid, kThreads, staging_bytes>>>(L);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

template <int kHeadDim, int kRows, bool kHack>
Status launch_bits(const QuantizedLaunch& L, int bits) {
  switch (bits) {
    case 2: return launch<kHeadDim, kRows, 2, kHack>(L);
    case 4: return launch<kHeadDim, kRows, 4, kHack>(L);
    default: return launch<kHeadDim, kRows, 8, kHack>(L);
  }
}

template <int kHeadDim, int kRows>
Status launch_codec(const QuantizedLaunch& L, int bits, bool hack) {
  return hack ? launch_bits<kHeadDim, kRows, true>(L, bits) : launch_bits<kHeadDim, kRows, false>(L, bits);
}

}  // namespace

Status CudaPagedAttention::run_quantized(const PagedKvView& kv, const QuantizedKvView& sealed, const uint16_t* q,
                                         float scale, uint16_t* out) {
  SLIMKV_RETURN_IF_ERROR(check_run(kv));
  if (max_query_count_ != 1) {
    return error("CUDA quantized attention: decode only (one query per sequence), the plan has ", max_query_count_);
  }
  if (sealed.k_bits != sealed.v_bits) {
    return error("CUDA quantized attention: K and V bits must match on the GPU, got ", sealed.k_bits, " and ", sealed.v_bits);
  }
  QuantizedLaunch L{};
  L.a = launch_params(kv, q, scale, out);
  L.blocks = sealed.blocks;
  L.block_bytes = sealed.block_bytes;
  L.k_mins = sealed.k_mins;
  L.k_scales = sealed.k_scales;
  L.k_sums = sealed.k_sums;
  L.v_codes = sealed.v_codes;
  L.v_mins = sealed.v_mins;
  L.v_scales = sealed.v_scales;
  L.v_sums = sealed.v_sums;
  const int bits = sealed.k_bits;
  const bool four_rows = rows_per_tile_ == 4;
  const Status launched = shape_.head_dim == 64
                              ? (four_rows ? launch_codec<64, 4>(L, bits, sealed.hack) : launch_codec<64, 8>(L, bits, sealed.hack))
                              : (four_rows ? launch_codec<128, 4>(L, bits, sealed.hack) : launch_codec<128, 8>(L, bits, sealed.hack));
  SLIMKV_RETURN_IF_ERROR(launched);
  launch_merge_split_partials(L.a);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

}  // namespace slimkv::cuda
