#include "attention/cuda/hack_prefill_attention.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "attention/cuda/device_ops.cuh"
#include "attention/cuda/split_k.cuh"
#include "backend/cuda/cuda_check.h"
#include "tensor/quantized_block.h"

namespace slimkv::cuda {
namespace {

constexpr int T = kCudaBlockTokens;  // tokens per block: one V partition, and the K partition's dims
constexpr int kTileRows = kHackPrefillTileRows;
constexpr int kMinCtas = 2;  // per multiprocessor (registers: 65536 / (2 CTAs · threads) per thread at most)
// The block pipeline (see the kernel): packed blocks staged in shared memory, and buffers of converted
// block parameters. A stage or buffer is refilled only once every warp is done with the block it held
// two blocks back, so warps run up to a block apart instead of meeting at a barrier every block.
constexpr int kStages = 4;       // one computed, one converted, one landing, one the slowest warp may still read
constexpr int kMetaBuffers = 3;  // one computed, one converted, one the slowest warp may still read

// What the kernel reads: the split-K launch (q, out, tiles, partials; k_pool / v_pool unused) and the
// sealed blocks.
struct HackPrefillLaunch {
  AttentionLaunch a;
  QuantizedKvView sealed;  // the sealed blocks (their tables: a.block_tables)
  int bits;                // K and V bits: 2, 4 or 8
};

// --- which codes a lane's operand registers hold (the header's "Operands") ---
//
// A lane (g = lane / 4, i = lane % 4) reads 4 rows m = 0..3 of a packed section: K dim groups
// 16p + i + 4m of K partition p, V token groups 4i + m. Its register r (= 2kk + half: the fragment
// register of k step kk) holds in byte b code c of row m, where (m, c) = (r, b) for 4 and 8 bits (a
// register is one packed field, spread) and (b, r) for 2 bits (code r of four fields: the 4×4 byte
// transpose of four packed words yields four registers at once, where spreading one byte costs five
// instructions). The Q' and P' A fragments use the same order.
template <int kBits>
__device__ __forceinline__ constexpr int slot_row(int r, int b) { return kBits == 2 ? b : r; }
template <int kBits>
__device__ __forceinline__ constexpr int slot_code(int r, int b) { return kBits == 2 ? r : b; }

// Where Q' stores the code of dim x (0..63) of a partition: word 4r + i, byte b (a0 of k step kk reads
// word 8kk + i, a2 word 8kk + 4 + i).
template <int kBits>
__device__ __forceinline__ int q_code_byte(int x) {
  const int i = (x / 4) % 4, m = x / 16, c = x % 4;
  const int r = kBits == 2 ? c : m, b = kBits == 2 ? m : c;
  return 4 * (4 * r + i) + b;
}

// The token (0..15 of the lane's 16: token groups 4i..4i+3) in byte b of P' register r.
template <int kBits>
__device__ __forceinline__ constexpr int p_token(int r, int b) { return 4 * slot_row<kBits>(r, b) + slot_code<kBits>(r, b); }

// The 4 registers of each field of one 32-bit word of the lane's 4 rows (w[m] from row m): 8 / kBits
// fields per word, in byte order.
template <int kBits>
__device__ __forceinline__ void decode_word(const uint32_t (&w)[4], uint32_t (&b)[8 / kBits][4]) {
  if constexpr (kBits == 2) {
    // x[f] = field f of rows 0..3 (bytes f of the 4 words), then code r of each: (x >> 2r) & 3 per byte.
    const uint32_t t0 = __byte_perm(w[0], w[1], 0x5140), t1 = __byte_perm(w[0], w[1], 0x7362);
    const uint32_t t2 = __byte_perm(w[2], w[3], 0x5140), t3 = __byte_perm(w[2], w[3], 0x7362);
    const uint32_t x[4] = {__byte_perm(t0, t2, 0x5410), __byte_perm(t0, t2, 0x7632), __byte_perm(t1, t3, 0x5410),
                           __byte_perm(t1, t3, 0x7632)};
#pragma unroll
    for (int f = 0; f < 4; ++f) {
#pragma unroll
      for (int r = 0; r < 4; ++r) b[f][r] = (x[f] >> (2 * r)) & 0x03030303u;
    }
  } else if constexpr (kBits == 4) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {  // spread_codes<4> of the low and the high 16-bit field
      const uint32_t shifted = w[r] >> 4;
      b[0][r] = __byte_perm(w[r], shifted, 0x5140) & 0x0f0f0f0fu;
      b[1][r] = __byte_perm(w[r], shifted, 0x7362) & 0x0f0f0f0fu;
    }
  } else {
#pragma unroll
    for (int r = 0; r < 4; ++r) b[0][r] = w[r];
  }
}

// Staged K' and V' rows keep their 16-byte chunks XOR-swizzled within the row by a key of the row's
// quad lane i (K dim group G: i = G % 4; V token group u: i = u / 4), so that the four rows one load
// instruction's lanes read (one per i, kLaneBytes each at byte kLaneBytes·g) fall in different banks.
// A row is 8·kLaneBytes bytes; 8-byte loads serve half warps, 16-byte ones quarter warps.
template <int kLaneBytes>
__host__ __device__ constexpr int chunk_key(int i) {
  return kLaneBytes == 8 ? 2 * ((i >> 1) & 1) : kLaneBytes == 16 ? 2 * i : kLaneBytes == 32 ? (i & 1) | ((i & 2) << 1) : i;
}

template <int kWords>
__device__ __forceinline__ void load_words(const uint8_t* p, uint32_t (&w)[kWords]) {
  if constexpr (kWords == 2) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = v.x, w[1] = v.y;
  } else {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  }
}

