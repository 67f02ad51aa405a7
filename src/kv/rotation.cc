#include "kv/rotation.h"

#include <cmath>

namespace slimkv {
namespace {

// The fast Walsh–Hadamard transform of a power-of-two length, scaled to be orthonormal.
void walsh_hadamard(float* x, int n) {
  for (int half = 1; half < n; half *= 2) {
    for (int start = 0; start < n; start += 2 * half) {
      for (int i = start; i < start + half; ++i) {
        const float a = x[i], b = x[i + half];
        x[i] = a + b;
        x[i + half] = a - b;
      }
    }
  }
  const float scale = 1.0f / std::sqrt(float(n));
  for (int i = 0; i < n; ++i) x[i] *= scale;
}

}  // namespace

void hadamard_rotate(float* x, int n) {
  int done = 0;
  for (int chunk = 1 << 30; chunk >= 1; chunk /= 2) {  // largest power-of-two chunks first
    while (n - done >= chunk) {
      walsh_hadamard(x + done, chunk);
      done += chunk;
    }
  }
}

}  // namespace slimkv
