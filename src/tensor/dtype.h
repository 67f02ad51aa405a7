// Element types of stored tensors (checkpoints, KV blocks). Compute on CPU is FP32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace slimkv {

enum class DType : uint8_t { kF32, kF16, kBF16 };

constexpr size_t dtype_size_bytes(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

// The name safetensors and our specs use: "F32", "F16", "BF16".
constexpr std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
  }
  return "?";
}

}  // namespace slimkv
