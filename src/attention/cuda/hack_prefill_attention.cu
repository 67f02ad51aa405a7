#include "attention/cuda/hack_prefill_attention.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "attention/cuda/device_ops.cuh"
#include "attention/cuda/split_k.cuh"
#include "backend/cuda/cuda_check.h"
#include "kv/codec/quantized_block.h"

namespace slimkv::cuda {
namespace {

constexpr int T = kCudaBlockTokens;  // tokens per block: one V partition, and the K partition's dims
constexpr int kTileRows = kHackPrefillTileRows;
constexpr unsigned kFullMask = 0xffffffffu;

// What the kernel reads: the split-K launch (q, out, tiles, partials; k_pool / v_pool unused) and the
// sealed blocks.
struct HackPrefillLaunch {
  AttentionLaunch a;
  QuantizedKvView sealed;  // the sealed blocks (their tables: a.block_tables)
  int bits;                // K and V bits: 2, 4 or 8
};

// Shared memory rows are padded by 16 bytes so that the 8 rows one fragment load touches fall in 8
// different groups of 4 banks (row strides ≡ 4 words mod 8).
constexpr int row_words(int bytes) { return (bytes + 16) / 4; }

// --- reading packed codes (kv/codec/quantized_block.h: 4 codes of b bits in a field of b/2 bytes) ---

template <int kBits>
__device__ __forceinline__ uint32_t read_field(const uint8_t* p) {
  if constexpr (kBits == 2) {
    return *p;
  } else if constexpr (kBits == 4) {
    return *reinterpret_cast<const uint16_t*>(p);
  } else {
    return *reinterpret_cast<const uint32_t*>(p);
  }
}

template <int kHeadDim>
struct SharedLayout {
  static constexpr int kPartitions = kHeadDim / T;
  static constexpr int kQWords = row_words(kHeadDim);  // Q' rows and K' token rows, u8 codes
  static constexpr int kVWords = row_words(T);         // V' column rows: a column's 64 token codes
  static constexpr int kCorrectionWords = 12;          // rows of 16 FP16 correction factors, padded as above
  static constexpr size_t kQCodes = 0;                                        // [kTileRows][kQWords]
  static constexpr size_t kQScales = kQCodes + size_t(kTileRows) * kQWords * 4;  // float [kTileRows][kPartitions]: s_q
  static constexpr size_t kQCorrection = kQScales + size_t(kTileRows) * kPartitions * 4;  // [kTileRows][kCorrectionWords]
  static constexpr size_t kKCodes = kQCorrection + size_t(kTileRows) * kCorrectionWords * 4;  // [T][kQWords]
  static constexpr size_t kVCodes = kKCodes + size_t(T) * kQWords * 4;        // [kHeadDim][kVWords]
  static constexpr int kKSlots = kPartitions * T;                              // (K partition, token)
  static constexpr size_t kKScales = kVCodes + size_t(kHeadDim) * kVWords * 4;    // float [kKSlots]: s_k
  static constexpr size_t kVScales = kKScales + size_t(kKSlots) * 4;               // float [kHeadDim]: s_v
  static constexpr size_t kKCorrection = kVScales + size_t(kHeadDim) * 4;          // [T][kCorrectionWords]
  static constexpr size_t kVCorrection = kKCorrection + size_t(T) * kCorrectionWords * 4;  // [kHeadDim][4 words]
  static constexpr size_t kStaged = kVCorrection + size_t(kHeadDim) * 16;          // 2 stages of a packed block
  static_assert(kQCorrection % 16 == 0 && kKCodes % 16 == 0 && kVCodes % 16 == 0 && kKScales % 16 == 0 &&
                    kKCorrection % 16 == 0 && kVCorrection % 16 == 0 && kStaged % 16 == 0,
                "16-byte aligned sections");
};

// K' of a staged block to u8 rows [token][dim]: the B fragment of Q'·K'ᵀ (column = token, k = dims) is a
// word of a row. A warp unpacks 8 tokens × 4 dim groups, one word each: the 32 stores hit 32 banks.
template <int kHeadDim, int kBits>
__device__ __forceinline__ void unpack_k(const uint8_t* block, uint32_t* k_codes) {
  constexpr int kGroups = kHeadDim / 4, kQuads = kGroups / 4;
  for (int i = threadIdx.x; i < kGroups * T; i += kHackPrefillThreads) {
    const int lane = i % 32, w = i / 32;
    const int group = 4 * (w % kQuads) + lane % 4, token = 8 * (w / kQuads) + lane / 4;
    k_codes[token * SharedLayout<kHeadDim>::kQWords + group] = spread_codes<kBits>(read_field<kBits>(block + (group * T + token) * kBits / 2));
  }
}

// V' of a staged block to u8 rows [column][token], tokens permuted within each 16 so that a word of a
// row is the B fragment of P'·V' that matches the A fragment of P' built from S's accumulators: word i
// of 16 tokens holds tokens 2i, 2i + 1, 2i + 8, 2i + 9 (the tokens a lane's accumulators hold in two
// neighbouring n8 tiles). The order of the k dimension is free as long as A and B agree.
template <int kHeadDim, int kBits>
__device__ __forceinline__ void unpack_v(const uint8_t* v_packed, uint32_t* v_codes) {
  for (int i = threadIdx.x; i < kHeadDim * (T / 16); i += kHackPrefillThreads) {
    const int column = i % kHeadDim, sixteen = i / kHeadDim;
    uint32_t w[4];  // tokens 16·sixteen + 4k .. + 3
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = spread_codes<kBits>(read_field<kBits>(v_packed + ((4 * sixteen + k) * kHeadDim + column) * kBits / 2));
    const uint4 words = make_uint4(__byte_perm(w[0], w[2], 0x5410), __byte_perm(w[0], w[2], 0x7632), __byte_perm(w[1], w[3], 0x5410),
                                   __byte_perm(w[1], w[3], 0x7632));
    *reinterpret_cast<uint4*>(v_codes + column * SharedLayout<kHeadDim>::kVWords + 4 * sixteen) = words;
  }
}

// Eq. 4's terms without Q'·K' (and P'·V') are sums of products of a row factor and a column factor:
//   Σ_partitions m_q Σk' s_k + (s_q Σq' + n m_q) m_k     (S: 4 products for 2 K partitions)
//   m_p s_v Σv' + Σp m_v                                 (O: 2 products)
// which one FP16 mma m16n8k16 per 16×8 tile computes into the FP32 accumulators (S's, O's), instead
// of 2 FMAs per product and element. Each factor x is split into FP16 x_hi + x_lo (22 bits), and a
// product takes 3 of the 16 k slots: A = (a_hi, a_hi, a_lo), B = (b_hi, b_lo, b_hi), so that
// a·b is a_hi b_hi + a_hi b_lo + a_lo b_hi, off by a_lo b_lo ~ 2^-22 |a b| (FP32-like).
__device__ __forceinline__ __half half_high(float x) { return __float2half_rn(x); }
__device__ __forceinline__ __half half_low(float x) { return __float2half_rn(x - __half2float(__float2half_rn(x))); }
// Writes the 3 A-side (row) or B-side (column) slots of one product at `out`.
__device__ __forceinline__ void write_row_factor(__half* out, float x) {
  out[0] = out[1] = half_high(x);
  out[2] = half_low(x);
}
__device__ __forceinline__ void write_column_factor(__half* out, float x) {
  out[0] = out[2] = half_high(x);
  out[1] = half_low(x);
}

// The block's partition parameters, converted once per block for all the CTA's warps: s_k per (K
// partition, token) and s_v per column in FP32, and the column factors of the corrections: per token,
// for each K partition p, slots 6p.. hold (s_k Σk', m_k); per V column, slots 0..5 hold (s_v Σv', m_v).
template <int kHeadDim>
__device__ __forceinline__ void unpack_meta(const uint8_t* block, const QuantizedBlockOffsets& o, float* k_scales_out,
                                            float* v_scales_out, __half* k_correction, __half* v_correction) {
  using Layout = SharedLayout<kHeadDim>;
  constexpr int kKSlots = Layout::kKSlots;
  for (int i = threadIdx.x; i < kKSlots + kHeadDim; i += kHackPrefillThreads) {
    const bool is_k = i < kKSlots;
    const int slot = is_k ? i : i - kKSlots;
    const __half* mins = reinterpret_cast<const __half*>(block + (is_k ? o.k_mins : o.v_mins));
    const __half* scales = reinterpret_cast<const __half*>(block + (is_k ? o.k_scales : o.v_scales));
    const int16_t* sums = reinterpret_cast<const int16_t*>(block + (is_k ? o.k_sums : o.v_sums));
    const float scale = __half2float(scales[slot]), scaled_sum = scale * float(sums[slot]), min_value = __half2float(mins[slot]);
    if (is_k) {
      k_scales_out[slot] = scale;
      __half* out = k_correction + (slot % T) * 2 * Layout::kCorrectionWords + 6 * (slot / T);
      write_column_factor(out, scaled_sum);
      write_column_factor(out + 3, min_value);
    } else {
      v_scales_out[slot] = scale;
      __half* out = v_correction + slot * 8;
      write_column_factor(out, scaled_sum);
      write_column_factor(out + 3, min_value);
      out[6] = out[7] = __float2half_rn(0.0f);
    }
  }
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(kFullMask, x, 1));
  return fmaxf(x, __shfl_xor_sync(kFullMask, x, 2));
}
__device__ __forceinline__ float quad_min(float x) {
  x = fminf(x, __shfl_xor_sync(kFullMask, x, 1));
  return fminf(x, __shfl_xor_sync(kFullMask, x, 2));
}
__device__ __forceinline__ int quad_sum(int x) {
  x += __shfl_xor_sync(kFullMask, x, 1);
  return x + __shfl_xor_sync(kFullMask, x, 2);
}
template <int kLanes>
__device__ __forceinline__ float group_min(float x) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) x = fminf(x, __shfl_xor_sync(kFullMask, x, offset));
  return x;
}
template <int kLanes>
__device__ __forceinline__ float group_max(float x) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, offset));
  return x;
}

