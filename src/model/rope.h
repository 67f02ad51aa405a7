// Rotary position embeddings as Hugging Face's Llama computes them: the "rotate half" layout (dim i
// pairs with i + head_dim/2), inverse frequencies theta^(-2i/d), optionally rescaled: "linear" divides
// them all by `factor`, "llama3" only the long wavelengths (a smooth ramp between low_freq and high_freq).
#pragma once

#include <vector>

#include "model/model_config.h"

namespace slimkv {

class Rope {
 public:
  Rope(const RopeConfig& rope, int head_dim);

  const std::vector<float>& inverse_frequencies() const { return inv_freq_; }  // [head_dim / 2]

  // cos/sin of every frequency at positions first .. first + n - 1: each [n, head_dim / 2].
  void angles(int first_position, int n, std::vector<float>& cos, std::vector<float>& sin) const;

  // Rotates x [n, num_heads, head_dim] in place; token t uses row t of cos/sin.
  void rotate(float* x, int n, int num_heads, const std::vector<float>& cos, const std::vector<float>& sin) const;

 private:
  int head_dim_;
  std::vector<float> inv_freq_;
};

}  // namespace slimkv
