// Matrix products with weights as checkpoints store them: y = x · Wᵀ with W [rows, cols] in F32, F16
// or BF16, memory-mapped. F32 weights go to BLAS in place; half-precision weights are widened to FP32
// a chunk of rows at a time (a cache-sized buffer) and multiplied by BLAS, so a BF16 model never
// needs an FP32 copy of itself.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace slimkv {

struct WeightMatrix {
  const void* data = nullptr;  // [rows, cols] row-major in dtype
  DType dtype = DType::kF32;
  int64_t rows = 0;  // output features
  int64_t cols = 0;  // input features
};

// y[n, w.rows] = x[n, w.cols] · Wᵀ. `threads` bounds the widening threads; BLAS uses the count the
// engine set once (openblas_set_num_threads).
void matmul(const float* x, int64_t n, const WeightMatrix& w, float* y, int threads);

// Plain triple loop with FP64 accumulation: the reference matmul is tested against.
void matmul_reference(const float* x, int64_t n, const WeightMatrix& w, float* y);

}  // namespace slimkv