// Integer products come out of the mma as floats for free: accumulating onto the bits of 2^23, the
// result's bits are those of the float 2^23 + dot (exact: dot < 64 · 255 · 255 < 2^23), so
// s · dot = fma(s, that, -s · 2^23) with one rounding, and no int-to-float conversion (a quarter-rate
// instruction that would bound the kernel). Likewise a float y in [0, 2^22) rounds to the nearest
// integer (ties to even, as lrint and __float2int_rn) in the low bits of y + 1.5 · 2^23.
constexpr int kFloatTwo23Bits = 0x4b000000;
constexpr float kTwo23 = 8388608.0f;
constexpr float kRoundMagic = 12582912.0f;  // 1.5 · 2^23

// 2^x, approximate (2 ulp), subnormals flushed: the softmax weights need no more.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Q' as quantize_operand8 makes it (attention/hack_operands.h: the same IEEE operations, nearest-even),
// so that the kernel and the reference see identical Q' codes.
__device__ __forceinline__ int operand8_code(float x, float lo, float inverse) {
  return min(max(__float2int_rn(__fmul_rn(__fsub_rn(x, lo), inverse)), 0), 255);
}
__device__ __forceinline__ float operand8_scale(float lo, float hi) { return __fdiv_rn(__fsub_rn(hi, lo), 255.0f); }
__device__ __forceinline__ float operand8_inverse(float scale) { return scale > 0.0f ? __fdiv_rn(1.0f, scale) : 0.0f; }

