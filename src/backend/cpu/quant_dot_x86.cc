// The x86 tiers of quant_dot.h: quant_dot_x86-inl.h's row products compiled three times, each with its own
// target attributes (the rest of the binary stays portable; a tier runs only after
// quant_dot_tier_supported said yes) and its own DotU8S8.
#include <cstring>

#include "backend/cpu/quant_dot_tiers.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "hwy/base.h"  // HWY_PUSH_ATTRIBUTES: the target attributes of every function up to HWY_POP_ATTRIBUTES

namespace slimkv {

HWY_PUSH_ATTRIBUTES("avx,avx2,fma,f16c")
namespace avx2 {
// vpmaddubsw: pairs of u·s summed to 16 bits (saturating), then vpmaddwd by ones: pairs of those to 32.
inline __m256i DotU8S8(__m256i acc, __m256i u, __m256i s) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
constexpr bool kDotTakesAnyUnsignedByte = false;  // 255·127·2 > 32767
#include "backend/cpu/quant_dot_x86-inl.h"
}  // namespace avx2
HWY_POP_ATTRIBUTES

HWY_PUSH_ATTRIBUTES("avx,avx2,fma,f16c,avxvnni")
namespace avx_vnni {
inline __m256i DotU8S8(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
constexpr bool kDotTakesAnyUnsignedByte = true;
#include "backend/cpu/quant_dot_x86-inl.h"
}  // namespace avx_vnni
HWY_POP_ATTRIBUTES

HWY_PUSH_ATTRIBUTES("avx,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
namespace avx512_vnni {
inline __m256i DotU8S8(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
constexpr bool kDotTakesAnyUnsignedByte = true;
#include "backend/cpu/quant_dot_x86-inl.h"
}  // namespace avx512_vnni
HWY_POP_ATTRIBUTES

QuantDotKernels x86_quant_dot_kernels(QuantDotTier tier) {
  switch (tier) {
    case QuantDotTier::kAvx2: return {avx2::Quantize, avx2::MatVec};
    case QuantDotTier::kAvxVnni: return {avx_vnni::Quantize, avx_vnni::MatVec};
    case QuantDotTier::kAvx512Vnni: return {avx512_vnni::Quantize, avx512_vnni::MatVec};
    default: return {nullptr, nullptr};
  }
}

}  // namespace slimkv

#else  // not x86-64: no SIMD tier

namespace slimkv {

QuantDotKernels x86_quant_dot_kernels(QuantDotTier) { return {nullptr, nullptr}; }

}  // namespace slimkv

#endif
