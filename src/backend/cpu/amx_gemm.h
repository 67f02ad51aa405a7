// The many-input matrix product (prefill) for BF16 weights on CPUs with AMX (Intel Sapphire Rapids and
// later): the tile unit multiplies a 16x32 by a 32x16 block of BF16 into 16x16 FP32 sums in one
// instruction, many times the multiply-adds per cycle of AVX-512 FMAs (panel_gemm.h).
// The tile unit takes BF16 on both sides. The weights are BF16 already (exact); the FP32 activations are
// split into two BF16 parts, x = hi + lo (16 significant bits: relative error ≤ 2^-17 where FP32 has
// 2^-24), and both parts are multiplied: twice the tile work for logits that stay within the FP32 parity
// bounds. (Rounding x to one BF16, as llama.cpp rounds it to F16, would err by up to 2^-9 per activation.)
// Products are exact in FP32 and summed in FP32, 32 depth steps per tile product.
#pragma once

#include <cstdint>

#include "hwy/aligned_allocator.h"

namespace slimkv {

// True when the CPU has AMX-BF16 and AVX-512 BF16 and the kernel grants this process the tile state
// (asked once, process-wide). Nothing below may run where it is false.
bool amx_bf16_available();

// FP32 activations x [n, cols] as the tile products read them: each A tile (16 inputs x 32 depth, hi or
// lo) contiguous, 1 KiB, so that a tile load reads consecutive lines (rows of x at their own pitch, a
// multiple of 4 KiB for the usual widths, would all fall in one L1 set). Zeros past n and past cols.
struct AmxActivations {
  hwy::AlignedFreeUniquePtr<uint16_t[]> data;  // [ceil(n / 32), steps, 2 (inputs 16-row half), 2 (hi, lo), 16, 32]
  int64_t capacity = 0;  // elements allocated
  int64_t n = 0, cols = 0;
  int64_t steps = 0;  // ceil(cols / 32): depth steps of one tile product
};
// Sizes `a` for x [n, cols] and zeroes its padding rows.
void amx_prepare(int64_t n, int64_t cols, AmxActivations& a);
// Splits rows [begin, end) of x [n, cols] into a (any threads, disjoint ranges, after amx_prepare).
void amx_split_rows(const float* x, int64_t begin, int64_t end, AmxActivations& a);

// y[i, o] = Σ_c (hi + lo)[i, c] · float(w[o, c]) for all a.n inputs and rows o in [row_begin, row_end)
// of BF16 w [rows, a.cols]; y [a.n, rows]. Runs on the calling thread.
void amx_gemm_bf16(const AmxActivations& a, const uint16_t* w, int64_t rows, int64_t row_begin, int64_t row_end,
                   float* y);

}  // namespace slimkv
