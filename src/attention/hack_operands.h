// The transient 8-bit operands of HACK attention (§5.1): Q quantized per K partition and the softmax
// probabilities P quantized per V partition (one block), asymmetric, nearest rounding:
// x ≈ min + scale · x', x' in [0, 255]. Kernels and the reference quantize with this same code, so
// they see identical integers.
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

}  // namespace slimkv
