#include "backend/cpu/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "backend/cpu/bf16_gemm.h"
#include "backend/cpu/dequantize.h"
#include "backend/cpu/panel_gemm.h"
#include "backend/cpu/quant_dot.h"
#include "backend/cpu/vec_ops.h"

namespace slimkv {
namespace {

// Up to kMatmulFewInputs inputs (a decode step of that many sequences), half-precision weights are
// multiplied in place, widened in registers (vec_ops.h matvec_half: memory-bound, each weight read once,
// each input with the bits it would get alone); F32 weights go to BLAS an input at a time. More inputs
// (prefill) go to panel_gemm.
static_assert(kBf16DecodeMaxInputs == kMatmulFewInputs, "the few-input paths must agree on few");
// Multiply-adds per task (weights x inputs): below this, handing work to another thread costs more than it
// saves. 2^15 (64 KB of half-precision weights for one input, a few µs) splits even a decode step's
// smallest products over the threads (the pool's workers spin between loops): decode of the bundled model
// +15-25% over 2^17 with q/k/v and gate/up in one loop each (matmul_shared_input), 2 threads.
constexpr int64_t kTaskMultiplyAdds = int64_t(1) << 15;
// Block-quantized weights (GGUF) for many inputs: FP32 elements dequantized per BLAS call, large enough
// for an efficient GEMM, small enough for L2/L3.
constexpr int64_t kChunkElements = int64_t(1) << 18;

const uint8_t* row_pointer(const WeightMatrix& w, int64_t row) {
  return static_cast<const uint8_t*>(w.data) + size_t(row) * weight_row_bytes(w);
}

// BF16 weights for many inputs go to the CPU's BF16 tier where it has one (bf16_gemm.h: AMX, else
// AVX-512 BF16 on AMD CPUs); packed ones (AMX) for any number.
bool takes_bf16_tier(const WeightMatrix& w, int64_t n) {
  return w.bf16_panels != nullptr || (n > kMatmulFewInputs && w.quant == BlockQuant::kNone &&
                                      w.dtype == DType::kBF16 && bf16_gemm_tier() != Bf16GemmTier::kNone);
}

// Quantized weights for few inputs (decode) are multiplied in integers with the inputs rounded to 8 bits
// (quant_dot.h), unless SLIMKV_QUANT_DOT=f32 asks for the FP32 products on widened rows.
bool takes_quant_dot(const WeightMatrix& w, int64_t n) {
  return n <= kMatmulFewInputs && w.quant != BlockQuant::kNone && quant_dot_tier() != QuantDotTier::kF32;
}

// y[:, row0 : row0 + rows] for all n inputs, on the calling thread; split: x split for the BF16 tier when
// takes_bf16_tier(w, n); quantized: x quantized when takes_quant_dot(w, n).
void matmul_rows(const float* x, int64_t n, const WeightMatrix& w, int64_t row0, int64_t rows, float* y,
                 const Bf16SplitActivations& split, const QuantizedActivations& quantized) {
  if (w.bf16_panels != nullptr && n <= kBf16DecodeMaxInputs) {
    bf16_decode_gemm(split, w.bf16_panels, w.rows, row0, row0 + rows, y);
  } else if (takes_bf16_tier(w, n)) {
    bf16_gemm(bf16_gemm_tier(), split, static_cast<const uint16_t*>(w.data), w.bf16_panels, w.rows, row0, row0 + rows,
              y);
  } else if (takes_quant_dot(w, n)) {
    matvec_quant_dot(quant_dot_tier(), quantized, w.data, w.quant, w.rows, row0, row0 + rows, y);
  } else if (w.quant != BlockQuant::kNone && n <= kMatmulFewInputs) {
    matvec_quantized(x, n, w.data, w.quant, w.rows, w.cols, row0, row0 + rows, y);
  } else if (w.quant != BlockQuant::kNone) {
    thread_local std::vector<float> widened;  // this thread's chunk of dequantized rows
    const int64_t chunk_rows = std::max<int64_t>(16, kChunkElements / w.cols);
    widened.resize(size_t(std::min(chunk_rows, rows) * w.cols));
    for (int64_t r0 = row0; r0 < row0 + rows; r0 += chunk_rows) {
      const int64_t count = std::min(chunk_rows, row0 + rows - r0);
      widen_rows(w, r0, count, widened.data());
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(count), int(w.cols), 1.0f, x, int(w.cols),
                  widened.data(), int(w.cols), 0.0f, y + r0, int(w.rows));
    }
  } else if (n > kMatmulFewInputs) {
    panel_gemm(x, n, w.data, w.dtype, w.rows, w.cols, row0, row0 + rows, y);
  } else if (w.dtype == DType::kF32) {
    // An input at a time: BLAS's products of a few inputs sum in an order that depends on how many.
    for (int64_t i = 0; i < n; ++i) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, int(rows), int(w.cols), 1.0f,
                  reinterpret_cast<const float*>(row_pointer(w, row0)), int(w.cols), x + i * w.cols, 1, 0.0f,
                  y + i * w.rows + row0, 1);
    }
  } else {
    matvec_half(x, n, static_cast<const uint16_t*>(w.data), w.dtype, w.rows, w.cols, row0, row0 + rows, y);
  }
}

}  // namespace

