// Finding NaN/Inf in stored tensors, on the raw bits, so that broken weights are refused at load
// rather than turned into garbage text with exit code 0.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace slimkv {

// The index of the first NaN or ±Inf among `count` elements of `dtype` at `data`, or -1 when all are
// finite. Reads every element once (memory-bound: about the cost of paging the weights in).
int64_t first_non_finite(const uint8_t* data, DType dtype, size_t count);

// "NaN", "+Inf" or "-Inf" for the element at `index` (which first_non_finite found).
const char* non_finite_name(const uint8_t* data, DType dtype, size_t index);

}  // namespace slimkv
