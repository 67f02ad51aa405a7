// Matrix products with weights as checkpoints store them: y = x · Wᵀ with W [rows, cols] in F32, F16
// or BF16, or in ggml's quantized blocks (GGUF files: Q8_0, Q4_0, Q4_K, Q6_K), memory-mapped. The output rows are split into tasks on the thread pool:
//  - few inputs (decode): half-precision weights are multiplied in place, widened in registers
//    (memory-bound: each weight is read once); F32 weights go to BLAS;
//  - many inputs (prefill): half-precision rows are widened to FP32 a panel at a time (panel_gemm.h), so
//    a BF16 model never needs an FP32 copy of itself; BF16 weights go to the CPU's BF16 tier where it
//    has one (bf16_gemm.h: AMX tiles, else AVX-512 BF16 on AMD; the activations split into two BF16 parts,
//    FP32-close results);
//  - on AMX, BF16 weights packed into the tiles' layout (WeightMatrix::bf16_panels) go to the tiles for
//    any number of inputs (few: bf16_decode_gemm, many: bf16_gemm).
// Each path gives an input the same bits whatever other inputs share its call, but the few-input and
// many-input paths sum in different orders: a batch's items say which path each row takes (MatmulItems).
// Quantized weights stay in their blocks (a Q4_K model stays Q4_K in memory): for few inputs they are
// multiplied in integers with the inputs quantized to 8 bits once per call (quant_dot.h, as llama.cpp
// does; SLIMKV_QUANT_DOT=f32 takes the FP32 products instead), for many each row is dequantized where the
// half-precision ones are widened (backend/cpu/dequantize.h).
// BLAS runs single-threaded inside the tasks: all parallelism goes through the pool.
#pragma once

#include <cstdint>
#include <span>

#include "tensor/dtype.h"
#include "tensor/ggml_type.h"
#include "util/thread_pool.h"

namespace slimkv {

struct WeightMatrix {
  const void* data = nullptr;  // [rows, cols] row-major in dtype
  DType dtype = DType::kF32;  // when quant is kNone
  int64_t rows = 0;  // output features
  int64_t cols = 0;  // input features
  BlockQuant quant = BlockQuant::kNone;  // else each row is cols / block_elements(quant) blocks (GGUF)
  // BF16 weights where matmul takes the AMX tier: the same matrix packed once into the tiles' panel layout
  // (bf16_gemm.h bf16_pack_panels; the owner keeps it alive), which matmul then reads for every number of
  // inputs, decode included, so that each input gets the same bits whatever runs beside it; nullptr: `data`
  // alone. `data` stays for whatever reads rows (embedding lookup, widen_rows, the CUDA upload).
  const uint16_t* bf16_panels = nullptr;
};

// Whether matmul reads `w` packed (bf16_panels): BF16, not block-quantized, and this process's BF16 tier is
// AMX (where the decode product runs on the tiles too). Elsewhere packing would only cost memory.
bool takes_bf16_panels(const WeightMatrix& w);

size_t weight_row_bytes(const WeightMatrix& w);
// out[count, w.cols] = rows row0 .. row0 + count of W in FP32 (the fast kernels).
void widen_rows(const WeightMatrix& w, int64_t row0, int64_t count, float* out);

// Inputs up to this many take the few-input path (decode).
constexpr int64_t kMatmulFewInputs = 16;

// The rows of a batch's items (sequences), in row order, summing to n: each item's rows are multiplied on
// the path they would take alone — an item of at most kMatmulFewInputs rows (a decode token, a short
// prompt) on the few-input path, with the neighbouring such items up to that many rows a call, a longer
// one on the many-input path — so that a row's result never depends on the rows beside it (a served
// request's output equals its output alone). Empty: one item of all n rows.
using MatmulItems = std::span<const int>;

// y[n, w.rows] = x[n, w.cols] · Wᵀ
void matmul(const float* x, int64_t n, const WeightMatrix& w, float* y, ThreadPool& pool, MatmulItems items = {});

// Several products of one input in one pool loop: y_m[n, W_m.rows] = x · W_mᵀ for every (W_m, y_m). A
// decode step's q, k and v (or gate and up) are each a few hundred kilobytes of weights: a loop per
// product would keep the threads waiting for each other three times where once will do.
struct MatmulProduct {
  const WeightMatrix* w;
  float* y;
};
void matmul_shared_input(const float* x, int64_t n, std::span<const MatmulProduct> products, ThreadPool& pool,
                         MatmulItems items = {});

// Plain triple loop with FP64 accumulation over rows widened by the scalar references
// (dequantize_reference for quantized weights): the reference matmul is tested against.
void matmul_reference(const float* x, int64_t n, const WeightMatrix& w, float* y);

}  // namespace slimkv
