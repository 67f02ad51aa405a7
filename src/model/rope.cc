#include "model/rope.h"

#include <cmath>
#include <numbers>

namespace slimkv {

Rope::Rope(const RopeConfig& rope, int head_dim) : head_dim_(head_dim) {
  const int half = head_dim_ / 2;
  inv_freq_.resize(size_t(half));
  for (int i = 0; i < half; ++i) {
    // transformers computes these in FP32; computing in FP64 and rounding once differs by < 1 ulp.
    double inv = 1.0 / std::pow(rope.theta, double(2 * i) / double(head_dim_));
    if (rope.type == RopeType::kLinear) inv /= rope.factor;
    if (rope.type == RopeType::kLlama3) {
      const double old_context = double(rope.original_max_position_embeddings);
      const double low_freq_wavelength = old_context / rope.low_freq_factor;
      const double high_freq_wavelength = old_context / rope.high_freq_factor;
      const double wavelength = 2.0 * std::numbers::pi / inv;
      if (wavelength > low_freq_wavelength) {
        inv /= rope.factor;
      } else if (wavelength >= high_freq_wavelength) {  // between the two: interpolate
        const double smooth = (old_context / wavelength - rope.low_freq_factor) /
                              (rope.high_freq_factor - rope.low_freq_factor);
        inv = (1.0 - smooth) * inv / rope.factor + smooth * inv;
      }
    }
    if (!rope.frequency_divisors.empty()) inv /= double(rope.frequency_divisors[size_t(i)]);
    inv_freq_[size_t(i)] = float(inv);
  }
}

void Rope::angles(int first_position, int n, std::vector<float>& cos, std::vector<float>& sin) const {
  const size_t half = inv_freq_.size();
  cos.resize(size_t(n) * half);
  sin.resize(size_t(n) * half);
  for (int t = 0; t < n; ++t) {
    for (size_t i = 0; i < half; ++i) {
      const float angle = float(first_position + t) * inv_freq_[i];  // an FP32 product, as transformers
      cos[size_t(t) * half + i] = float(std::cos(double(angle)));
      sin[size_t(t) * half + i] = float(std::sin(double(angle)));
    }
  }
}

void Rope::rotate(float* x, int n, int num_heads, const std::vector<float>& cos, const std::vector<float>& sin) const {
  const int half = head_dim_ / 2;
  for (int t = 0; t < n; ++t) {
    const float* c = cos.data() + size_t(t) * half;
    const float* s = sin.data() + size_t(t) * half;
    for (int h = 0; h < num_heads; ++h) {
      float* v = x + (size_t(t) * num_heads + h) * head_dim_;
      for (int i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

}  // namespace slimkv
