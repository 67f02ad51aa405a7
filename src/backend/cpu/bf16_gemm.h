// The many-input matrix product (prefill) for BF16 weights on CPUs that multiply BF16 in hardware, in two
// tiers, best first:
//  - AMX (Intel Sapphire Rapids and later, amx_gemm.h): the tile unit multiplies a 16x32 by a 32x16 block
//    of BF16 into 16x16 FP32 sums in one instruction;
//  - AVX-512 BF16 without AMX (AMD Zen 4 and later, Intel Cooper Lake; avx512_bf16_gemm.h): vdpbf16ps
//    sums 32 BF16 products pairwise into 16 FP32 lanes.
// Both take BF16 on both sides. The weights are BF16 already (exact); the FP32 activations are split into
// two BF16 parts, x = hi + lo (16 significant bits: relative error ≤ 2^-17 where FP32 has 2^-24), and both
// parts are multiplied: twice the work for logits that stay within the FP32 parity bounds. (Rounding x to
// one BF16, as llama.cpp rounds it to F16 or BF16, would err by up to 2^-9 per activation.) Products are
// exact in FP32 and summed in FP32, pairs of depth elements at a time.
// This file: the layouts both tiers read (split activations, weight panels in pairs of consecutive depth
// elements), the loop over 32x32 blocks both run, and which tier a CPU takes. CPUs with neither tier
// widen the weights to FP32 instead (panel_gemm.h).
// On AMX the few-input product (decode, 1..16 inputs) runs on the tiles too, from weights packed into the
// panel layout once at load (bf16_pack_panels, bf16_decode_gemm): each output element is then summed the
// same way whatever the other inputs are (a tile product's element depends on its own input row and
// weight column only), so a batched decode step gives each sequence the bits it gets alone.
#pragma once

#include <cstdint>

#include "hwy/aligned_allocator.h"

