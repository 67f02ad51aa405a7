// Matrix products with weights as checkpoints store them: y = x · Wᵀ with W [rows, cols] in F32, F16
// or BF16, memory-mapped. The output rows are split into tasks on the thread pool:
//  - few inputs (decode): half-precision weights are multiplied in place, widened in registers
//    (memory-bound: each weight is read once); F32 weights go to BLAS;
//  - many inputs (prefill): half-precision rows are widened to FP32 a cache-sized chunk at a time and
//    multiplied by BLAS, so a BF16 model never needs an FP32 copy of itself.
// BLAS runs single-threaded inside the tasks: all parallelism goes through the pool.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"
#include "util/thread_pool.h"

namespace slimkv {

struct WeightMatrix {
  const void* data = nullptr;  // [rows, cols] row-major in dtype
  DType dtype = DType::kF32;
  int64_t rows = 0;  // output features
  int64_t cols = 0;  // input features
};

// y[n, w.rows] = x[n, w.cols] · Wᵀ
void matmul(const float* x, int64_t n, const WeightMatrix& w, float* y, ThreadPool& pool);

// Plain triple loop with FP64 accumulation: the reference matmul is tested against.
void matmul_reference(const float* x, int64_t n, const WeightMatrix& w, float* y);

}  // namespace slimkv