// The partial of one tile of kTileRows query rows (row r: query head kv_head·group + r % group at query
// first_query + r / group) over one split of the sealed blocks before its sequence's first new token.
// Warp w owns rows 32w.. as two m16 tiles; in tile m a lane holds rows g = lane / 4 and g + 8 (its
// rows h = 2m, 2m + 1) and columns 2(lane % 4), +1 of every n8 tile of S and O.
template <int kHeadDim, int kBits>
__global__ __launch_bounds__(kHackPrefillThreads) void hack_prefill_partials(HackPrefillLaunch L) {
  using Layout = SharedLayout<kHeadDim>;
  constexpr int kRowTiles = kHackPrefillRowTilesPerWarp, kRows = 2 * kRowTiles;
  constexpr int kPartitions = Layout::kPartitions, kQWords = Layout::kQWords, kVWords = Layout::kVWords;
  constexpr int kTokenTiles = T / 8, kDimTiles = kHeadDim / 8;
  constexpr int kCorrectionWords = Layout::kCorrectionWords;
  extern __shared__ uint4 shared_raw[];
  uint8_t* shared = reinterpret_cast<uint8_t*>(shared_raw);
  uint32_t* q_codes = reinterpret_cast<uint32_t*>(shared + Layout::kQCodes);
  float* q_scales = reinterpret_cast<float*>(shared + Layout::kQScales);
  __half* q_correction = reinterpret_cast<__half*>(shared + Layout::kQCorrection);
  uint32_t* k_codes = reinterpret_cast<uint32_t*>(shared + Layout::kKCodes);
  uint32_t* v_codes = reinterpret_cast<uint32_t*>(shared + Layout::kVCodes);
  float* k_scales = reinterpret_cast<float*>(shared + Layout::kKScales);
  float* v_scales = reinterpret_cast<float*>(shared + Layout::kVScales);
  __half* k_correction = reinterpret_cast<__half*>(shared + Layout::kKCorrection);
  __half* v_correction = reinterpret_cast<__half*>(shared + Layout::kVCorrection);
  uint8_t* staged = shared + Layout::kStaged;

  const AttentionLaunch& p = L.a;
  const int split = blockIdx.x, kv_head = blockIdx.y, tile = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const TileQueries tq(p, tile);
  const int sealed_blocks = tq.first_position / T;  // wholly before the step's first new token
  const int block_begin = split * p.blocks_per_split;
  const int block_end = min(block_begin + p.blocks_per_split, sealed_blocks);
  const int sequence = p.sequence_ids[tq.batch_index];
  const int block_bytes = L.sealed.offsets.block_bytes;
  const auto load_block = [&](int block, int stage) {
    const uint8_t* source = sealed_block_address(L.sealed, p, sequence, block, kv_head);
    for (int i = threadIdx.x * 16; i < block_bytes; i += kHackPrefillThreads * 16) cp_async_16(staged + stage * block_bytes + i, source + i);
  };
  if (block_begin < block_end) load_block(block_begin, 0);
  cp_async_commit();

  // Q' per (row, K partition), a warp each, 2 dims per lane (T = 64 dims = 32 lanes): the queries
  // times the softmax scale, as the reference takes them; zeros for inactive rows (never written).
  // s_q and the row factors of S's corrections (m_q, s_q Σq' + n m_q), times log2 e: scores come out
  // in base 2. The correction slots past the products stay zero.
  for (int item = warp; item < kTileRows * kPartitions; item += kHackPrefillWarps) {
    const int r = item / kPartitions, part = item % kPartitions;
    float x0 = 0.0f, x1 = 0.0f;
    if (r < tq.active_rows) {
      const int head = kv_head * p.group + r % p.group, query = tq.first_query + r / p.group;
      const __half2 pair = *reinterpret_cast<const __half2*>(p.q + (size_t(tq.query_begin + query) * p.num_heads + head) * kHeadDim +
                                                              part * T + 2 * lane);
      const float2 f = __half22float2(pair);
      x0 = __fmul_rn(f.x, p.scale);
      x1 = __fmul_rn(f.y, p.scale);
    }
    const float lo = group_min<32>(fminf(x0, x1)), hi = group_max<32>(fmaxf(x0, x1));
    const float scale = operand8_scale(lo, hi), inverse = operand8_inverse(scale);
    const int c0 = operand8_code(x0, lo, inverse), c1 = operand8_code(x1, lo, inverse);
    int sum = c0 + c1;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
    reinterpret_cast<uint16_t*>(q_codes + r * kQWords)[part * T / 2 + lane] = uint16_t(c0 | (c1 << 8));
    __half* correction = q_correction + r * 2 * kCorrectionWords;
    if (lane == 0) {
      q_scales[r * kPartitions + part] = scale * kLog2e;
      write_row_factor(correction + 6 * part, lo * kLog2e);
      write_row_factor(correction + 6 * part + 3, fmaf(scale, float(sum), float(T) * lo) * kLog2e);
    }
    if (part == 0 && lane >= 6 * kPartitions && lane < 16) correction[lane] = __float2half_rn(0.0f);
    if (part == 0 && lane >= 6 * kPartitions && lane < 16 && r < T) k_correction[r * 2 * kCorrectionWords + lane] = __float2half_rn(0.0f);
  }

  const int g = lane / 4, quad_lane = lane % 4;
  const int warp_row = warp * 16 * kRowTiles;
  float running_max[kRows], sum[kRows];  // base 2; sum is the row's (the same in the quad's 4 lanes)
#pragma unroll
  for (int h = 0; h < kRows; ++h) running_max[h] = -INFINITY, sum[h] = 0.0f;
  float o[kRowTiles][kDimTiles][4];
#pragma unroll
  for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
    for (int d = 0; d < kDimTiles; ++d) o[m][d][0] = o[m][d][1] = o[m][d][2] = o[m][d][3] = 0.0f;
  }

  for (int block = block_begin; block < block_end; ++block) {
    const int stage = (block - block_begin) & 1;
    if (block + 1 < block_end) {
      load_block(block + 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // the staged block (and, the first time, Q') is visible to all
    const uint8_t* b = staged + stage * block_bytes;
    unpack_k<kHeadDim, kBits>(b, k_codes);
    unpack_v<kHeadDim, kBits>(b + L.sealed.offsets.v_codes, v_codes);
    unpack_meta<kHeadDim>(b, L.sealed.offsets, k_scales, v_scales, k_correction, v_correction);
    __syncthreads();

    // S (base 2) = Σ over K partitions of Eq. 4, Q'·K'ᵀ on tensor cores 32 dims at a time.
    // S = s_q s_k Q'·K'ᵀ per partition, plus the corrections (FP16 mma, see write_row_factor).
    float s[kRowTiles][kTokenTiles][4];
#pragma unroll
    for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.0f;
    }
#pragma unroll
    for (int part = 0; part < kPartitions; ++part) {
      uint32_t a[kRowTiles][2][4];
      float q_scale[kRows];
#pragma unroll
      for (int m = 0; m < kRowTiles; ++m) {
        const int row = warp_row + 16 * m + g;
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          const int word = part * T / 4 + 8 * kk + quad_lane;
          a[m][kk][0] = q_codes[row * kQWords + word];
          a[m][kk][1] = q_codes[(row + 8) * kQWords + word];
          a[m][kk][2] = q_codes[row * kQWords + word + 4];
          a[m][kk][3] = q_codes[(row + 8) * kQWords + word + 4];
        }
        q_scale[2 * m] = q_scales[row * kPartitions + part];
        q_scale[2 * m + 1] = q_scales[(row + 8) * kPartitions + part];
      }
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) {
        int dot[kRowTiles][4];
#pragma unroll
        for (int m = 0; m < kRowTiles; ++m) dot[m][0] = dot[m][1] = dot[m][2] = dot[m][3] = kFloatTwo23Bits;
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          const uint32_t* k_row = k_codes + (8 * j + g) * kQWords + part * T / 4 + 8 * kk + quad_lane;
          const uint32_t b0 = k_row[0], b1 = k_row[4];
#pragma unroll
          for (int m = 0; m < kRowTiles; ++m) mma_16832_u8(dot[m], a[m][kk], b0, b1);
        }
        const int slot = part * T + 8 * j + 2 * quad_lane;  // this lane's tokens: slot, slot + 1
        const float2 k_scale = *reinterpret_cast<const float2*>(k_scales + slot);
#pragma unroll
        for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float qs = q_scale[2 * m + e / 2];
            const float q_dot = fmaf(qs, __int_as_float(dot[m][e]), -qs * kTwo23);  // s_q Σq'k'
            s[m][j][e] = fmaf(e % 2 ? k_scale.y : k_scale.x, q_dot, s[m][j][e]);
          }
        }
      }
    }

    {
      const uint32_t* rows = reinterpret_cast<const uint32_t*>(q_correction);
      uint32_t a[kRowTiles][4];
#pragma unroll
      for (int m = 0; m < kRowTiles; ++m) {
        const int row = warp_row + 16 * m + g;
        a[m][0] = rows[row * kCorrectionWords + quad_lane];
        a[m][1] = rows[(row + 8) * kCorrectionWords + quad_lane];
        a[m][2] = rows[row * kCorrectionWords + quad_lane + 4];
        a[m][3] = rows[(row + 8) * kCorrectionWords + quad_lane + 4];
      }
      const uint32_t* tokens = reinterpret_cast<const uint32_t*>(k_correction);
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) {
        const uint32_t b0 = tokens[(8 * j + g) * kCorrectionWords + quad_lane], b1 = tokens[(8 * j + g) * kCorrectionWords + quad_lane + 4];
#pragma unroll
        for (int m = 0; m < kRowTiles; ++m) mma_16816(s[m][j], a[m], b0, b1);
      }
    }

    // Online softmax, and P' per row over the block (quantize_operand8 over its 64 weights) packed
    // straight into the A fragments of P'·V': a[m][kk] takes the lane's tokens of n8 tiles 4kk..4kk+3.
    // P' deviates from quantize_operand8 in its last bits, as the P values themselves do (exp2 in FP32,
    // another running max with other splits): 255 / (hi - lo) by fast division, and (p - lo) · that
    // rounded once (an FMA onto the magic number) rather than twice. The codes are in [0, 255] without
    // a clamp: exp2 is monotonic, so the block's least and greatest weights are those of its extreme
    // scores, and p - lo in [0, hi - lo].
    uint32_t a[kRowTiles][2][4];
    uint32_t p_correction[kRows];  // this lane's k slots 2i, 2i + 1 (i = lane % 4) of O's correction rows
    float p_scale[kRows], p_total[kRows];  // p_total = Σp = s_p Σp' + T m_p