namespace slimkv {

enum class Bf16GemmTier { kNone, kAvx512Bf16, kAmx };

const char* bf16_gemm_tier_name(Bf16GemmTier tier);  // "none", "avx512-bf16", "amx"
// True when this CPU (and for AMX the kernel, asked once per process) lets `tier` run; kNone: true.
bool bf16_gemm_tier_supported(Bf16GemmTier tier);
// The tier matmul takes: AMX where supported, else AVX-512 BF16 where it beats panel_gemm
// (avx512_bf16_beats_fp32), else none; or the tier the environment variable SLIMKV_BF16_GEMM names (amx,
// avx512-bf16 or none) where this CPU supports it, so that a CPU with AMX can run and measure the tier an
// AMD CPU runs. Read once per process; an unknown or unsupported value is reported on stderr and ignored.
Bf16GemmTier bf16_gemm_tier();

// Inputs and weight rows per block: two 16-row tiles each way.
constexpr int64_t kBf16Block = 32;
// Depth per step (BF16 pairs of a 64-byte tile row).
constexpr int64_t kBf16StepDepth = 32;
// Inputs bf16_decode_gemm takes at most: one A tile.
constexpr int64_t kBf16DecodeMaxInputs = 16;

// FP32 activations x [n, cols] as both tiers read them: each A tile (16 inputs x 32 depth, hi or lo)
// contiguous, 1 KiB, so that a tile load reads consecutive lines (rows of x at their own pitch, a multiple
// of 4 KiB for the usual widths, would all fall in one L1 set). Zeros past cols. The rows past n are
// zeros or an earlier call's inputs: an output row depends on its own input row only (both tiers), and
// the rows past n are never copied to y, so they are not cleared per call (that cost a decode step of
// one input as much as a small product).
// For n ≤ kBf16DecodeMaxInputs (bf16_decode_gemm) the A tiles hold 8 inputs each, both parts: rows 0-7 the
// hi parts, rows 8-15 the lo parts, so that one tile product serves both.
struct Bf16SplitActivations {
  // [ceil(n / 32), steps, 2 (inputs 16-row half), 2 (hi, lo), 16, 32]; n ≤ 16: [steps, ceil(n / 8), 2 (hi, lo), 8, 32]
  hwy::AlignedFreeUniquePtr<uint16_t[]> data;
  int64_t capacity = 0;  // elements allocated (zeroed when allocated)
  int64_t n = 0, cols = 0;
  int64_t steps = 0;  // ceil(cols / 32)
  int64_t decode_groups = 0;  // n ≤ 16: ceil(n / 8) A tiles a step; else 0
};
// Sizes `a` for x [n, cols].
void bf16_split_prepare(int64_t n, int64_t cols, Bf16SplitActivations& a);
// Splits rows [begin, end) of x [n, cols] into a: hi = bf16(x), lo = bf16(x - hi), both rounded to nearest
// even (any threads, disjoint ranges, after bf16_split_prepare; only where a tier other than kNone is
// supported).
void bf16_split_rows(const float* x, int64_t begin, int64_t end, Bf16SplitActivations& a);

// BF16 weights w [rows, cols] packed into the panel layout the tiers read (Bf16BlockProduct's below, over
// the whole depth), zeros past rows and cols: panel p (rows 32p .. 32p + 31) at step s starts at
// panels[(p * ceil(cols / 32) + s) * 1024]. The same size as w, up to the padding. Only where a tier
// other than kNone is supported.
using Bf16Panels = hwy::AlignedFreeUniquePtr<uint16_t[]>;
Bf16Panels bf16_pack_panels(const uint16_t* w, int64_t rows, int64_t cols);

// y[i, o] = Σ_c (hi + lo)[i, c] · float(w[o, c]) for all a.n > kBf16DecodeMaxInputs inputs and rows o in
// [row_begin, row_end) of BF16 w [rows, a.cols]; y [a.n, rows]. panels: w packed by bf16_pack_panels, or
// nullptr (each panel is then packed from w as it is needed); row_begin a multiple of 32 where given. Runs
// on the calling thread; `tier` supported and not kNone.
void bf16_gemm(Bf16GemmTier tier, const Bf16SplitActivations& a, const uint16_t* w, const uint16_t* panels,
               int64_t rows, int64_t row_begin, int64_t row_end, float* y);

// The same product for a.n ≤ kBf16DecodeMaxInputs inputs (a decode step) on the AMX tiles from packed
// panels (bf16_pack_panels), each weight read once: y = Σ_c hi · w + Σ_c lo · w, two FP32 sums over the
// depth steps in order, added at the end; each input's bits the same for any a.n ≤ 16 (not those of
// bf16_gemm, which adds hi and lo into one sum). row_begin a multiple of 32. Runs on the calling thread;
// only where the AMX tier is supported.
void bf16_decode_gemm(const Bf16SplitActivations& a, const uint16_t* panels, int64_t rows, int64_t row_begin,
                      int64_t row_end, float* y);

// What each tier computes per block, the interface of amx_block_product and avx512_bf16_block_product:
// the y block of inputs [i0, i0 + 32) x rows [r0, r0 + 32) += its product over `steps` depth steps (or =
// when !accumulate). x: the block's activations at the first step (Bf16SplitActivations' layout: 2048
// BF16 a step, four A tiles: inputs 0-15 hi, 0-15 lo, 16-31 hi, 16-31 lo); panel: the weights, 1024 BF16
// a step, two B tiles (rows 0-15, 16-31) of 16 depth pairs x 16 rows x 2 BF16:
// panel[step * 1024 + (r / 16) * 512 + pair * 32 + (r % 16) * 2 + k % 2] = w[r0 + r, step * 32 + 2 * pair + k % 2];
// c: the block's first output, c_stride its row pitch in floats.
using Bf16BlockProduct = void (*)(const uint16_t* x, const uint16_t* panel, int64_t steps, bool accumulate, float* c,
                                  int64_t c_stride);

}  // namespace slimkv
