// The many-input matrix product (prefill): y = x · Wᵀ over a range of W's rows, with W in F32, F16 or BF16
// as the checkpoint stores it. Rows are taken a panel at a time (two vectors of rows), widened to FP32 and
// transposed once per panel and depth chunk, then multiplied by every input with a register-blocked
// micro-kernel (several inputs x the panel's rows of accumulators, inputs broadcast): no FP32 copy of the
// model, no BLAS (whose run-time CPU detection may not know the CPU and fall back to SSE3 kernels).
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace slimkv {

// y[i, o] = Σ_c x[i, c] · float(w[o, c]) for all n inputs and rows o in [row_begin, row_end) of
// w [rows, cols] in `dtype`; x [n, cols], y [n, rows]. Runs on the calling thread.
void panel_gemm(const float* x, int64_t n, const void* w, DType dtype, int64_t rows, int64_t cols, int64_t row_begin,
                int64_t row_end, float* y);

// Rows a panel holds on the widest target this binary supports: tasks split rows at multiples of it.
constexpr int64_t kPanelRowsMultiple = 32;

}  // namespace slimkv