#pragma unroll
    for (int h = 0; h < kRows; ++h) {
      const int m = h / 2, e0 = 2 * (h % 2);
      float block_max = -INFINITY, block_min = INFINITY;
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) {
        block_max = fmaxf(block_max, fmaxf(s[m][j][e0], s[m][j][e0 + 1]));
        block_min = fminf(block_min, fminf(s[m][j][e0], s[m][j][e0 + 1]));
      }
      block_max = quad_max(block_max);
      block_min = quad_min(block_min);
      const float new_max = fmaxf(running_max[h], block_max);
      const float rescale = fast_exp2(running_max[h] - new_max);
      const bool moved = new_max != running_max[h];
      running_max[h] = new_max;
      sum[h] *= rescale;
      if (__any_sync(kFullMask, moved)) {  // warp-uniform: O's rows are rescaled only when some max moved
#pragma unroll
        for (int d = 0; d < kDimTiles; ++d) o[m][d][e0] *= rescale, o[m][d][e0 + 1] *= rescale;
      }
      const float lo = fast_exp2(block_min - new_max), hi = fast_exp2(block_max - new_max);
      const float inverse = hi > lo ? __fdividef(255.0f, hi - lo) : 0.0f;
      uint32_t code_sum = 0;
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
        for (int pair = 0; pair < 2; ++pair) {
          const int j = 4 * kk + 2 * pair;
          uint32_t c[4];  // magic-rounded bits: the code is the low byte
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            const float weight = fast_exp2(s[m][j + x / 2][e0 + x % 2] - new_max);
            c[x] = __float_as_uint(fmaf(weight - lo, inverse, kRoundMagic));
          }
          const uint32_t word = __byte_perm(__byte_perm(c[0], c[1], 0x0040), __byte_perm(c[2], c[3], 0x0040), 0x5410);
          a[m][kk][h % 2 + 2 * pair] = word;
          code_sum = __dp4a(word, 0x01010101u, code_sum);
        }
      }
      p_scale[h] = (hi - lo) * (1.0f / 255.0f);
      p_total[h] = fmaf(p_scale[h], float(quad_sum(int(code_sum))), float(T) * lo);
      sum[h] += p_total[h];
      // The row's factors (m_p, Σp) in slots (hi, hi, lo, hi, hi, lo, 0, ..): lane i holds slots 2i, 2i + 1.
      const __half min_high = half_high(lo), min_low = half_low(lo);
      const __half total_high = half_high(p_total[h]), total_low = half_low(p_total[h]);
      const __half zero = __float2half_rn(0.0f);
      const __half2 pair = quad_lane == 0   ? __halves2half2(min_high, min_high)
                           : quad_lane == 1 ? __halves2half2(min_low, total_high)
                           : quad_lane == 2 ? __halves2half2(total_high, total_low)
                                            : __halves2half2(zero, zero);
      p_correction[h] = *reinterpret_cast<const uint32_t*>(&pair);
    }

    // O += P·V = s_v (s_p P'·V' + m_p Σv') + m_v Σp, per n8 tile of columns: the corrections by an FP16
    // mma onto O, then s_v s_p P'·V'.
