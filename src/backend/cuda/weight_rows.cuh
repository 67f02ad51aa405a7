// The matrix-vector products' inner loop on the GPU, shared by the quantized GEMV (quantized_gemm.cu:
// one matrix, decode batches) and the experts' grouped GEMV (expert_gemv.cu: many experts' matrices in
// one launch): a warp multiplies kRows weight rows (consecutive, or a gate row and its up row) by up to
// kWarpRowsMaxInputs input rows, the weights decoded in registers in FP32 (GGUF blocks as
// dequantize_reference decodes them, plain FP16/BF16 widened), FP32 sums. Each input's sums run in one
// fixed order (lane l takes units l, l + 32, ...; then a sum across the warp) whatever the other inputs
// and kRows: a row's product does not depend on the rows multiplied beside it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/quantized_gemm.h"
#include "tensor/ggml_type.h"

namespace slimkv::cuda {

// Every kernel decodes a quantized row 32 values at a time (a "unit"): a Q8_0 or Q4_0 block, a Q4_K
// sub-block, or one of Q6_K's eight runs of 32 (a quarter of a 128-value half). Units are numbered
// across the whole matrix: rows are whole blocks, so unit u of the matrix is unit u % units_per_block
// of block u / units_per_block.
inline constexpr int kUnit = 32;

// Bytes of a block's body in the device layout (the block less its split-out scale).
__host__ __device__ constexpr size_t body_bytes(BlockQuant quant) {
  switch (quant) {
    case BlockQuant::kQ8_0: return 32;
    case BlockQuant::kQ4_0: return 16;
    case BlockQuant::kQ4_K: return 144;
    case BlockQuant::kQ6_K: return 208;
    case BlockQuant::kNone: break;
  }
  return 0;
}
__device__ inline uint4 load16(const uint8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
__device__ inline float half_bits(unsigned bits) { return __half2float(__ushort_as_half(static_cast<unsigned short>(bits))); }

// w[0 .. 32) = the values of unit `unit`, each computed as dequantize_reference does (same products
// in the same order, rounded to FP32 at each step).
template <BlockQuant Q>
__device__ inline void decode_unit(const uint8_t* body, const uint16_t* scales, int64_t unit, float (&w)[kUnit]) {
  if constexpr (Q == BlockQuant::kQ8_0) {  // x = d·q
    alignas(16) int8_t q[32];
    *reinterpret_cast<uint4*>(q) = load16(body + unit * 32);
    *reinterpret_cast<uint4*>(q + 16) = load16(body + unit * 32 + 16);
    const float d = half_bits(__ldg(scales + unit));
#pragma unroll
    for (int i = 0; i < 32; ++i) w[i] = __fmul_rn(d, float(q[i]));
  } else if constexpr (Q == BlockQuant::kQ4_0) {  // x[i] = d·(low nibble - 8), x[i + 16] = d·(high nibble - 8)
    alignas(16) uint8_t qs[16];
    *reinterpret_cast<uint4*>(qs) = load16(body + unit * 16);
    const float d = half_bits(__ldg(scales + unit));
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      w[i] = __fmul_rn(d, float(int(qs[i] & 15) - 8));
      w[i + 16] = __fmul_rn(d, float(int(qs[i] >> 4) - 8));
    }
  } else if constexpr (Q == BlockQuant::kQ4_K) {  // sub-block j: x = d·sc_j·q - dmin·m_j
    const int64_t block = unit / 8;
    const int sub = int(unit % 8);
    const uint8_t* at = body + block * 144;
    alignas(16) uint8_t head[16];  // d, dmin, the 12 bytes of packed scales and mins
    *reinterpret_cast<uint4*>(head) = load16(at);
    alignas(16) uint8_t qs[32];  // sub-blocks 2k and 2k + 1 share 32 bytes: low nibbles, high nibbles
    *reinterpret_cast<uint4*>(qs) = load16(at + 16 + (sub / 2) * 32);
    *reinterpret_cast<uint4*>(qs + 16) = load16(at + 16 + (sub / 2) * 32 + 16);
    int scale, min;
    q4_k_scale_min(head + 4, sub, &scale, &min);
    const float d_scale = __fmul_rn(half_bits(head[0] | head[1] << 8), float(scale));
    const float d_min = __fmul_rn(half_bits(head[2] | head[3] << 8), float(min));
    const int shift = (sub % 2) * 4;
#pragma unroll
    for (int l = 0; l < 32; ++l) w[l] = __fsub_rn(__fmul_rn(d_scale, float((qs[l] >> shift) & 15)), d_min);
  } else {  // Q6_K, run r (half r / 4, quarter r % 4): q = (4 bits of ql | 2 bits of qh) - 32, x = d·scale·q
    const int64_t block = unit / 8;
    const int run = int(unit % 8), half = run / 4, quarter = run % 4;
    const uint8_t* at = body + block * 208;
    alignas(16) uint8_t ql[32], qh[32];
    alignas(16) int8_t sc[16];
    *reinterpret_cast<uint4*>(ql) = load16(at + half * 64 + (quarter % 2) * 32);
    *reinterpret_cast<uint4*>(ql + 16) = load16(at + half * 64 + (quarter % 2) * 32 + 16);
    *reinterpret_cast<uint4*>(qh) = load16(at + 128 + half * 32);
    *reinterpret_cast<uint4*>(qh + 16) = load16(at + 128 + half * 32 + 16);
    *reinterpret_cast<uint4*>(sc) = load16(at + 192);
    const float d = half_bits(__ldg(scales + block));
    const int low_shift = quarter < 2 ? 0 : 4;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const int q = (((ql[l] >> low_shift) & 15) | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
      w[l] = __fmul_rn(__fmul_rn(d, float(sc[half * 8 + quarter * 2 + l / 16])), float(q));
    }
  }
}

__device__ inline float to_float(__half x) { return __half2float(x); }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename Out>
__device__ inline Out from_float(float x) {
  if constexpr (std::is_same_v<Out, __half>) return __float2half_rn(x);
  else if constexpr (std::is_same_v<Out, __nv_bfloat16>) return __float2bfloat16_rn(x);
  else return x;
}

// xs = kCount consecutive values at p (a multiple of 8: whole 16-byte loads; p 16-byte aligned), widened.
template <int kCount, typename In>
__device__ inline void load_inputs(const In* p, float (&xs)[kCount]) {
  static_assert(kCount % 8 == 0);
#pragma unroll
  for (int k = 0; k < kCount / 8; ++k) {
    const uint4 packed = __ldg(reinterpret_cast<const uint4*>(p) + k);
    const In* values = reinterpret_cast<const In*>(&packed);
#pragma unroll
    for (int j = 0; j < 8; ++j) xs[k * 8 + j] = to_float(values[j]);
  }
}

// The values a lane decodes at a time: a unit of a block type, or 8 plain values (one 16-byte load, so
// plain rows need only be multiples of 8, as Qwen3-MoE's experts of 48 are).
template <BlockQuant Q>
inline constexpr int kUnitValues = Q == BlockQuant::kNone ? 8 : kUnit;

// w = the weights of unit `unit` (counted across the matrix): decoded blocks, or (kNone) plain values
// in In, the inputs' dtype (a plain matrix is of its inputs' dtype).
template <BlockQuant Q, typename In>
__device__ inline void decode_weights(const uint8_t* body, const uint16_t* scales, int64_t unit,
                                      float (&w)[kUnitValues<Q>]) {
  if constexpr (Q == BlockQuant::kNone) {
    load_inputs<kUnitValues<Q>>(reinterpret_cast<const In*>(body) + unit * kUnitValues<Q>, w);
  } else {
    decode_unit<Q>(body, scales, unit, w);
  }
}

inline constexpr int kWarpRowsMaxInputs = int(kQuantizedGemvMaxInputs);

// sums[r][i] = Σ_c x[input_row(i), c] · W[first_row + r·row_step, c] for r < kRows and i < n ≤
// kWarpRowsMaxInputs (0 for rows past `rows`), where input_row(i) is x_rows[first_place + i], or
// first_place + i without x_rows; every lane ends holding every sum. One warp calls it with every lane;
// each lane decodes every 32nd unit of the rows into registers and multiplies it by the same columns of
// every input (read once for all kRows rows); FP32 sums, then a sum across the warp. W [rows, cols]:
// `body` (and `scales`) in quantized_gemm.h's device layout, or plain rows in In.
template <BlockQuant Q, typename In, int kRows>
__device__ inline void warp_row_sums(const In* x, const int32_t* x_rows, int64_t first_place, int n,
                                     const uint8_t* body, const uint16_t* scales, int64_t rows, int64_t cols,
                                     int64_t first_row, int64_t row_step, float (&sums)[kRows][kWarpRowsMaxInputs]) {
  constexpr int kValues = kUnitValues<Q>;
  const int lane = int(threadIdx.x % 32);
  const int64_t units = cols / kValues;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int i = 0; i < kWarpRowsMaxInputs; ++i) sums[r][i] = 0.0f;
  }
  for (int64_t u = lane; u < units; u += 32) {
    float w[kRows][kValues];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = first_row + r * row_step;
      if (row < rows) {
        decode_weights<Q, In>(body, scales, row * units + u, w[r]);
      } else {
#pragma unroll
        for (int l = 0; l < kValues; ++l) w[r][l] = 0.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < kWarpRowsMaxInputs; ++i) {
      if (i >= n) break;
      float xs[kValues];
      // The row looked up where it is used: held in registers, 8 row pointers cost the GEMV a third of
      // its occupancy (80 registers a thread to 100-124).
      const int64_t input_row = x_rows != nullptr ? int64_t(x_rows[first_place + i]) : first_place + i;
      load_inputs<kValues>(x + input_row * cols + u * kValues, xs);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int l = 0; l < kValues; ++l) sums[r][i] = fmaf(w[r][l], xs[l], sums[r][i]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int i = 0; i < kWarpRowsMaxInputs; ++i) {
      if (i >= n) break;
      for (int offset = 16; offset > 0; offset /= 2) sums[r][i] += __shfl_xor_sync(0xffffffffu, sums[r][i], offset);
    }
  }
}

// y[first_place + i, row] (+)= those sums for the warp's rows first_row .. first_row + kRows - 1 (those
// under `rows`): the products of warp_row_sums stored by lane 0.
template <BlockQuant Q, typename In, int kRows>
__device__ inline void multiply_warp_rows(const In* x, const int32_t* x_rows, int64_t first_place, int n,
                                          const uint8_t* body, const uint16_t* scales, int64_t rows, int64_t cols,
                                          int64_t first_row, float* y, int64_t y_stride, bool accumulate) {
  float sums[kRows][kWarpRowsMaxInputs];
  warp_row_sums<Q, In, kRows>(x, x_rows, first_place, n, body, scales, rows, cols, first_row, 1, sums);
  if (threadIdx.x % 32 != 0) return;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int i = 0; i < kWarpRowsMaxInputs; ++i) {
      if (i >= n) break;
      if (first_row + r < rows) {
        float* out = y + (first_place + i) * y_stride + first_row + r;
        *out = accumulate ? *out + sums[r][i] : sums[r][i];
      }
    }
  }
}

}  // namespace slimkv::cuda
