// Normal random test data, shared by the tests that quantize it (tensor/quantized_block, attention/hack).
#pragma once

#include <random>
#include <vector>

namespace slimkv {

inline std::vector<float> random_values(size_t n, std::mt19937& rng, float spread = 1.0f) {
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> x(n);
  for (float& e : x) e = normal(rng);
  return x;
}

}  // namespace slimkv
