// Seeded, portable randomness: the same numbers on every platform and compiler (the standard
// library's distributions are implementation-defined, so results seeded through them would not be).
#pragma once

#include <cstdint>

namespace slimkv {

// splitmix64's finalizer: a bijective mix of 64 bits, the standard way to turn a counter (or any
// identity packed into 64 bits) into independent-looking random bits.
constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
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
