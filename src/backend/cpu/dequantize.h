// ggml's quantized blocks (tensor/ggml_type.h) widened to FP32 with SIMD, dispatched at run time, and
// the matrix-vector product that widens one weight row at a time into L1 and multiplies it there, so
// a quantized model stays quantized in memory. Tested against dequantize_reference.
#pragma once

#include <cstdint>

#include "tensor/ggml_type.h"

namespace slimkv {

// out[0 .. n) = the values of n / block_elements(quant) consecutive blocks.
void dequantize(BlockQuant quant, const void* blocks, float* out, int64_t n);

// y[i, o] = Σ_c x[i, c] · W[o, c] for rows o in [row_begin, row_end) of quantized weights W [rows, cols]
// (each row cols / block_elements blocks).
void matvec_quantized(const float* x, int64_t n, const void* w, BlockQuant quant, int64_t rows, int64_t cols,
                      int64_t row_begin, int64_t row_end, float* y);

}  // namespace slimkv
