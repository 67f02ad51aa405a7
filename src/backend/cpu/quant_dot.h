// Decode products of ggml's quantized weights (Q8_0, Q4_0, Q4_K, Q6_K) in integers, as llama.cpp's CPU
// kernels compute them: the inputs are quantized once per product to 8 bits per 32 values (int8 q and an
// FP32 scale d, x ≈ d·q), and each weight block is multiplied with them by integer dot products (u8 x s8
// sums of four: vpdpbusd with AVX-512 VNNI or AVX-VNNI, vpmaddubsw + vpmaddwd with AVX2, plain loops
// elsewhere), scaled and accumulated in FP32. A weight row is read once and never widened: a decode step
// moves as few bytes as the file holds, with a few integer operations per 32 values instead of a widening
// and 32 FP32 multiply-adds.
//
// The price is the inputs' rounding: |x - d·q| ≤ d/2 = max|x of the 32| / 254, plus the FP16 scale's
// rounding (0.562·d in all), the error llama.cpp's logits carry too (its Q8_0 activations are these; for
// the K-quants it rounds 256 values to one scale, coarser). Prefill (many inputs) keeps FP32 products on widened rows (matmul.h).
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/ggml_type.h"

namespace slimkv {

// Values per activation block: one scale each, as in ggml's Q8_0 (every weight block holds whole ones).
constexpr int64_t kActivationBlock = 32;

// n input rows quantized for the integer products. Rounded as llama.cpp's quantize_row_q8_0 (AVX path):
// d = max|x| / 127 stored as FP16 (kept here as the float of that FP16; as FP32 past FP16's largest
// value, where llama.cpp's would be infinite), q = x · (1/d) rounded to nearest even, in [-127, 127].
struct QuantizedActivations {
  int64_t n = 0;
  int64_t cols = 0;  // a multiple of kActivationBlock
  std::vector<int8_t> q;           // [n, cols]
  std::vector<float> scales;       // [n, cols / 32]: d
  // d · Σ q per 32 and per 16 values: Q4_K's minimum (x = d·sc·q - dmin·m), and the SIMD tiers' offsets
  // (they multiply unsigned weight codes, stored value + k, and subtract k · scale · these per 8 blocks).
  std::vector<float> scaled_sums;    // [n, cols / 32]
  std::vector<float> scaled_sums16;  // [n, cols / 16]
};

// The instruction sets the products run on. kF32 is no integer tier: the old path, each weight row
// widened to FP32 and multiplied with the unrounded inputs (backend/cpu/dequantize.h).
enum class QuantDotTier { kF32, kScalar, kAvx2, kAvxVnni, kAvx512Vnni };

const char* quant_dot_tier_name(QuantDotTier tier);  // "f32", "scalar", "avx2", "avx-vnni", "avx512-vnni"
// True when this CPU (and OS, for the AVX-512 registers) can run `tier`; kF32 and kScalar: always.
bool quant_dot_tier_supported(QuantDotTier tier);
// The tier matmul takes for decode: the best this CPU supports (AVX-512 VNNI, AVX-VNNI, AVX2, scalar), or
// the one the environment variable SLIMKV_QUANT_DOT names where this CPU supports it (f32 forces the old
// FP32 path, to compare). Read once per process; an unknown or unsupported value is reported on stderr
// and ignored.
QuantDotTier quant_dot_tier();

// FP16's largest finite value: block scales above it stay FP32.
constexpr float kMaxHalf = 65504.0f;

// out = x [n, cols] quantized; cols a multiple of kActivationBlock. Reuses out's buffers. The SIMD tiers
// round with vector instructions, the others in plain loops: the same bits.
void quantize_activations(QuantDotTier tier, const float* x, int64_t n, int64_t cols, QuantizedActivations& out);

// y[i, o] = Σ_c x[i, c] · W[o, c] for the n inputs of x and rows o in [row_begin, row_end) of the quantized
// weights W [rows, cols] (cols = x.cols), on `tier` (supported, not kF32). The integer sums are exact; the
// FP32 scaling and accumulation differ from the reference below by rounding only.
void matvec_quant_dot(QuantDotTier tier, const QuantizedActivations& x, const void* w, BlockQuant quant, int64_t rows,
                      int64_t row_begin, int64_t row_end, float* y);

// The reference every tier is tested against: the FP64 sum of the dequantized weights
// (dequantize_reference) times the dequantized inputs (d·q), all rows.
void matvec_quant_dot_reference(const QuantizedActivations& x, const void* w, BlockQuant quant, int64_t rows,
                                float* y);

}  // namespace slimkv