// Calls use(n, b) for each of the lane's 2·kLaneBytes / kBits packed fields n (the B fragment
// registers b of its column in n8 tile n) of its 4 staged rows, reading 16 bytes per row at a time.
template <int kBits, int kLaneBytes, typename Use>
__device__ __forceinline__ void for_each_operand(const uint8_t* const (&rows)[4], int g, int key, Use&& use) {
  constexpr int kPieceBytes = kLaneBytes < 16 ? kLaneBytes : 16, kPieces = kLaneBytes / kPieceBytes;
  constexpr int kWords = kPieceBytes / 4, kFields = 8 / kBits;
#pragma unroll
  for (int piece = 0; piece < kPieces; ++piece) {
    const int x = kLaneBytes * g + kPieceBytes * piece;  // the logical byte in the row
    const int offset = ((x / 16) ^ key) * 16 + x % 16;
    uint32_t w[4][kWords];
#pragma unroll
    for (int m = 0; m < 4; ++m) load_words<kWords>(rows[m] + offset, w[m]);
#pragma unroll
    for (int k = 0; k < kWords; ++k) {
      uint32_t b[kFields][4];
      decode_word<kBits>({w[0][k], w[1][k], w[2][k], w[3][k]}, b);
#pragma unroll
      for (int f = 0; f < kFields; ++f) use((piece * kWords + k) * kFields + f, b[f]);
    }
  }
}

template <int kHeadDim, int kBits>
struct SharedLayout {
  static constexpr int kPartitions = kHeadDim / T;
  static constexpr int kDimTiles = kHeadDim / 8;
  static constexpr int kKRowBytes = T * kBits / 2, kVRowBytes = kHeadDim * kBits / 2;  // packed rows
  static constexpr int kKLaneBytes = kKRowBytes / 8, kVLaneBytes = kVRowBytes / 8;
  // Q' rows, padded so 8 rows fall in 8 bank groups; the padding holds the row's s_q per partition.
  static constexpr int kQWords = (kHeadDim + 16) / 4, kQScaleWord = kHeadDim / 4;
  static constexpr int kCorrectionWords = 12;          // rows of 16 FP16 correction factors, padded as above
  static constexpr size_t kQCodes = 0;                                        // [kTileRows][kQWords]
  static constexpr size_t kQCorrection = kQCodes + size_t(kTileRows) * kQWords * 4;  // [kTileRows][kCorrectionWords]
  // A block's converted parameters, kMetaBuffers buffers, positions in operand order: token t of K at 8(t % 8) + t / 8 (n8 tile t % 8, column t / 8), V column c at
  // 8(c % kDimTiles) + c / kDimTiles.
  static constexpr size_t kMeta = kQCorrection + size_t(kTileRows) * kCorrectionWords * 4;
  static constexpr size_t kKScales = 0;                                       // float [kPartitions][T]: s_k
  static constexpr size_t kVScales = kKScales + size_t(kPartitions) * T * 4;   // float [kHeadDim]: s_v
  static constexpr size_t kKCorrection = kVScales + size_t(kHeadDim) * 4;      // [T][kCorrectionWords]
  static constexpr size_t kVCorrection = kKCorrection + size_t(T) * kCorrectionWords * 4;  // [kHeadDim][4 words]
  static constexpr size_t kMetaBytes = kVCorrection + size_t(kHeadDim) * 16;
  // mbarriers: landed[kStages] (a stage's copies), consumed[kStages] (every warp done with a stage),
  // converted[kMetaBuffers] (a meta buffer written by every thread).
  static constexpr size_t kBarriers = kMeta + kMetaBuffers * kMetaBytes;
  static constexpr size_t kStaged = kBarriers + 16 * 8;                      // kStages packed blocks
  static_assert(2 * kStages + kMetaBuffers <= 16 && kPartitions <= 4, "barriers and s_q fit");
  static_assert(kQCorrection % 16 == 0 && kMeta % 16 == 0 && kKCorrection % 16 == 0 && kVCorrection % 16 == 0 &&
                    kMetaBytes % 16 == 0 && kStaged % 16 == 0,
                "16-byte aligned sections");
};

