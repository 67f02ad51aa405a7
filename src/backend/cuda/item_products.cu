#include "backend/cuda/item_products.h"

#include <algorithm>
#include <utility>

#include "backend/cuda/cuda_check.h"

namespace slimkv::cuda {

namespace {

// y[r, c] (+)= products[r, c] for r < rows, c < cols: a padded group's rows out of the scratch.
__global__ void copy_rows_out(const float* products, int64_t rows, int64_t cols, float* y, int64_t y_stride, bool accumulate) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  float* out = y + r * y_stride + c;
  *out = accumulate ? *out + products[i] : products[i];
}

}  // namespace

Expected<std::unique_ptr<ItemProducts>> ItemProducts::create(size_t max_cols, size_t max_rows) {
  std::unique_ptr<ItemProducts> products(new ItemProducts());
  SLIMKV_ASSIGN_OR_RETURN(products->inputs_,
                          DeviceArray<uint16_t>::allocate(size_t(kPlainGroupRows) * max_cols, "padded product inputs"));
  SLIMKV_ASSIGN_OR_RETURN(products->products_,
                          DeviceArray<float>::allocate(size_t(kPlainGroupRows) * max_rows, "padded products"));
  // The padding rows are never read out; zeros keep their products finite.
  SLIMKV_RETURN_IF_ERROR(device_fill_bytes(products->inputs_.data(), 0, products->inputs_.size() * sizeof(uint16_t)));
  return Expected<std::unique_ptr<ItemProducts>>(std::move(products));
}

Status ItemProducts::multiply(WeightGemm& gemm, const void* x, const std::vector<int>& item_rows, DType x_dtype,
                              const DeviceMatrix& w, float* y, bool accumulate, int64_t y_stride, PlainItems plain) {
  if (y_stride == 0) y_stride = w.rows;
  // Items of more rows than a group are products of their own (plain items alone: all of them).
  const int64_t group_rows = w.quantized()                         ? kQuantizedGemvMaxInputs
                             : plain == PlainItems::kPaddedGroups ? kPlainGroupRows
                                                                  : 0;
  const size_t row_bytes = size_t(w.cols) * sizeof(uint16_t);  // x is FP16 or BF16
  const auto* bytes = static_cast<const uint8_t*>(x);
  int64_t row = 0, group_first = 0, group_count = 0;
  const auto flush = [&]() -> Status {
    if (group_count == 0) return Status::ok();
    const Status done = multiply_group(gemm, bytes + size_t(group_first) * row_bytes, group_count, x_dtype, w,
                                       y + group_first * y_stride, accumulate, y_stride);
    group_count = 0;
    return done;
  };
  for (const int rows : item_rows) {
    if (rows > group_rows) {
      SLIMKV_RETURN_IF_ERROR(flush());
      SLIMKV_RETURN_IF_ERROR(gemm.multiply(bytes + size_t(row) * row_bytes, rows, x_dtype, w, y + row * y_stride, accumulate,
                                           y_stride));
    } else if (rows > 0) {
      if (group_count + rows > group_rows) SLIMKV_RETURN_IF_ERROR(flush());
      if (group_count == 0) group_first = row;
      group_count += rows;
    }
    row += rows;
  }
  return flush();
}

Status ItemProducts::multiply_group(WeightGemm& gemm, const void* x, int64_t count, DType x_dtype, const DeviceMatrix& w,
                                    float* y, bool accumulate, int64_t y_stride) {
  if (w.quantized()) return gemm.multiply(x, count, x_dtype, w, y, accumulate, y_stride);
  if (size_t(w.cols) * kPlainGroupRows > inputs_.size() || size_t(w.rows) * kPlainGroupRows > products_.size()) {
    return error("padded product of a [", w.rows, " x ", w.cols, "] matrix: over the scratch made for ",
                 inputs_.size() / kPlainGroupRows, " inputs and ", products_.size() / kPlainGroupRows, " outputs a row");
  }
  SLIMKV_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(inputs_.data(), x, size_t(count) * size_t(w.cols) * sizeof(uint16_t), cudaMemcpyDeviceToDevice));
  SLIMKV_RETURN_IF_ERROR(gemm.multiply(inputs_.data(), kPlainGroupRows, x_dtype, w, products_.data()));
  const int64_t values = count * w.rows;
  constexpr int kThreads = 256;
  copy_rows_out<<<unsigned((values + kThreads - 1) / kThreads), kThreads>>>(products_.data(), count, w.rows, y, y_stride,
                                                                           accumulate);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

}  // namespace slimkv::cuda
