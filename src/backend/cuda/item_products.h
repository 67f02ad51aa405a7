// Weight products of a step's rows that give each sequence's rows the bits they would get alone, so that a
// server's greedy output for a request equals the request run alone whatever else shares its steps
// (issue 22). cuBLAS chooses its kernel — tiles, split-K — by the number of rows, and a row's sums
// follow the kernel: the same decode row in a product of 1 row and of 9 can differ in the last bit,
// which greedy decoding (and a 2-bit codec's rounding) turns into another token.
//
// So a product's rows come as items, the rows of each sequence in the step, in order:
//   - an item of more than a group's rows (a prompt chunk) is a product of its own, of the same rows as
//     the sequence alone would run (the scheduler cuts prompts where `generate` does);
//   - items of up to a group's rows (decode rows, a short prompt's piece) run together, consecutive ones
//     in groups of at most a group's rows, each group a product of always the same shape: plain
//     matrices pad it to kPlainGroupRows rows (through scratch: the group's rows copied in, the first
//     rows of the product copied or added out), quantized ones take the matrix-vector kernel, whose sums
//     for one input do not depend on how many it is given (quantized_gemm.h), at up to
//     kQuantizedGemvMaxInputs.
// A row's result then depends on its own row alone (a GEMM's rows do not mix; within one kernel every row
// is summed alike), the kernel on the item's own size.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/quantized_gemm.h"
#include "slimkv/status.h"

namespace slimkv::cuda {

// The rows a padded group of plain-matrix products always has: decode batches up to it read the weights
// once (a memory-bound product costs about the same at 1 row and at 64).
inline constexpr int64_t kPlainGroupRows = 64;

// How a plain matrix multiplies items of up to kPlainGroupRows rows: in padded groups (a step's decode
// rows: one read of the weights for all of them), or each a product of its own rows, as any item of
// more (an MoE layer's experts: each expert's rows of each sequence, many small runs that padding
// would copy in and out one by one).
enum class PlainItems { kPaddedGroups, kAlone };

class ItemProducts {
 public:
  // The scratch holds a group's inputs of up to max_cols values and its products of up to max_rows.
  static Expected<std::unique_ptr<ItemProducts>> create(size_t max_cols, size_t max_rows);

  // y[r, :] (row stride y_stride, 0: w.rows) = x[r, :] · Wᵀ for the rows of every item (item_rows: each
  // item's rows, summing to x's; an item of 0 rows has none), or y += that when accumulate; as
  // WeightGemm::multiply, item by item.
  Status multiply(WeightGemm& gemm, const void* x, const std::vector<int>& item_rows, DType x_dtype, const DeviceMatrix& w,
                  float* y, bool accumulate = false, int64_t y_stride = 0, PlainItems plain = PlainItems::kPaddedGroups);

 private:
  ItemProducts() = default;
  // A group's count rows (x, y at its first), through the scratch (plain) or directly (quantized).
  Status multiply_group(WeightGemm& gemm, const void* x, int64_t count, DType x_dtype, const DeviceMatrix& w, float* y,
                        bool accumulate, int64_t y_stride);

  DeviceArray<uint16_t> inputs_;  // [kPlainGroupRows, max_cols] in the inputs' dtype
  DeviceArray<float> products_;   // [kPlainGroupRows, max_rows]
};

}  // namespace slimkv::cuda