// Copies a packed block to shared memory (asynchronously), swizzling K' and V' rows (chunk_key).
template <int kHeadDim, int kBits, int kThreads>
__device__ __forceinline__ void stage_block(const uint8_t* source, uint8_t* staged, const QuantizedBlockOffsets& o) {
  using Layout = SharedLayout<kHeadDim, kBits>;
  constexpr int kKChunks = kHeadDim / 4 * Layout::kKRowBytes / 16, kKRowChunks = Layout::kKRowBytes / 16;
  constexpr int kVChunks = T / 4 * Layout::kVRowBytes / 16, kVRowChunks = Layout::kVRowBytes / 16;
  const int v_begin = o.v_codes / 16;
  for (int chunk = threadIdx.x; chunk < o.block_bytes / 16; chunk += kThreads) {
    int target = chunk;
    if (chunk < kKChunks) {
      target = chunk ^ chunk_key<Layout::kKLaneBytes>((chunk / kKRowChunks) % 4);
    } else if (chunk >= v_begin && chunk < v_begin + kVChunks) {
      const int relative = chunk - v_begin;
      target = v_begin + (relative ^ chunk_key<Layout::kVLaneBytes>((relative / kVRowChunks / 4) % 4));
    }
    cp_async_16(staged + target * 16, source + chunk * 16);
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

// The block's partition parameters, converted once per block for all the CTA's warps (into a meta
// buffer, positions as SharedLayout says): s_k per (K partition, token) and s_v per column in FP32,
// and the column factors of the corrections: per token, for each K partition p, slots 6p.. hold
// (s_k Σk', m_k); per V column, slots 0..5 hold (s_v Σv', m_v).
template <int kHeadDim, int kBits, int kThreads>
__device__ __forceinline__ void convert_meta(const uint8_t* block, const QuantizedBlockOffsets& o, uint8_t* meta) {
  using Layout = SharedLayout<kHeadDim, kBits>;
  constexpr int kKSlots = Layout::kPartitions * T, kDimTiles = Layout::kDimTiles;
  constexpr int kItems = kKSlots + kHeadDim;
#pragma unroll
  for (int pass = 0; pass < (kItems + kThreads - 1) / kThreads; ++pass) {
    const int i = threadIdx.x + pass * kThreads;
    if (kItems % kThreads != 0 && i >= kItems) break;
    const bool is_k = i < kKSlots;
    const int slot = is_k ? i : i - kKSlots;
    const __half* mins = reinterpret_cast<const __half*>(block + (is_k ? o.k_mins : o.v_mins));
    const __half* scales = reinterpret_cast<const __half*>(block + (is_k ? o.k_scales : o.v_scales));
    const int16_t* sums = reinterpret_cast<const int16_t*>(block + (is_k ? o.k_sums : o.v_sums));
    const float scale = __half2float(scales[slot]), scaled_sum = scale * float(sums[slot]), min_value = __half2float(mins[slot]);
    __half* out;
    if (is_k) {
      const int part = slot / T, t = slot % T, position = 8 * (t % 8) + t / 8;
      reinterpret_cast<float*>(meta + Layout::kKScales)[part * T + position] = scale;
      out = reinterpret_cast<__half*>(meta + Layout::kKCorrection) + position * 2 * Layout::kCorrectionWords + 6 * part;
    } else {
      const int position = 8 * (slot % kDimTiles) + slot / kDimTiles;
      reinterpret_cast<float*>(meta + Layout::kVScales)[position] = scale;
      out = reinterpret_cast<__half*>(meta + Layout::kVCorrection) + position * 8;
      out[6] = out[7] = __float2half_rn(0.0f);
    }
    write_column_factor(out, scaled_sum);
    write_column_factor(out + 3, min_value);
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

// --- the kernel's parts (FlashInfer's compute_qk / update_mdo_states / compute_sfm_v shape) ---

constexpr int kRowTiles = kHackPrefillRowTilesPerWarp;
constexpr int kRows = 2 * kRowTiles;  // rows of S and O a lane holds
constexpr int kTokenTiles = T / 8;    // n8 tiles of S per block

// What a lane holds of its warp's rows across blocks: O and the online-softmax state (base 2; sum is
// the row's, the same in the quad's 4 lanes).
template <int kDimTiles>
struct RowState {
  float running_max[kRows], sum[kRows];
  float o[kRowTiles][kDimTiles][4];
};
using Scores = float[kRowTiles][kTokenTiles][4];  // S (base 2) of the warp's rows × one block

// P' of the lane's rows over one block, as A fragments of P'·V', with s_p and this lane's k slots 2i,
// 2i + 1 of O's correction rows (m_p, Σp).
struct RowWeights {
  uint32_t codes[kRows][4];  // [row h][register r]
  uint32_t correction[kRows];
  float scale[kRows];
};

// Q' per (row, K partition), a warp each, 2 dims per lane (T = 64 dims = 32 lanes): the queries times
// the softmax scale, as the reference takes them; zeros for inactive rows (never written). s_q and
// the row factors of S's corrections (m_q, s_q Σq' + n m_q), times log2 e: scores come out in base 2.
// The correction slots past the products stay zero.
template <int kHeadDim, int kBits>
__device__ __forceinline__ void quantize_queries(const AttentionLaunch& p, const TileQueries& tq, int kv_head, int warp,
                                                 int lane, uint32_t* q_codes, __half* q_correction) {
  using Layout = SharedLayout<kHeadDim, kBits>;
  constexpr int kPartitions = Layout::kPartitions, kQWords = Layout::kQWords, kCorrectionWords = Layout::kCorrectionWords;
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
    uint8_t* row_codes = reinterpret_cast<uint8_t*>(q_codes + r * kQWords) + part * T;
    float* row_scales = reinterpret_cast<float*>(q_codes + r * kQWords + Layout::kQScaleWord);
    row_codes[q_code_byte<kBits>(2 * lane)] = uint8_t(c0);
    row_codes[q_code_byte<kBits>(2 * lane + 1)] = uint8_t(c1);
    __half* correction = q_correction + r * 2 * kCorrectionWords;
    if (lane == 0) {
      row_scales[part] = scale * kLog2e;
      write_row_factor(correction + 6 * part, lo * kLog2e);
      write_row_factor(correction + 6 * part + 3, fmaf(scale, float(sum), float(T) * lo) * kLog2e);
    }
    if (part == 0 && lane >= 6 * kPartitions && lane < 16) correction[lane] = __float2half_rn(0.0f);
  }
}

// The K correction slots past the products, zero in every meta buffer (convert_meta leaves them).
template <int kHeadDim, int kBits>
__device__ __forceinline__ void zero_k_correction_tails(uint8_t* meta) {
  using Layout = SharedLayout<kHeadDim, kBits>;
  for (int i = threadIdx.x; i < kMetaBuffers * T * 16; i += kHackPrefillThreads) {
    const int buffer = i / (T * 16), position = i / 16 % T, slot = i % 16;
    __half* k_correction = reinterpret_cast<__half*>(meta + buffer * Layout::kMetaBytes + Layout::kKCorrection);
    if (slot >= 6 * Layout::kPartitions) k_correction[position * 2 * Layout::kCorrectionWords + slot] = __float2half_rn(0.0f);
  }
}

// S (base 2) = Σ over K partitions of Eq. 4, Q'·K'ᵀ on tensor cores 32 dims at a time straight from
// the packed fields: S = s_q s_k Q'·K'ᵀ per partition, plus the corrections (FP16 mma, see
// write_row_factor).
template <int kHeadDim, int kBits>
__device__ __forceinline__ void compute_qk(const uint32_t* q_codes, const uint32_t* q_correction_words, const uint8_t* block,
                                           const uint8_t* meta, int warp_row, int lane, Scores& s) {
  using Layout = SharedLayout<kHeadDim, kBits>;
  constexpr int kPartitions = Layout::kPartitions, kQWords = Layout::kQWords, kCorrectionWords = Layout::kCorrectionWords;
  const int g = lane / 4, quad_lane = lane % 4;
  const float* k_scales = reinterpret_cast<const float*>(meta + Layout::kKScales);
  const uint32_t* k_correction = reinterpret_cast<const uint32_t*>(meta + Layout::kKCorrection);
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
      q_scale[2 * m] = reinterpret_cast<const float*>(q_codes + row * kQWords + Layout::kQScaleWord)[part];
      q_scale[2 * m + 1] = reinterpret_cast<const float*>(q_codes + (row + 8) * kQWords + Layout::kQScaleWord)[part];
    }
    const uint8_t* const rows[4] = {block + (16 * part + quad_lane) * Layout::kKRowBytes, block + (16 * part + quad_lane + 4) * Layout::kKRowBytes,
                                    block + (16 * part + quad_lane + 8) * Layout::kKRowBytes,
                                    block + (16 * part + quad_lane + 12) * Layout::kKRowBytes};
    for_each_operand<kBits, Layout::kKLaneBytes>(rows, g, chunk_key<Layout::kKLaneBytes>(quad_lane), [&](int j, const uint32_t(&b)[4]) {
      const float2 k_scale = *reinterpret_cast<const float2*>(k_scales + part * T + 8 * j + 2 * quad_lane);
#pragma unroll
      for (int m = 0; m < kRowTiles; ++m) {
        int dot[4];
        mma_16832_u8_plus(dot, a[m][0], b[0], b[1], kFloatTwo23Bits);
        mma_16832_u8(dot, a[m][1], b[2], b[3]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float qs = q_scale[2 * m + e / 2];
          const float q_dot = fmaf(qs, __int_as_float(dot[e]), -qs * kTwo23);  // s_q Σq'k'
          s[m][j][e] = fmaf(e % 2 ? k_scale.y : k_scale.x, q_dot, s[m][j][e]);
        }
      }
    });
  }
  uint32_t a[kRowTiles][4];
#pragma unroll
  for (int m = 0; m < kRowTiles; ++m) {
    const int row = warp_row + 16 * m + g;
    a[m][0] = q_correction_words[row * kCorrectionWords + quad_lane];
    a[m][1] = q_correction_words[(row + 8) * kCorrectionWords + quad_lane];
    a[m][2] = q_correction_words[row * kCorrectionWords + quad_lane + 4];
    a[m][3] = q_correction_words[(row + 8) * kCorrectionWords + quad_lane + 4];
  }
#pragma unroll
  for (int j = 0; j < kTokenTiles; ++j) {
    const uint32_t* column = k_correction + (8 * j + g) * kCorrectionWords;
    const uint32_t b0 = column[quad_lane], b1 = column[quad_lane + 4];
#pragma unroll
    for (int m = 0; m < kRowTiles; ++m) mma_16816(s[m][j], a[m], b0, b1);
  }
}

// Online softmax, and P' per row over the block (quantize_operand8 over its 64 weights) packed straight
// into the A fragments of P'·V' (p_token's order). P' deviates from quantize_operand8 in its last
// bits, as the P values themselves do (exp2 in FP32, another running max with other splits):
// 255 / (hi - lo) by fast division, and (p - lo) · that rounded once (an FMA onto the magic number)
// rather than twice. The codes are in [0, 255] without a clamp: exp2 is monotonic, so the block's
// least and greatest weights are those of its extreme scores, and p - lo in [0, hi - lo].
template <int kBits, int kDimTiles>
__device__ __forceinline__ void update_mdo_states(const Scores& s, int quad_lane, RowState<kDimTiles>& state, RowWeights& p) {
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
    const float new_max = fmaxf(state.running_max[h], block_max);
    const float rescale = fast_exp2(state.running_max[h] - new_max);
    const bool moved = new_max != state.running_max[h];
    state.running_max[h] = new_max;
    state.sum[h] *= rescale;
    if (__any_sync(kFullMask, moved)) {  // warp-uniform: O's rows are rescaled only when some max moved
#pragma unroll
      for (int d = 0; d < kDimTiles; ++d) state.o[m][d][e0] *= rescale, state.o[m][d][e0 + 1] *= rescale;
    }
    const float lo = fast_exp2(block_min - new_max), hi = fast_exp2(block_max - new_max);
    const float inverse = hi > lo ? __fdividef(255.0f, hi - lo) : 0.0f;
    uint32_t c[16];  // magic-rounded bits of the lane's 16 tokens: the code is the low byte
#pragma unroll
    for (int t = 0; t < 16; ++t) {
      const float weight = fast_exp2(s[m][t % 8][e0 + t / 8] - new_max);
      c[t] = __float_as_uint(fmaf(weight - lo, inverse, kRoundMagic));
    }
    uint32_t code_sum = 0;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const uint32_t word = __byte_perm(__byte_perm(c[p_token<kBits>(r, 0)], c[p_token<kBits>(r, 1)], 0x0040),
                                        __byte_perm(c[p_token<kBits>(r, 2)], c[p_token<kBits>(r, 3)], 0x0040), 0x5410);
      p.codes[h][r] = word;
      code_sum = __dp4a(word, 0x01010101u, code_sum);
    }
    p.scale[h] = (hi - lo) * (1.0f / 255.0f);
    const float p_total = fmaf(p.scale[h], float(quad_sum(int(code_sum))), float(T) * lo);  // Σp = s_p Σp' + T m_p
    state.sum[h] += p_total;
    // The row's factors (m_p, Σp) in slots (hi, hi, lo, hi, hi, lo, 0, ..): lane i holds slots 2i, 2i + 1.
    const __half min_high = half_high(lo), min_low = half_low(lo);
    const __half total_high = half_high(p_total), total_low = half_low(p_total);
    const __half zero = __float2half_rn(0.0f);
    const __half2 pair = quad_lane == 0   ? __halves2half2(min_high, min_high)
                         : quad_lane == 1 ? __halves2half2(min_low, total_high)
                         : quad_lane == 2 ? __halves2half2(total_high, total_low)
                                          : __halves2half2(zero, zero);
    p.correction[h] = *reinterpret_cast<const uint32_t*>(&pair);
  }
}

