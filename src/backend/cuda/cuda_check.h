// Checked CUDA calls for .cu files: a failing call becomes a Status naming the call and CUDA's reason.
#pragma once

#include <cuda_runtime.h>

#include "slimkv/status.h"

// Returns an error Status from the enclosing function if the CUDA call `expr` failed.
#define SLIMKV_CUDA_RETURN_IF_ERROR(expr)                                                           \
  do {                                                                                              \
    const cudaError_t slimkv_cuda_error_ = (expr);                                                 \
    if (slimkv_cuda_error_ != cudaSuccess) {                                                        \
      return ::slimkv::error(#expr, ": ", cudaGetErrorName(slimkv_cuda_error_), " (",              \
                             cudaGetErrorString(slimkv_cuda_error_), ")");                          \
    }                                                                                               \
  } while (0)

// After a kernel launch: reports a bad launch configuration at once (errors while the kernel runs
// surface at the next synchronizing call).
#define SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED() SLIMKV_CUDA_RETURN_IF_ERROR(cudaGetLastError())
