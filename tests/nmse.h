// Normalized mean squared error of an output against its reference: Σ(a − b)² / Σb², in FP64. Shared by
// the tests that hold an approximate attention to a reference.
#pragma once

#include <vector>

namespace slimkv {

inline double nmse(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err += double(a[i] - b[i]) * (a[i] - b[i]);
    ref += double(b[i]) * b[i];
  }
  return err / ref;
}

}  // namespace slimkv