// O += P·V = s_v (s_p P'·V' + m_p Σv') + m_v Σp, per n8 tile of columns straight from the packed
// fields: the corrections by an FP16 mma onto O, then s_v s_p P'·V'. Row tile m's A fragments of k
// step kk: registers 2kk (k 4i..) and 2kk + 1 (k 16 + 4i..) of its rows.
template <int kHeadDim, int kBits>
__device__ __forceinline__ void compute_sfm_v(const RowWeights& p, const uint8_t* block, const uint8_t* meta,
                                              const QuantizedBlockOffsets& offsets, int lane,
                                              RowState<SharedLayout<kHeadDim, kBits>::kDimTiles>& state) {
  using Layout = SharedLayout<kHeadDim, kBits>;
  const int g = lane / 4, quad_lane = lane % 4;
  const float* v_scales = reinterpret_cast<const float*>(meta + Layout::kVScales);
  const uint32_t* v_correction = reinterpret_cast<const uint32_t*>(meta + Layout::kVCorrection);
  uint32_t a[kRowTiles][2][4];
#pragma unroll
  for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      a[m][kk][0] = p.codes[2 * m][2 * kk];
      a[m][kk][1] = p.codes[2 * m + 1][2 * kk];
      a[m][kk][2] = p.codes[2 * m][2 * kk + 1];
      a[m][kk][3] = p.codes[2 * m + 1][2 * kk + 1];
    }
  }
  const uint8_t* v_block = block + offsets.v_codes;
  const uint8_t* const rows[4] = {v_block + (4 * quad_lane) * Layout::kVRowBytes, v_block + (4 * quad_lane + 1) * Layout::kVRowBytes,
                                  v_block + (4 * quad_lane + 2) * Layout::kVRowBytes, v_block + (4 * quad_lane + 3) * Layout::kVRowBytes};
  for_each_operand<kBits, Layout::kVLaneBytes>(rows, g, chunk_key<Layout::kVLaneBytes>(quad_lane), [&](int d, const uint32_t(&b)[4]) {
    const uint32_t correction = v_correction[(8 * d + g) * 4 + quad_lane];
    const float2 v_scale = *reinterpret_cast<const float2*>(v_scales + 8 * d + 2 * quad_lane);
#pragma unroll
    for (int m = 0; m < kRowTiles; ++m) {
      int dot[4];
      mma_16832_u8_plus(dot, a[m][0], b[0], b[1], kFloatTwo23Bits);
      mma_16832_u8(dot, a[m][1], b[2], b[3]);
      const uint32_t correction_rows[4] = {p.correction[2 * m], p.correction[2 * m + 1], 0u, 0u};
      mma_16816(state.o[m][d], correction_rows, correction, 0u);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float ps = p.scale[2 * m + e / 2];
        const float p_dot = fmaf(ps, __int_as_float(dot[e]), -ps * kTwo23);  // s_p Σp'v'
        state.o[m][d][e] = fmaf(e % 2 ? v_scale.y : v_scale.x, p_dot, state.o[m][d][e]);
      }
    }
  });
}

