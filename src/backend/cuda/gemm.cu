#include "backend/cuda/gemm.h"

#include <cublas_v2.h>

#include <utility>

namespace slimkv::cuda {

Expected<std::unique_ptr<CublasGemm>> CublasGemm::create() {
  std::unique_ptr<CublasGemm> gemm(new CublasGemm());
  cublasHandle_t handle = nullptr;
  const cublasStatus_t status = cublasCreate(&handle);
  if (status != CUBLAS_STATUS_SUCCESS) return error("creating the cuBLAS handle: ", cublasGetStatusString(status));
  gemm->handle_ = handle;
  return Expected<std::unique_ptr<CublasGemm>>(std::move(gemm));
}

CublasGemm::~CublasGemm() {
  if (handle_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

Status CublasGemm::multiply(const void* x, int64_t n, const void* w, DType dtype, int64_t rows, int64_t cols, float* y,
                            bool accumulate, int64_t y_stride) {
  if (dtype != DType::kF16 && dtype != DType::kBF16) {
    return error("cuBLAS GEMM: weights in ", dtype_name(dtype), " (expected F16 or BF16)");
  }
  const cudaDataType_t type = dtype == DType::kF16 ? CUDA_R_16F : CUDA_R_16BF;
  if (y_stride == 0) y_stride = rows;
  if (y_stride < rows) return error("cuBLAS GEMM: output row stride ", y_stride, " under its ", rows, " columns");
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  // cuBLAS is column-major: the row-major y [n, rows] is yᵀ [rows, n] there, = W (a row-major
  // [rows, cols] seen column-major is Wᵀ, so transposed back) times xᵀ [cols, n].
  const cublasStatus_t status =
      cublasGemmEx(static_cast<cublasHandle_t>(handle_), CUBLAS_OP_T, CUBLAS_OP_N, int(rows), int(n), int(cols), &one, w,
                   type, int(cols), x, type, int(cols), &beta, y, CUDA_R_32F, int(y_stride), CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
  if (status != CUBLAS_STATUS_SUCCESS) {
    return error("cuBLAS GEMM [", n, " x ", cols, "] · [", rows, " x ", cols, "]ᵀ: ", cublasGetStatusString(status));
  }
  return Status::ok();
}

}  // namespace slimkv::cuda