#pragma unroll
    for (int d = 0; d < kDimTiles; ++d) {
      int dot[kRowTiles][4];
#pragma unroll
      for (int m = 0; m < kRowTiles; ++m) dot[m][0] = dot[m][1] = dot[m][2] = dot[m][3] = kFloatTwo23Bits;
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        const uint32_t* v_row = v_codes + (8 * d + g) * kVWords + 8 * kk + quad_lane;
        const uint32_t b0 = v_row[0], b1 = v_row[4];
#pragma unroll
        for (int m = 0; m < kRowTiles; ++m) mma_16832_u8(dot[m], a[m][kk], b0, b1);
      }
      const uint32_t correction = reinterpret_cast<const uint32_t*>(v_correction)[(8 * d + g) * 4 + quad_lane];
#pragma unroll
      for (int m = 0; m < kRowTiles; ++m) {
        const uint32_t rows[4] = {p_correction[2 * m], p_correction[2 * m + 1], 0u, 0u};
        mma_16816(o[m][d], rows, correction, 0u);
      }
      const int column = 8 * d + 2 * quad_lane;  // this lane's columns: column, column + 1
      const float2 v_scale = *reinterpret_cast<const float2*>(v_scales + column);
#pragma unroll
      for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float ps = p_scale[2 * m + e / 2];
          const float p_dot = fmaf(ps, __int_as_float(dot[m][e]), -ps * kTwo23);  // s_p Σp'v'
          o[m][d][e] = fmaf(e % 2 ? v_scale.y : v_scale.x, p_dot, o[m][d][e]);
        }
      }
    }
    __syncthreads();  // the unpacked codes and this stage are refilled by the next iteration
  }
  cp_async_wait<0>();  // a CTA with no blocks has nothing in flight, but the group was committed

  // The split partial of each active row (an empty split: max -inf, sum 0, acc 0).