// The split partial of each of the lane's active rows (an empty split: max -inf, sum 0, acc 0): the
// lane's dims are kDimTiles·(2i + e) + d.
template <int kHeadDim, int kDimTiles>
__device__ __forceinline__ void write_partials(const AttentionLaunch& p, const TileQueries& tq, int tile, int kv_head, int split,
                                               int warp_row, int lane, const RowState<kDimTiles>& state) {
  const int g = lane / 4, quad_lane = lane % 4;
#pragma unroll
  for (int h = 0; h < kRows; ++h) {
    const int m = h / 2, e0 = 2 * (h % 2);
    const int r = warp_row + 16 * m + g + 8 * (h % 2);
    if (r >= tq.active_rows) continue;
    const size_t row = (size_t(tile) * p.num_kv_heads + kv_head) * kTileRows + r;
    float* acc = p.partial_acc + (row * p.split_stride + split) * kHeadDim;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
#pragma unroll
      for (int d = 0; d < kDimTiles; d += 4) {
        *reinterpret_cast<float4*>(acc + kDimTiles * (2 * quad_lane + e) + d) =
            make_float4(state.o[m][d][e0 + e], state.o[m][d + 1][e0 + e], state.o[m][d + 2][e0 + e], state.o[m][d + 3][e0 + e]);
      }
    }
    if (quad_lane == 0) p.partial_max_sum[row * p.split_stride + split] = make_float2(state.running_max[h], state.sum[h]);
  }
}

