// The transient 8-bit operands of HACK attention (§5.1): Q quantized per K partition and the softmax
// probabilities P quantized per V partition (one block), asymmetric, nearest rounding:
// x ≈ min + scale · x', x' in [0, 255]. Kernels and the reference quantize with this same code, so
// they see identical integers.
// KIVI's layouts (issue 28) fold the block's scales into them: U = q ∘ s per K token group, whose 8-bit
// range is taken from its factors' ranges, |q_d s_d| ≤ max|q| · max s, so that it needs no reduction
// over the products; W = p ∘ s ≥ 0 per V column group over [0, max w] (docs/hack.md).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace slimkv {

struct Operand8 {
  float min = 0.0f;
  float scale = 0.0f;
  int32_t sum = 0;  // Σ x' (the Σa' term of Eq. 4)
};

inline Operand8 quantize_operand8(const float* x, int n, uint8_t* codes) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  Operand8 op;
  op.min = lo;
  op.scale = (hi - lo) / 255.0f;
  const float inverse = op.scale > 0.0f ? 1.0f / op.scale : 0.0f;
  for (int i = 0; i < n; ++i) {
    const int code = std::clamp(int(std::lrint((x[i] - lo) * inverse)), 0, 255);
    codes[i] = uint8_t(code);
    op.sum += code;
  }
  return op;
}

// The factor that maps [-max, max] onto [-levels, levels]; 0 for a factor too small to matter (so
// levels / max stays finite).
inline float operand_factor(float max, float levels) { return max > 1e-30f ? levels / max : 0.0f; }

// The code of a product from its factors scaled by operand_factor: lrint(x̂ · ŷ) (nearest-even, as the
// vector kernels' conversion), in [-levels, levels] when |x̂|, |ŷ| are within their ranges.
inline int product_code(float x_hat, float y_hat) { return int(std::lrint(x_hat * y_hat)); }

// The step of U' codes from the factors' ranges: x · y ≈ step · code.
inline float product_step(float x_max, float y_max, float levels) { return x_max * y_max / levels; }

// U' levels (signed: q has both signs) and W' levels (w ≥ 0: unsigned, offset by -128 as P').
constexpr float kULevels = 127.0f, kWLevels = 255.0f;

}  // namespace slimkv