#pragma unroll
  for (int h = 0; h < kRows; ++h) {
    const int m = h / 2, e0 = 2 * (h % 2);
    const int r = warp_row + 16 * m + g + 8 * (h % 2);
    if (r >= tq.active_rows) continue;
    const size_t row = (size_t(tile) * p.num_kv_heads + kv_head) * kTileRows + r;
    float* acc = p.partial_acc + (row * p.split_stride + split) * kHeadDim + 2 * quad_lane;
#pragma unroll
    for (int d = 0; d < kDimTiles; ++d) *reinterpret_cast<float2*>(acc + 8 * d) = make_float2(o[m][d][e0], o[m][d][e0 + 1]);
    if (quad_lane == 0) p.partial_max_sum[row * p.split_stride + split] = make_float2(running_max[h], sum[h]);
  }
}

using HackPrefillKernel = void (*)(HackPrefillLaunch);

template <int kHeadDim>
HackPrefillKernel pick_bits(int bits) {
  return bits == 2 ? hack_prefill_partials<kHeadDim, 2> : bits == 4 ? hack_prefill_partials<kHeadDim, 4> : hack_prefill_partials<kHeadDim, 8>;
}
HackPrefillKernel pick(int head_dim, int bits) { return head_dim == 64 ? pick_bits<64>(bits) : pick_bits<128>(bits); }

// The kernel's dynamic shared memory for a head dim and block size.
size_t hack_prefill_shared_bytes(int head_dim, int block_bytes) {
  const size_t fixed = head_dim == 64 ? SharedLayout<64>::kStaged : SharedLayout<128>::kStaged;
  return fixed + 2 * size_t(block_bytes);
}

