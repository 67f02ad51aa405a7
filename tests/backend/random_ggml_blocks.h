// Random ggml blocks for the kernel tests: random code bytes, with the FP16 scales set to finite values of
// a realistic size (a random scale byte pair could be NaN or Inf).
#pragma once

#include <cstring>
#include <random>
#include <vector>

#include "tensor/ggml_type.h"
#include "util/half.h"

namespace slimkv::test {

inline void put_half(uint8_t* p, float value) {
  const uint16_t bits = float_to_fp16(value);
  std::memcpy(p, &bits, 2);
}

inline std::vector<uint8_t> random_blocks(BlockQuant quant, int64_t values, std::mt19937& rng) {
  const int64_t blocks = values / block_elements(quant);
  std::vector<uint8_t> bytes(size_t(blocks) * block_bytes(quant));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  for (uint8_t& b : bytes) b = uint8_t(byte(rng));
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* block = bytes.data() + size_t(b) * block_bytes(quant);
    switch (quant) {
      case BlockQuant::kQ8_0:
      case BlockQuant::kQ4_0: put_half(block, scale(rng)); break;
      case BlockQuant::kQ4_K: put_half(block, scale(rng)); put_half(block + 2, scale(rng)); break;
      case BlockQuant::kQ6_K: put_half(block + 208, scale(rng)); break;
      case BlockQuant::kNone: break;
    }
  }
  return bytes;
}

}  // namespace slimkv::test
