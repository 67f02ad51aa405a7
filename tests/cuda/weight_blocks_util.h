// Random weight matrices as a GGUF file stores them and random GEMM inputs, shared by the tests of the
// quantized GEMV (quantized_gemm_test.cc) and of the experts' grouped GEMV (expert_gemv_test.cc).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/ggml_type.h"
#include "util/half.h"

namespace slimkv::cuda {

// A [rows, cols] matrix as a GGUF file stores it: random codes (every byte), and FP16 scales d (and
// Q4_K's dmin) drawn in [1e-3, 2e-2], finite as a real file's.
inline std::vector<uint8_t> random_blocks(BlockQuant quant, int64_t rows, int64_t cols, std::mt19937& rng) {
  const size_t blocks = size_t(rows * cols / block_elements(quant)), bytes = block_bytes(quant);
  std::vector<uint8_t> data(blocks * bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : data) b = uint8_t(byte(rng));
  std::uniform_real_distribution<float> scale(1e-3f, 2e-2f);
  const auto set_half = [&](uint8_t* at) {
    const uint16_t bits = float_to_fp16(scale(rng));
    std::memcpy(at, &bits, 2);
  };
  for (size_t b = 0; b < blocks; ++b) {
    uint8_t* block = data.data() + b * bytes;
    set_half(block + (quant == BlockQuant::kQ6_K ? 208 : 0));
    if (quant == BlockQuant::kQ4_K) set_half(block + 2);
  }
  return data;
}

// `count` normal values times `stddev` rounded to dtype (kF16/kBF16): bits for the GPU, their values for
// the reference.
inline std::vector<uint16_t> random_inputs(size_t count, DType dtype, std::mt19937& rng, std::vector<float>& values,
                                           float stddev = 1.0f) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<uint16_t> bits(count);
  values.resize(count);
  for (size_t i = 0; i < count; ++i) {
    const float v = normal(rng);
    bits[i] = dtype == DType::kBF16 ? float_to_bf16(v) : float_to_fp16(v);
    values[i] = dtype == DType::kBF16 ? bf16_to_float(bits[i]) : fp16_to_float(bits[i]);
  }
  return bits;
}

}  // namespace slimkv::cuda