// Opts the kernel into `shared_bytes`; returns its CTAs resident per multiprocessor (0 on an error).
int hack_prefill_setup(int head_dim, int bits, size_t shared_bytes) {
  const HackPrefillKernel kernel = pick(head_dim, bits);
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes)) != cudaSuccess) return 0;
  int ctas = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, kHackPrefillThreads, shared_bytes) != cudaSuccess) return 0;
  return ctas;
}

// Grid (split, KV head, tile); always writes split partials (then launch_merge_split_partials).
void launch_hack_prefill_attention(const HackPrefillLaunch& L, size_t shared_bytes) {
  const dim3 grid(unsigned(L.a.num_splits), unsigned(L.a.num_kv_heads), unsigned(L.a.num_tiles));
  pick(L.a.head_dim, L.bits)<<<grid, kHackPrefillThreads, shared_bytes>>>(L);
}

}  // namespace

// --- the host side ---

int hack_prefill_kernel_setup(int head_dim, int bits, int block_bytes) {
  return hack_prefill_setup(head_dim, bits, hack_prefill_shared_bytes(head_dim, block_bytes));
}

void launch_hack_prefill_kernel(const AttentionLaunch& p, const QuantizedKvView& sealed) {
  launch_hack_prefill_attention(HackPrefillLaunch{p, sealed, sealed.k_bits}, hack_prefill_shared_bytes(p.head_dim, sealed.offsets.block_bytes));
}

Expected<std::unique_ptr<CudaHackPrefillAttention>> CudaHackPrefillAttention::create(const PagedAttentionShape& shape, int bits) {
  if (shape.num_heads <= 0 || shape.num_kv_heads <= 0 || shape.num_heads % shape.num_kv_heads != 0 ||
      shape.num_heads / shape.num_kv_heads > 8) {
    return error("CUDA HACK prefill attention: num_heads ", shape.num_heads, " must be a multiple of num_kv_heads ",
                 shape.num_kv_heads, ", at most 8 times it");
  }
  if (shape.head_dim != 64 && shape.head_dim != 128) {
    return error("CUDA HACK prefill attention: head_dim ", shape.head_dim, " is not supported (64 or 128)");
  }
  if (bits != 2 && bits != 4 && bits != 8) return error("CUDA HACK prefill attention: bits must be 2, 4 or 8, got ", bits);
  if (shape.max_batch <= 0 || shape.max_queries < shape.max_batch) {
    return error("CUDA HACK prefill attention: max_batch ", shape.max_batch, " and max_queries ", shape.max_queries,
                 " must be positive, max_queries >= max_batch");
  }
  std::unique_ptr<CudaHackPrefillAttention> attention(new CudaHackPrefillAttention(shape, bits));
  attention->group_ = shape.num_heads / shape.num_kv_heads;
  QuantizationConfig config;
  config.k_bits = config.v_bits = bits;
  attention->block_bytes_ = int(QuantizedBlockLayout(config, BlockShape{T, shape.head_dim, shape.head_dim}).block_bytes);
  attention->shared_bytes_ = hack_prefill_shared_bytes(shape.head_dim, attention->block_bytes_);
  const int resident = hack_prefill_setup(shape.head_dim, bits, attention->shared_bytes_);
  if (resident == 0) {
    return error("CUDA HACK prefill attention: the kernel (head_dim ", shape.head_dim, ", ", bits, " bits, ",
                 attention->shared_bytes_, " bytes of shared memory) cannot run");
  }
  attention->target_ctas_ = resident * multiprocessor_count();
  attention->tiles_offset_ = (3 * shape.max_batch + 2) / 2 * 2;  // int2 tiles: 8-byte aligned
  SLIMKV_ASSIGN_OR_RETURN(attention->metadata_, DeviceArray<int>::allocate(size_t(attention->tiles_offset_ + 2 * shape.max_queries),
                                                                           "HACK prefill metadata"));
  return Expected<std::unique_ptr<CudaHackPrefillAttention>>(std::move(attention));
}