bool takes_bf16_panels(const WeightMatrix& w) {
  return w.quant == BlockQuant::kNone && w.dtype == DType::kBF16 && bf16_gemm_tier() == Bf16GemmTier::kAmx;
}

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

namespace {

// Every product for n inputs that take one path together.
void multiply_together(const float* x, int64_t n, std::span<const MatmulProduct> products, ThreadPool& pool) {
  static std::once_flag single_threaded_blas;
  std::call_once(single_threaded_blas, [] { openblas_set_num_threads(1); });
  // Each product's output rows split into tasks of at least kTaskMultiplyAdds, a few per thread, whole
  // panels each (panel_gemm.h) so that only a matrix's last panel is partial; the tasks of all products
  // numbered one after the other.
  struct Split {
    int64_t first_task, rows_per_task;
  };
  thread_local std::vector<Split> splits;
  splits.clear();
  int64_t tasks = 0;
  for (const MatmulProduct& product : products) {
    const WeightMatrix& w = *product.w;
    const int64_t by_size = std::max<int64_t>(1, w.rows * w.cols * n / kTaskMultiplyAdds);
    const int64_t panels = (w.rows + kPanelRowsMultiple - 1) / kPanelRowsMultiple;
    const int64_t count = std::min({by_size, 4 * int64_t(pool.threads()), panels});
    splits.push_back({tasks, (w.rows + count * kPanelRowsMultiple - 1) / (count * kPanelRowsMultiple) * kPanelRowsMultiple});
    tasks += count;
  }
  const std::vector<Split>& split = splits;  // the caller's: a worker's thread_local is another vector
  // The products share x: split it for the BF16 tier once, a block of inputs per task.
  thread_local Bf16SplitActivations split_inputs;
  Bf16SplitActivations& split_x = split_inputs;  // the caller's, as above
  if (std::any_of(products.begin(), products.end(),
                  [&](const MatmulProduct& p) { return takes_bf16_tier(*p.w, n); })) {
    bf16_split_prepare(n, products[0].w->cols, split_x);
    constexpr int64_t kInputsPerTask = 32;
    if (n <= kInputsPerTask) {  // a decode step's: less work than handing it to the pool
      bf16_split_rows(x, 0, n, split_x);
    } else {
      pool.run((n + kInputsPerTask - 1) / kInputsPerTask, [&](int64_t task, int) {
        bf16_split_rows(x, task * kInputsPerTask, std::min(n, (task + 1) * kInputsPerTask), split_x);
      });
    }
  }
  // And quantize it once for the integer products.
  thread_local QuantizedActivations quantized_inputs;
  QuantizedActivations& quantized_x = quantized_inputs;  // the caller's, as above
  if (std::any_of(products.begin(), products.end(), [&](const MatmulProduct& p) { return takes_quant_dot(*p.w, n); })) {
    quantize_activations(quant_dot_tier(), x, n, products[0].w->cols, quantized_x);
  }
  pool.run(tasks, [&](int64_t task, int) {
    size_t m = 0;
    while (m + 1 < split.size() && split[m + 1].first_task <= task) ++m;
    const WeightMatrix& w = *products[m].w;
    const int64_t row0 = (task - split[m].first_task) * split[m].rows_per_task;
    const int64_t rows = std::min(split[m].rows_per_task, w.rows - row0);
    if (rows > 0) matmul_rows(x, n, w, row0, rows, products[m].y, split_x, quantized_x);
  });
}

struct RowRun {
  int64_t first, n;
};

// Consecutive rows that take one path together: neighbouring long items, or neighbouring short ones up to
// kMatmulFewInputs rows. Into `runs` (the caller's, reused: this runs for every product of every step).
void row_runs(MatmulItems items, std::vector<RowRun>& runs) {
  runs.clear();
  bool few = false;
  int64_t first = 0;
  for (const int item : items) {
    const bool item_few = item <= kMatmulFewInputs;
    const bool joins = !runs.empty() && few == item_few && (!few || runs.back().n + item <= kMatmulFewInputs);
    if (joins) {
      runs.back().n += item;
    } else if (item > 0) {
      runs.push_back({first, item});
      few = item_few;
    }
    first += item;
  }
}

}  // namespace

void matmul(const float* x, int64_t n, const WeightMatrix& w, float* y, ThreadPool& pool, MatmulItems items) {
  const MatmulProduct product{&w, y};
  matmul_shared_input(x, n, {&product, 1}, pool, items);
}

void matmul_shared_input(const float* x, int64_t n, std::span<const MatmulProduct> products, ThreadPool& pool,
                         MatmulItems items) {
  thread_local std::vector<RowRun> runs;
  if (!items.empty()) row_runs(items, runs);
  if (items.empty() || runs.size() == 1) return multiply_together(x, n, products, pool);
  thread_local std::vector<MatmulProduct> at;  // each product's rows of the run
  at.assign(products.begin(), products.end());
  const int64_t cols = products[0].w->cols;
  for (const RowRun& run : runs) {
    for (size_t m = 0; m < products.size(); ++m) at[m].y = products[m].y + run.first * products[m].w->rows;
    multiply_together(x + run.first * cols, run.n, at, pool);
  }
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
