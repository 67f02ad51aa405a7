// Matrix products with weights on the GPU through cuBLAS: y = x · Wᵀ as the CPU's matmul
// (backend/cpu/matmul.h), W [rows, cols] row-major in FP16 or BF16, x in the same dtype, y in FP32
// with FP32 accumulation (what the forward pass's residual stream and attention inputs want).
#pragma once

#include <cstdint>
#include <memory>

#include "slimkv/status.h"
#include "tensor/dtype.h"

namespace slimkv::cuda {

class CublasGemm {
 public:
  static Expected<std::unique_ptr<CublasGemm>> create();
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  // y[n, rows] = x[n, cols] · Wᵀ, or y += x · Wᵀ when accumulate (the residual adds after o_proj and
  // down_proj, folded into the product). x and w are device arrays of `dtype` (kF16 or kBF16), y FP32
  // with rows y_stride apart (0: rows; more: W is a tile or a part of a wider product's rows, writing
  // its columns of y).
  Status multiply(const void* x, int64_t n, const void* w, DType dtype, int64_t rows, int64_t cols, float* y,
                  bool accumulate = false, int64_t y_stride = 0);

 private:
  CublasGemm() = default;
  void* handle_ = nullptr;  // cublasHandle_t, kept out of this header
};

}  // namespace slimkv::cuda
