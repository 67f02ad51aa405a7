// Vector operations for code outside the SIMD kernels, dispatched at run time to the best target this
// CPU supports (AVX-512, AVX2, SSE4, scalar). Kernels call the inline forms in vec_ops-inl.h instead.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace slimkv {

float dot(const float* a, const float* b, size_t n);
// out[i, r] = q_r · x_i for queries q [n_queries, n] and rows x [n_rows, n]; out [n_rows, n_queries]. One
// dispatch for all of them (pq's re-rank scores a few queries against each key it reads).
void dots(const float* q, int n_queries, const float* x, int n_rows, size_t n, float* out);
void mul_add_to(float alpha, const float* x, float* y, size_t n);  // y += alpha · x
// y[i, o] = Σ_c x[i, c] · float(w[o, c]) for rows o in [row_begin, row_end) of half-precision weights
// w [rows, cols] (BF16 or F16): a matrix-vector product that widens the weights in registers.
void matvec_half(const float* x, int64_t n, const uint16_t* w, DType dtype, int64_t rows, int64_t cols,
                 int64_t row_begin, int64_t row_end, float* y);
// out[i] = float(in[i]) for data of `dtype` (F32 is a copy).
void widen_to_f32(const void* in, DType dtype, float* out, size_t n);

}  // namespace slimkv