// --- the kernel ---

// The partial of one tile of kTileRows query rows (row r: query head kv_head·group + r % group at query
// first_query + r / group) over one split of the sealed blocks before its sequence's first new token.
// Warp w owns kRowTiles m16 row tiles from row 16·kRowTiles·w; in tile m a lane holds rows g = lane / 4
// and g + 8 (its rows h = 2m, 2m + 1) and columns 2i, 2i + 1 (i = lane % 4) of every n8 tile of S
// and O. Column n of S's tile j is token 8n + j (a lane's K fields are one run of 8 tokens), column n
// of O's tile d is dim kDimTiles·n + d (a lane's V fields one run of kDimTiles columns); so the lane's
// S accumulators are tokens 16i..16i+15 of its rows, the very tokens of its P' A fragments (token
// groups 4i..4i+3). Blocks flow through kStages stages (cp.async, mbarriers): block k + 2 lands and
// block k + 1's parameters are converted while block k is computed.
template <int kHeadDim, int kBits>
__global__ __launch_bounds__(kHackPrefillThreads, kMinCtas) void hack_prefill_partials(HackPrefillLaunch L) {
  using Layout = SharedLayout<kHeadDim, kBits>;
  constexpr int kThreads = kHackPrefillThreads, kDimTiles = Layout::kDimTiles;
  extern __shared__ uint4 shared_raw[];
  uint8_t* shared = reinterpret_cast<uint8_t*>(shared_raw);
  uint32_t* q_codes = reinterpret_cast<uint32_t*>(shared + Layout::kQCodes);
  __half* q_correction = reinterpret_cast<__half*>(shared + Layout::kQCorrection);
  uint8_t* meta = shared + Layout::kMeta;
  uint8_t* staged = shared + Layout::kStaged;
  uint64_t* landed = reinterpret_cast<uint64_t*>(shared + Layout::kBarriers);
  uint64_t* consumed = landed + kStages;
  uint64_t* converted = consumed + kStages;
  if (threadIdx.x == 0) {
    for (int i = 0; i < 2 * kStages + kMetaBuffers; ++i) mbarrier_init(landed + i, kThreads);
  }
  __syncthreads();  // the barriers are initialized before any arrives

  const AttentionLaunch& p = L.a;
  const QuantizedBlockOffsets& offsets = L.sealed.offsets;
  const int split = blockIdx.x, kv_head = blockIdx.y, tile = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const TileQueries tq(p, tile);
  const int sealed_blocks = tq.first_position / T;  // wholly before the step's first new token
  const TileSplit range = tile_split(p, tq, split, 0, sealed_blocks);
  const int block_begin = range.begin;
  const int blocks = max(0, range.end - block_begin);
  const int sequence = p.sequence_ids[tq.batch_index];
  const int block_bytes = offsets.block_bytes;
  const auto staged_block = [&](int k) { return staged + (k % kStages) * block_bytes; };
  const auto block_meta = [&](int k) { return meta + (k % kMetaBuffers) * Layout::kMetaBytes; };
  // Phase parity of block k's use of its stage (buffer).
  const auto stage_parity = [](int k) { return unsigned(k / kStages) & 1u; };
  const auto meta_parity = [](int k) { return unsigned(k / kMetaBuffers) & 1u; };
  // Block k of the split into its stage (none past the split's blocks).
  const auto load_block = [&](int k) {
    if (k >= blocks) return;
    stage_block<kHeadDim, kBits, kThreads>(sealed_block_address(L.sealed, p, sequence, block_begin + k, kv_head), staged_block(k), offsets);
    cp_async_arrive(landed + k % kStages);
  };
  // Block k's parameters into its meta buffer, once its copies have landed.
  const auto convert_block_meta = [&](int k) {
    if (k >= blocks) return;
    mbarrier_wait(landed + k % kStages, stage_parity(k));
    convert_meta<kHeadDim, kBits, kThreads>(staged_block(k), offsets, block_meta(k));
    mbarrier_arrive(converted + k % kMetaBuffers);
  };
  load_block(0);
  load_block(1);
  quantize_queries<kHeadDim, kBits>(p, tq, kv_head, warp, lane, q_codes, q_correction);
  zero_k_correction_tails<kHeadDim, kBits>(meta);
  __syncthreads();  // Q' and the zeros visible to all
  convert_block_meta(0);

  const int warp_row = warp * 16 * kRowTiles;
  RowState<kDimTiles> state;
#pragma unroll
  for (int h = 0; h < kRows; ++h) state.running_max[h] = -INFINITY, state.sum[h] = 0.0f;
#pragma unroll
  for (int m = 0; m < kRowTiles; ++m) {
#pragma unroll
    for (int d = 0; d < kDimTiles; ++d) state.o[m][d][0] = state.o[m][d][1] = state.o[m][d][2] = state.o[m][d][3] = 0.0f;
  }

  // Block k: refill the stage and meta buffer of block k - 2 (once every warp is done with it) with
  // block k + 2's copies and block k + 1's parameters, then compute block k once every thread has
  // converted its parameters (which each did after seeing its copies land).
  for (int k = 0; k < blocks; ++k) {
    if (k >= 2) mbarrier_wait(consumed + (k - 2) % kStages, stage_parity(k - 2));
    load_block(k + 2);
    convert_block_meta(k + 1);
    mbarrier_wait(converted + k % kMetaBuffers, meta_parity(k));
    Scores s;
    compute_qk<kHeadDim, kBits>(q_codes, reinterpret_cast<const uint32_t*>(q_correction), staged_block(k), block_meta(k),
                                warp_row, lane, s);
    RowWeights weights;
    update_mdo_states<kBits>(s, lane % 4, state, weights);
    compute_sfm_v<kHeadDim, kBits>(weights, staged_block(k), block_meta(k), offsets, lane, state);
    mbarrier_arrive(consumed + k % kStages);
  }
  write_partials<kHeadDim>(p, tq, tile, kv_head, split, warp_row, lane, state);
}

