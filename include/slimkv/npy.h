// NumPy .npy files (format 1.0) of little-endian float32: what `slimkv logits` writes and what the
// golden files hold.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "slimkv/status.h"

namespace slimkv {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

Status write_npy_f32(const std::string& path, const float* values, const std::vector<int64_t>& shape);
// Reads a C-order '<f4' array; other dtypes or Fortran order are refused with a message.
Expected<NpyArray> read_npy_f32(const std::string& path);

}  // namespace slimkv
