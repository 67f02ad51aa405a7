// Picks the next token from logits: greedy (temperature 0), or sampling with temperature, top-k and
// top-p (nucleus). A draw is counter_uniform(seed, position) (util/random.h), a function of the
// sequence's seed and the new token's position alone, as on the GPU (backend/cuda/sampling.h): a
// sequence samples the same tokens whatever runs beside it, and after a preemption.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "slimkv/engine.h"

namespace slimkv {

class Sampler {
 public:
  // The token at `position` (the index it takes in its sequence) drawn from logits [vocab].
  int32_t sample(std::span<const float> logits, const SamplingParams& params, int64_t position);

 private:
  std::vector<std::pair<float, int32_t>> candidates_;  // scratch, reused between calls
};

int32_t argmax(std::span<const float> logits);

}  // namespace slimkv
