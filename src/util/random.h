// Seeded, portable randomness: the same numbers on every platform and compiler (the standard
// library's distributions are implementation-defined, so results seeded through them would not be).
#pragma once

#include <cstdint>

// These functions are also compiled for the GPU (CUDA kernels draw the same numbers).
#include "util/host_device.h"

namespace slimkv {

// splitmix64's finalizer: a bijective mix of 64 bits, the standard way to turn a counter (or any
// identity packed into 64 bits) into independent-looking random bits.
SLIMKV_HOST_DEVICE constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A uniform number in [0, 1) from a counter: reproducible stochastic rounding (tensor/quantized_block.h),
// the same on every backend.
SLIMKV_HOST_DEVICE constexpr float counter_uniform(uint64_t seed, uint64_t counter) {
  const uint64_t z = splitmix64(seed + 0x9e3779b97f4a7c15ull * counter);  // the counter-th draw from seed
  return float(z >> 40) * (1.0f / 16777216.0f);                          // 24 random bits
}

// The seed a KV store seals block `index` of (layer, head) with: splitmix64 of the block's identity,
// reproducible and independent between blocks; the CPU store and the GPU cache derive it alike.
SLIMKV_HOST_DEVICE constexpr uint64_t block_seal_seed(uint64_t store_seed, int layer, int head, int index) {
  return splitmix64(store_seed ^ (uint64_t(layer) << 40) ^ (uint64_t(head) << 24) ^ uint64_t(index));
}

// A stream of random numbers from a seed (the splitmix64 generator).
class SeededRng {
 public:
  explicit SeededRng(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    const uint64_t out = splitmix64(state_);
    state_ += 0x9e3779b97f4a7c15ull;
    return out;
  }
  // Uniform in [lo, hi]; the modulo bias (< 2^-32 for spans under 2^32) does not matter here.
  int64_t uniform_int(int64_t lo, int64_t hi) { return lo + int64_t(next() % uint64_t(hi - lo + 1)); }
  double uniform01() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }

 private:
  uint64_t state_;
};

}  // namespace slimkv
