// Weight matrices on the GPU as a GGUF file stores them (issue 29): ggml's quantized blocks (Q8_0,
// Q4_0, Q4_K, Q6_K: tensor/ggml_type.h) stay blocks in GPU memory, so a Q4_K_M model takes the file's
// bytes there, not twice its parameters; and the one product every forward-pass GEMM goes through,
// y = x · Wᵀ, whatever W holds (plain FP16/BF16 rows or blocks).
//
// Device layout of a quantized matrix [rows, cols] (each row cols / block_elements blocks), in the
// file's bytes: the blocks' bodies, row after row, then (Q8_0, Q4_0, Q6_K) the FP16 scale `d` of every
// block in the same order. Moving d out leaves bodies of 32 (Q8_0), 16 (Q4_0) and 208 (Q6_K) bytes, all
// multiples of 16, so every body starts 16-byte aligned and is read in 16-byte loads; Q4_K's 144-byte
// blocks (d and dmin first) are already, and stay whole.
//
// The product, by the number of inputs n:
//   - n ≤ kQuantizedGemvMaxInputs (decode): a matrix-vector kernel, one warp per weight row (two rows
//     when n ≥ 2, so each input value read serves both), the weights dequantized in registers in FP32
//     and multiplied by the FP16/BF16 inputs widened to FP32, sums in FP32: no rounding of the
//     activations or the weights beyond what the file holds, the error is the FP32 summation's alone;
//   - more (prefill): tiles of weight rows dequantized into a bounded scratch in the inputs' dtype, then
//     a cuBLAS GEMM per tile, as widened weights would have been (the error is the weights' rounding to
//     FP16/BF16 and cuBLAS's FP32 sums).
// The plain reference the kernels are held to: the CPU's dequantize_reference and an FP64 product
// (backend/cpu/matmul.h matmul_reference).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/gemm.h"
#include "slimkv/status.h"
#include "tensor/dtype.h"
#include "tensor/ggml_type.h"

namespace slimkv::cuda {

// Inputs up to which the product runs the matrix-vector kernel (decode batches) instead of cuBLAS tiles.
inline constexpr int64_t kQuantizedGemvMaxInputs = 8;

// A weight matrix W [rows, cols] on the device: plain rows in dtype (kF16/kBF16), or blocks of `quant`
// in the device layout above (`data` its bodies, `scales` the split-out FP16 scales or nullptr for Q4_K).
// The pointers are into memory its holder owns (a model's weight arena, a test's arrays).
struct DeviceMatrix {
  void* data = nullptr;
  uint16_t* scales = nullptr;
  DType dtype = DType::kF16;  // when quant is kNone
  BlockQuant quant = BlockQuant::kNone;
  int64_t rows = 0;
  int64_t cols = 0;

  bool quantized() const { return quant != BlockQuant::kNone; }
  // Rows [first, first + count) of this matrix, as a matrix of their own (no copy).
  DeviceMatrix row_range(int64_t first, int64_t count) const;
};

// Ok when a [rows, cols] matrix of `quant` can be held and multiplied: each row whole blocks. Else an
// error naming the tensor, its type and the multiple its rows must be.
Status check_quantized_shape(std::string_view tensor, BlockQuant quant, int64_t rows, int64_t cols);

// Bytes of a [rows, cols] matrix of `quant` in the device layout (the file's bytes).
size_t quantized_matrix_bytes(BlockQuant quant, int64_t rows, int64_t cols);

// The matrix whose device layout starts at `device` (quantized_matrix_bytes of it, 16-byte aligned).
DeviceMatrix quantized_matrix_at(void* device, BlockQuant quant, int64_t rows, int64_t cols);

// Copies `file_blocks` (to.rows · to.cols / block_elements blocks of to.quant as GGUF stores them, on
// the host) into the quantized matrix `to` (whole, or a row_range of one), a bounded slice at a time.
Status upload_quantized(const void* file_blocks, const DeviceMatrix& to);

// Random blocks filling the quantized matrix `to` on the GPU, for random-weight models at shapes not at
// hand: every code a hash of (seed, byte), the scales chosen so that |w| ≤ amplitude and w spreads over
// a good part of that range (products of unit variance within a small factor, as fill_random_fp16's
// uniform values). The same seed gives the same blocks.
Status fill_random_quantized(const DeviceMatrix& to, uint64_t seed, float amplitude);

// out[r, :] = row rows[r] of w (rows: device ids; nullptr: row first + r) dequantized to FP32, times
// `scale`, for r < count (the embedding lookup of a quantized token_embd; Gemma's √hidden as scale).
// out_dtype kF32, kF16 or kBF16 (the tiles of the product).
Status dequantize_rows(const DeviceMatrix& w, const int32_t* rows, int64_t first, int64_t count, float scale, void* out,
                       DType out_dtype);

// y = x · Wᵀ for every kind of W (plain: cuBLAS; quantized: as the header says), owning cuBLAS's handle
// and the prefill tiles' scratch.
class WeightGemm {
 public:
  // scratch_bytes: the dequantized tiles' buffer (prefill of quantized weights); a product whose
  // matrix's row does not fit in it is refused. 0 for models without quantized matrices.
  static Expected<std::unique_ptr<WeightGemm>> create(size_t scratch_bytes);

  // y[n, :] (row stride y_stride, 0: w.rows) = x[n, w.cols] · Wᵀ, or y += that when accumulate. x in
  // x_dtype (kF16/kBF16; a plain W must be of the same dtype), y FP32.
  Status multiply(const void* x, int64_t n, DType x_dtype, const DeviceMatrix& w, float* y, bool accumulate = false,
                  int64_t y_stride = 0);

  size_t scratch_bytes() const { return scratch_.bytes(); }

 private:
  WeightGemm() = default;
  std::unique_ptr<CublasGemm> cublas_;
  DeviceArray<uint16_t> scratch_;
};

// The matrix-vector kernel alone (any n ≥ 1, for the tests: WeightGemm calls it up to
// kQuantizedGemvMaxInputs inputs).
Status quantized_gemv(const void* x, int64_t n, DType x_dtype, const DeviceMatrix& w, float* y, bool accumulate,
                      int64_t y_stride);

}  // namespace slimkv::cuda