Status CudaHackPrefillAttention::plan(const PagedAttentionBatch& batch) {
  const int batch_size = int(batch.sequence_ids.size());
  if (batch_size == 0 || batch_size > shape_.max_batch || int(batch.kv_lens.size()) != batch_size ||
      int(batch.query_counts.size()) != batch_size) {
    return error("CUDA HACK prefill attention: a batch of ", batch_size, " sequences (at most ", shape_.max_batch, "), ",
                 batch.kv_lens.size(), " kv_lens and ", batch.query_counts.size(), " query_counts");
  }
  // Laid out as CudaPagedAttention's metadata (split_k.cuh's AttentionLaunch reads it).
  std::vector<int> metadata(size_t(tiles_offset_), 0);
  int* sequence_ids = metadata.data();
  int* kv_lens = sequence_ids + shape_.max_batch;
  int* query_starts = kv_lens + shape_.max_batch;
  int max_sealed_blocks = 0;
  for (int b = 0; b < batch_size; ++b) {
    const int n = batch.query_counts[size_t(b)], kv_len = batch.kv_lens[size_t(b)];
    if (n < 1 || n > kv_len) {
      return error("CUDA HACK prefill attention: sequence ", b, " has ", n, " queries over ", kv_len,
                   " tokens (expected 1 <= queries <= tokens)");
    }
    sequence_ids[b] = batch.sequence_ids[size_t(b)];
    kv_lens[b] = kv_len;
    query_starts[b + 1] = query_starts[b] + n;
    max_sealed_blocks = std::max(max_sealed_blocks, (kv_len - n) / T);
  }
  if (query_starts[batch_size] > shape_.max_queries) {
    return error("CUDA HACK prefill attention: ", query_starts[batch_size], " queries in one step, over max_queries ",
                 shape_.max_queries);
  }
  const int positions = kTileRows / group_;
  for (int b = 0; b < batch_size; ++b) {
    for (int first = 0; first < batch.query_counts[size_t(b)]; first += positions) {
      metadata.push_back(b);
      metadata.push_back(first);
    }
  }
  batch_size_ = batch_size;
  num_tiles_ = int(metadata.size() - size_t(tiles_offset_)) / 2;
  // Splits fill one wave of the kernel when tiles × KV heads alone do not.
  const int independent_ctas = num_tiles_ * shape_.num_kv_heads;
  num_splits_ = std::clamp(target_ctas_ / independent_ctas, 1, std::max(1, max_sealed_blocks));
  blocks_per_split_ = std::max(1, (max_sealed_blocks + num_splits_ - 1) / num_splits_);
  num_splits_ = std::max(1, (max_sealed_blocks + blocks_per_split_ - 1) / blocks_per_split_);
  const size_t rows = size_t(independent_ctas) * kTileRows * size_t(num_splits_);
  if (partial_max_sum_.size() < 2 * rows) {
    SLIMKV_ASSIGN_OR_RETURN(partial_acc_, DeviceArray<float>::allocate(rows * shape_.head_dim, "HACK prefill partials"));
    SLIMKV_ASSIGN_OR_RETURN(partial_max_sum_, DeviceArray<float>::allocate(2 * rows, "HACK prefill partials"));
  }
  return metadata_.upload(metadata.data(), metadata.size());
}

Status CudaHackPrefillAttention::run(const PagedKvView& kv, const QuantizedKvView& sealed, const uint16_t* q, float scale,
                                     uint16_t* out) {
  if (batch_size_ == 0) return error("CUDA HACK prefill attention: run before plan");
  if (kv.head_dim != shape_.head_dim || kv.num_kv_heads != shape_.num_kv_heads) {
    return error("CUDA HACK prefill attention: the KV cache has ", kv.num_kv_heads, " heads of ", kv.head_dim,
                 " dims, the attention ", shape_.num_kv_heads, " of ", shape_.head_dim);
  }
  if (!sealed.hack || sealed.k_bits != bits_ || sealed.v_bits != bits_ || sealed.offsets.block_bytes != block_bytes_) {
    return error("CUDA HACK prefill attention: expected hack blocks of ", bits_, " bits (", block_bytes_, " bytes), got ",
                 sealed.hack ? "hack" : "quant", " of ", sealed.k_bits, "/", sealed.v_bits, " bits (",
                 sealed.offsets.block_bytes, " bytes)");
  }
  const int* metadata = metadata_.data();
  HackPrefillLaunch L{};
  AttentionLaunch& p = L.a;
  p.q = reinterpret_cast<const __half*>(q);
  p.out = reinterpret_cast<__half*>(out);
  p.block_tables = kv.block_tables;
  p.block_table_stride = kv.block_table_stride;
  p.sequence_ids = metadata;
  p.kv_lens = metadata + shape_.max_batch;
  p.query_starts = metadata + 2 * shape_.max_batch;
  p.tiles = reinterpret_cast<const int2*>(metadata + tiles_offset_);
  p.num_heads = shape_.num_heads;
  p.num_kv_heads = shape_.num_kv_heads;
  p.head_dim = shape_.head_dim;
  p.group = group_;
  p.positions_per_tile = kTileRows / group_;
  p.rows_per_tile = kTileRows;
  p.blocks_per_split = blocks_per_split_;
  p.num_splits = p.split_stride = num_splits_;
  p.num_tiles = num_tiles_;
  p.scale = scale;
  p.scale_log2 = scale * kLog2e;
  p.partial_acc = partial_acc_.data();
  p.partial_max_sum = reinterpret_cast<float2*>(partial_max_sum_.data());
  L.sealed = sealed;
  L.bits = bits_;
  launch_hack_prefill_attention(L, shared_bytes_);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  launch_merge_split_partials(p);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

}  // namespace slimkv::cuda