using HackPrefillKernel = void (*)(HackPrefillLaunch);

template <int kHeadDim>
HackPrefillKernel pick_bits(int bits) {
  return bits == 2 ? hack_prefill_partials<kHeadDim, 2> : bits == 4 ? hack_prefill_partials<kHeadDim, 4> : hack_prefill_partials<kHeadDim, 8>;
}
HackPrefillKernel pick(int head_dim, int bits) { return head_dim == 64 ? pick_bits<64>(bits) : pick_bits<128>(bits); }

// The kernel's dynamic shared memory for a head dim and block size (its fixed part is the same for
// every bit width).
size_t hack_prefill_shared_bytes(int head_dim, int block_bytes) {
  const size_t fixed = head_dim == 64 ? SharedLayout<64, 2>::kStaged : SharedLayout<128, 2>::kStaged;
  return fixed + kStages * size_t(block_bytes);
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
  SLIMKV_ASSIGN_OR_RETURN(attention->metadata_, DeviceArray<int>::allocate(size_t(attention_tiles_offset(shape.max_batch) + 2 * shape.max_queries),
                                                                           "HACK prefill metadata"));
  return Expected<std::unique_ptr<CudaHackPrefillAttention>>(std::move(attention));
}

Status CudaHackPrefillAttention::plan(const PagedAttentionBatch& batch) {
  auto laid_out = lay_out_attention_batch(batch, shape_.max_batch, shape_.max_queries, kTileRows / group_);
  if (!laid_out) return laid_out.status().with_context("CUDA HACK prefill attention");
  const std::vector<int>& metadata = *laid_out;
  const int batch_size = int(batch.sequence_ids.size());
  // Each sequence's sealed blocks split as they would be alone (split_rule.h): about one
  // wave of the kernel for a sequence alone.
  splits_per_tile_ = std::max(1, target_ctas_ / shape_.num_kv_heads);
  num_splits_ = 1;
  for (int b = 0; b < batch_size; ++b) {
    const int n = batch.query_counts[size_t(b)], tiles = (n + kTileRows / group_ - 1) / (kTileRows / group_);
    num_splits_ = std::max(num_splits_, most_splits_of((batch.kv_lens[size_t(b)] - n) / T, tiles, splits_per_tile_));
  }
  batch_size_ = batch_size;
  num_tiles_ = int(metadata.size() - size_t(attention_tiles_offset(shape_.max_batch))) / 2;
  const size_t rows = size_t(num_tiles_) * shape_.num_kv_heads * kTileRows * size_t(num_splits_);
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
  if (sealed.k_per_channel || sealed.v_per_token) {
    return error("CUDA HACK prefill attention: the INT8 kernel reads HACK's layout only (klayout=token, vlayout=channel)");
  }
  if (sealed.blocks == nullptr || sealed.block_tables == nullptr) {
    return error("CUDA HACK prefill attention: the sealed blocks or their block tables are missing");
  }
  HackPrefillLaunch L{};
  AttentionLaunch& p = L.a;
  p = step_launch(q, out, kv.block_tables, kv.block_table_stride, metadata_.data(), shape_.max_batch, shape_.num_heads,
                  shape_.num_kv_heads, shape_.head_dim, scale, partial_acc_.data(), partial_max_sum_.data());
  p.positions_per_tile = kTileRows / group_;
  p.rows_per_tile = kTileRows;
  p.splits_per_tile = splits_per_tile_;
  p.num_splits = p.split_stride = num_splits_;
  p.num_tiles = num_tiles_;
  L.sealed = sealed;
  L.bits = bits_;
  launch_hack_prefill_attention(L, shared_bytes_);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  launch_merge_split_partials(p);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

}  // namespace slimkv::cuda
