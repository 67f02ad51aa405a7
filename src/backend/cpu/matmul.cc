#include "backend/cpu/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "backend/cpu/dequantize.h"
#include "backend/cpu/vec_ops.h"

namespace slimkv {
namespace {

// Up to this many inputs (a decode step of that many sequences), half-precision weights are multiplied in
// place, each row widened once in registers for all inputs, rather than widened for BLAS: the inputs'
// rows still fit L1/L2 beside the weight row, and each input gets the bits it would get alone.
constexpr int64_t kMatVecMaxInputs = 16;
// FP32 elements widened per BLAS call: large enough for efficient GEMM, small enough for L2/L3.
constexpr int64_t kChunkElements = int64_t(1) << 18;
// Weight elements per task: below this, handing work to another thread costs more than it saves.
constexpr int64_t kTaskElements = int64_t(1) << 17;

const uint8_t* row_pointer(const WeightMatrix& w, int64_t row) {
  return static_cast<const uint8_t*>(w.data) + size_t(row) * weight_row_bytes(w);
}

// y[:, row0 : row0 + rows] for all n inputs, on the calling thread.
void matmul_rows(const float* x, int64_t n, const WeightMatrix& w, int64_t row0, int64_t rows, float* y) {
  if (w.quant == BlockQuant::kNone && w.dtype == DType::kF32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(rows), int(w.cols), 1.0f, x, int(w.cols),
                reinterpret_cast<const float*>(row_pointer(w, row0)), int(w.cols), 0.0f, y + row0, int(w.rows));
    return;
  }
  if (n <= kMatVecMaxInputs && w.quant != BlockQuant::kNone) {
    matvec_quantized(x, n, w.data, w.quant, w.rows, w.cols, row0, row0 + rows, y);
    return;
  }
  if (n <= kMatVecMaxInputs) {
    matvec_half(x, n, reinterpret_cast<const uint16_t*>(w.data), w.dtype, w.rows, w.cols, row0, row0 + rows, y);
    return;
  }
  thread_local std::vector<float> widened;  // this thread's chunk of FP32 rows
  const int64_t chunk_rows = std::max<int64_t>(16, kChunkElements / w.cols);
  widened.resize(size_t(std::min(chunk_rows, rows) * w.cols));
  for (int64_t r0 = row0; r0 < row0 + rows; r0 += chunk_rows) {
    const int64_t count = std::min(chunk_rows, row0 + rows - r0);
    widen_rows(w, r0, count, widened.data());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(count), int(w.cols), 1.0f, x, int(w.cols),
                widened.data(), int(w.cols), 0.0f, y + r0, int(w.rows));
  }
}

}  // namespace

size_t weight_row_bytes(const WeightMatrix& w) {
  if (w.quant == BlockQuant::kNone) return size_t(w.cols) * dtype_size_bytes(w.dtype);
  return size_t(w.cols / block_elements(w.quant)) * block_bytes(w.quant);
}

void widen_rows(const WeightMatrix& w, int64_t row0, int64_t count, float* out) {
  if (w.quant == BlockQuant::kNone) {
    widen_to_f32(row_pointer(w, row0), w.dtype, out, size_t(count * w.cols));
  } else {
    dequantize(w.quant, row_pointer(w, row0), out, count * w.cols);
  }
}

void matmul(const float* x, int64_t n, const WeightMatrix& w, float* y, ThreadPool& pool) {
  static std::once_flag single_threaded_blas;
  std::call_once(single_threaded_blas, [] { openblas_set_num_threads(1); });
  // Split the output rows into tasks of at least kTaskElements weights, a few per thread.
  const int64_t by_size = std::max<int64_t>(1, w.rows * w.cols / kTaskElements);
  const int64_t tasks = std::min<int64_t>(by_size, 4 * pool.threads());
  const int64_t rows_per_task = (w.rows + tasks - 1) / tasks;
  pool.run(tasks, [&](int64_t task, int) {
    const int64_t row0 = task * rows_per_task;
    const int64_t rows = std::min(rows_per_task, w.rows - row0);
    if (rows > 0) matmul_rows(x, n, w, row0, rows, y);
  });
}

void matmul_reference(const float* x, int64_t n, const WeightMatrix& w, float* y) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t o = 0; o < w.rows; ++o) {
    if (w.quant == BlockQuant::kNone) {
      widen_to_f32(row_pointer(w, o), w.dtype, row.data(), size_t(w.cols));
    } else {
      dequantize_reference(w.quant, row_pointer(w, o), row.data(), w.cols);
    }
    for (int64_t i = 0; i < n; ++i) {
      double acc = 0;
      for (int64_t c = 0; c < w.cols; ++c) acc += double(x[i * w.cols + c]) * double(row[size_t(c)]);
      y[i * w.rows + o] = float(acc);
    }
  }
}

}  // namespace slimkv
