// IEEE half (FP16) and bfloat16 <-> float conversions, round-to-nearest-even, for storage formats.
// Bulk conversion in hot paths uses the SIMD kernels in backend/cpu; these are the scalar definitions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace slimkv {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN (quiet)
  u += 0x7fffu + ((u >> 16) & 1u);                                           // round to nearest even
  return uint16_t(u >> 16);
}

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));  // inf / NaN
  if (exponent == 0) {                                                              // zero / subnormal
    return bits_float(sign) + (sign ? -1.0f : 1.0f) * float(mantissa) * 5.9604644775390625e-8f;
  }
  return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline uint16_t float_to_fp16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (magnitude < 0x38800000u) {                        // below the smallest normal: subnormal or zero
    // Scale so the subnormal step (2^-24) is 1.0, round to nearest even by float addition.
    const float scaled = bits_float(magnitude) * 16777216.0f;
    return sign | uint16_t(std::nearbyint(scaled));
  }
  uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);  // round to nearest even at bit 13
  return sign | uint16_t((rounded - (112u << 23)) >> 13);
}

}  // namespace slimkv
