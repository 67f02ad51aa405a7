// Picks the next token from logits: greedy (temperature 0), or sampling with temperature, top-k and
// top-p (nucleus), seeded so that a run can be repeated.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace slimkv {

struct SamplerConfig {
  float temperature = 0.0f;  // 0: greedy (argmax)
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;        // 1: no limit
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerConfig& config) : config_(config), rng_(config.seed) {}
  int32_t sample(std::span<const float> logits);

 private:
  SamplerConfig config_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

int32_t argmax(std::span<const float> logits);

}  // namespace slimkv
