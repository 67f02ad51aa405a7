#include "backend/cpu/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/vec_ops.h"

namespace slimkv {
namespace {

// FP32 elements widened per chunk: large enough for efficient GEMM, small enough to stay in L2/L3.
constexpr int64_t kChunkElements = int64_t(1) << 18;
// Up to this many inputs, half-precision weights are multiplied in place rather than widened for BLAS.
constexpr int64_t kMatVecMaxInputs = 4;
constexpr int64_t kMatVecRows = 64;
// Below this many elements, waking worker threads costs more than widening on one.
constexpr int64_t kParallelElements = int64_t(1) << 16;

const uint8_t* row_pointer(const WeightMatrix& w, int64_t row) {
  return static_cast<const uint8_t*>(w.data) + size_t(row) * size_t(w.cols) * dtype_size_bytes(w.dtype);
}

}  // namespace

void matmul(const float* x, int64_t n, const WeightMatrix& w, float* y, int threads) {
  if (w.dtype == DType::kF32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(w.rows), int(w.cols), 1.0f, x, int(w.cols),
                static_cast<const float*>(w.data), int(w.cols), 0.0f, y, int(w.rows));
    return;
  }
  if (n <= kMatVecMaxInputs) {
    // Decode-sized: read each half-precision weight once, widened in registers (memory-bound).
    const auto* weights = static_cast<const uint16_t*>(w.data);
    const int64_t blocks = (w.rows + kMatVecRows - 1) / kMatVecRows;
#pragma omp parallel for num_threads(threads) schedule(static) if (w.rows * w.cols >= kParallelElements)
    for (int64_t b = 0; b < blocks; ++b) {
      matvec_half(x, n, weights, w.dtype, w.rows, w.cols, b * kMatVecRows, std::min(w.rows, (b + 1) * kMatVecRows), y);
    }
    return;
  }
  const int64_t chunk_rows = std::max<int64_t>(16, kChunkElements / w.cols);
  thread_local std::vector<float> widened_buffer;  // the calling thread's; shared by the workers below
  widened_buffer.resize(size_t(std::min(chunk_rows, w.rows) * w.cols));
  float* widened = widened_buffer.data();
  for (int64_t row0 = 0; row0 < w.rows; row0 += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, w.rows - row0);
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * w.cols >= kParallelElements)
    for (int64_t r = 0; r < rows; ++r) {
      widen_to_f32(row_pointer(w, row0 + r), w.dtype, widened + size_t(r * w.cols), size_t(w.cols));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(rows), int(w.cols), 1.0f, x, int(w.cols),
                widened, int(w.cols), 0.0f, y + row0, int(w.rows));
  }
}

void matmul_reference(const float* x, int64_t n, const WeightMatrix& w, float* y) {
  std::vector<float> row(size_t(w.cols));
  for (int64_t o = 0; o < w.rows; ++o) {
    widen_to_f32(row_pointer(w, o), w.dtype, row.data(), size_t(w.cols));
    for (int64_t i = 0; i < n; ++i) {
      double acc = 0;
      for (int64_t c = 0; c < w.cols; ++c) acc += double(x[i * w.cols + c]) * double(row[size_t(c)]);
      y[i * w.rows + o] = float(acc);
    }
  }
}

}  // namespace slimkv
