#include "backend/cpu/avx512_bf16_gemm.h"

#include <cstdlib>
#include <cstring>

#include "backend/cpu/bf16_gemm.h"

#if defined(SLIMKV_HAVE_AVX512_BF16)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace slimkv {

#if defined(SLIMKV_HAVE_AVX512_BF16)
namespace {

// Inputs per register tile: 8 inputs x 2 row halves = 16 FP32 sums, 2 weight vectors and the broadcast
// activations in the 32 vector registers. Each weight vector load feeds 16 vdpbf16ps and each broadcast 2;
// the sums' dependency chains (2 vdpbf16ps a pair, hi then lo) are 16 wide, enough to hide the latency.
// 8 also divides the 16 inputs of an A tile, so a register tile reads rows of one tile.
constexpr int64_t kTileInputs = 8;

// The BF16 pair x[2p], x[2p + 1] at `pair`, in all 16 lanes.
SLIMKV_AVX512_BF16_TARGET __m512bh broadcast_pair(const uint16_t* pair) {
  uint32_t bits;
  std::memcpy(&bits, pair, sizeof bits);
  return (__m512bh)_mm512_set1_epi32(int32_t(bits));
}

}  // namespace

bool avx512_bf16_available() {
  static const bool available = [] {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || eax < 1) return false;
    if (!__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) || !(eax >> 5 & 1)) return false;  // AVX512_BF16
    // __builtin_cpu_supports also checks that the OS saves the AVX-512 registers.
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  }();
  return available;
}

bool avx512_bf16_beats_fp32() {
  unsigned max_leaf, vendor[3];
  __cpuid(0, max_leaf, vendor[0], vendor[2], vendor[1]);  // the vendor string is in ebx, edx, ecx
  return std::memcmp(vendor, "AuthenticAMD", 12) == 0;
}

SLIMKV_AVX512_BF16_TARGET void avx512_bf16_block_product(const uint16_t* x, const uint16_t* panel, int64_t steps,
                                                         bool accumulate, float* c, int64_t c_stride) {
  constexpr int64_t kTile = 16 * kBf16StepDepth;  // BF16 of one A or B tile
  for (int64_t i0 = 0; i0 < kBf16Block; i0 += kTileInputs) {
    __m512 sums[kTileInputs][2];  // [input, rows 0-15 / 16-31]
    float* out = c + i0 * c_stride;
#pragma GCC unroll 8
    for (int64_t j = 0; j < kTileInputs; ++j) {
      for (int64_t half = 0; half < 2; ++half) {
        sums[j][half] = accumulate ? _mm512_loadu_ps(out + j * c_stride + 16 * half) : _mm512_setzero_ps();
      }
    }
    // Row i0 % 16 of the hi tile of the inputs' 16-row half; the lo tile follows it.
    const uint16_t* inputs = x + i0 / 16 * 2 * kTile + i0 % 16 * kBf16StepDepth;
    for (int64_t s = 0; s < steps; ++s) {
      const uint16_t* step_inputs = inputs + s * 4 * kTile;
      const uint16_t* step_weights = panel + s * 2 * kTile;
      for (int64_t pair = 0; pair < kBf16StepDepth / 2; ++pair) {
        const __m512bh low_rows = (__m512bh)_mm512_load_si512(step_weights + pair * 32);
        const __m512bh high_rows = (__m512bh)_mm512_load_si512(step_weights + kTile + pair * 32);
#pragma GCC unroll 8
        for (int64_t j = 0; j < kTileInputs; ++j) {
          const uint16_t* hi = step_inputs + j * kBf16StepDepth + 2 * pair;
          const __m512bh x_hi = broadcast_pair(hi), x_lo = broadcast_pair(hi + kTile);
          sums[j][0] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(sums[j][0], x_hi, low_rows), x_lo, low_rows);
          sums[j][1] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(sums[j][1], x_hi, high_rows), x_lo, high_rows);
        }
      }
    }
#pragma GCC unroll 8
    for (int64_t j = 0; j < kTileInputs; ++j) {
      for (int64_t half = 0; half < 2; ++half) _mm512_storeu_ps(out + j * c_stride + 16 * half, sums[j][half]);
    }
  }
}

#else  // not x86-64 Linux: avx512_bf16_available() is false and nothing else may be called

bool avx512_bf16_available() { return false; }
bool avx512_bf16_beats_fp32() { return false; }
void avx512_bf16_block_product(const uint16_t*, const uint16_t*, int64_t, bool, float*, int64_t) { std::abort(); }

#endif

}  // namespace slimkv
