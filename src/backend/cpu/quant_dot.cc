#include "backend/cpu/quant_dot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "backend/cpu/quant_dot_tiers.h"
#include "util/half.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace slimkv {
namespace {

constexpr QuantDotTier kTiers[] = {QuantDotTier::kF32, QuantDotTier::kScalar, QuantDotTier::kAvx2,
                                   QuantDotTier::kAvxVnni, QuantDotTier::kAvx512Vnni};

float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return fp16_to_float(bits);
}

// ---- the portable tier: each format's integer sums in plain loops, scaled as the SIMD tiers scale them ----

// Σ a[i]·b[i] over `count` values.
template <class A>
int32_t dot_i8(const A* a, const int8_t* b, int count) {
  int32_t sum = 0;
  for (int i = 0; i < count; ++i) sum += int32_t(a[i]) * int32_t(b[i]);
  return sum;
}

// One input row times one weight row of `blocks` ggml blocks.
struct ScalarRows {
  static float q8_0(const uint8_t* w, const InputRow& x, int64_t blocks) {
    const int8_t* q = x.q;
    float acc = 0;
    for (int64_t b = 0; b < blocks; ++b, w += 34, q += 32) {
      acc += float(dot_i8(reinterpret_cast<const int8_t*>(w + 2), q, 32)) * (half_at(w) * x.scales[b]);
    }
    return acc;
  }

  static float q4_0(const uint8_t* w, const InputRow& x, int64_t blocks) {
    const int8_t* q = x.q;
    float acc = 0;
    for (int64_t b = 0; b < blocks; ++b, w += 18, q += 32) {
      int8_t codes[32];  // nibble - 8: values 0..15 in the low nibbles, 16..31 in the high ones
      for (int i = 0; i < 16; ++i) {
        codes[i] = int8_t((w[2 + i] & 15) - 8);
        codes[i + 16] = int8_t((w[2 + i] >> 4) - 8);
      }
      acc += float(dot_i8(codes, q, 32)) * (half_at(w) * x.scales[b]);
    }
    return acc;
  }

  // x = d·sc·q - dmin·m per 32 values: Σ x·(d_x·q_x) = d·sc·d_x·Σ q·q_x - dmin·m·(d_x·Σ q_x).
  static float q4_k(const uint8_t* w, const InputRow& x, int64_t superblocks) {
    const int8_t* q = x.q;
    const float* scales = x.scales;
    const float* sums = x.scaled_sums;
    float acc = 0, minimum = 0;
    for (int64_t s = 0; s < superblocks; ++s, w += 144) {
      const float d = half_at(w), dmin = half_at(w + 2);
      float block_minimum = 0;
      for (int sub = 0; sub < 8; ++sub, q += 32, ++scales, ++sums) {
        const uint8_t* qs = w + 16 + 32 * (sub / 2);
        uint8_t codes[32];
        for (int i = 0; i < 32; ++i) codes[i] = sub % 2 ? qs[i] >> 4 : qs[i] & 15;
        int scale, min;
        q4_k_scale_min(w + 4, sub, &scale, &min);
        acc += float(dot_i8(codes, q, 32)) * (d * float(scale) * *scales);
        block_minimum += float(min) * *sums;
      }
      minimum += dmin * block_minimum;
    }
    return acc - minimum;
  }

  // Per 32 values (a run), two sub-blocks of 16 with their own int8 scale: d·d_x·(sc_a·Σ_a + sc_b·Σ_b).
  static float q6_k(const uint8_t* w, const InputRow& x, int64_t superblocks) {
    const int8_t* q = x.q;
    const float* scales = x.scales;
    float acc = 0;
    for (int64_t s = 0; s < superblocks; ++s, w += 210) {
      const auto* sub_scales = reinterpret_cast<const int8_t*>(w + 192);
      const float d = half_at(w + 208);
      for (int half = 0; half < 2; ++half) {
        const uint8_t* ql = w + 64 * half;
        const uint8_t* qh = w + 128 + 32 * half;
        for (int run = 0; run < 4; ++run, q += 32, ++scales) {
          int8_t codes[32];
          for (int l = 0; l < 32; ++l) {
            const uint8_t low = ql[l + 32 * (run % 2)];
            codes[l] = int8_t(((run < 2 ? low & 15 : low >> 4) | (((qh[l] >> (2 * run)) & 3) << 4)) - 32);
          }
          const int32_t sum = sub_scales[8 * half + 2 * run] * dot_i8(codes, q, 16) +
                              sub_scales[8 * half + 2 * run + 1] * dot_i8(codes + 16, q + 16, 16);
          acc += float(sum) * (d * *scales);
        }
      }
    }
    return acc;
  }
};

#if defined(__x86_64__)
bool cpu_has_avx_vnni() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax >> 4 & 1);
}

bool cpu_has_avx512_vnni() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ecx >> 11 & 1);
}
#endif

// The tier SLIMKV_QUANT_DOT names where this CPU supports it; else the best supported one.
QuantDotTier choose_tier() {
  if (const char* value = std::getenv("SLIMKV_QUANT_DOT"); value != nullptr && *value != '\0') {
    const auto named = std::find_if(std::begin(kTiers), std::end(kTiers),
                                    [&](QuantDotTier tier) { return std::string_view(value) == quant_dot_tier_name(tier); });
    if (named == std::end(kTiers)) {
      std::fprintf(stderr, "SLIMKV_QUANT_DOT=%s: expected f32, scalar, avx2, avx-vnni or avx512-vnni; ignored\n", value);
    } else if (!quant_dot_tier_supported(*named)) {
      std::fprintf(stderr, "SLIMKV_QUANT_DOT=%s: this CPU lacks that tier; ignored\n", value);
    } else {
      return *named;
    }
  }
  for (const QuantDotTier tier : {QuantDotTier::kAvx512Vnni, QuantDotTier::kAvxVnni, QuantDotTier::kAvx2}) {
    if (quant_dot_tier_supported(tier)) return tier;
  }
  return QuantDotTier::kScalar;
}

}  // namespace

void quantize_activations(QuantDotTier tier, const float* x, int64_t n, int64_t cols, QuantizedActivations& out) {
  const int64_t blocks = n * cols / kActivationBlock;
  out.n = n;
  out.cols = cols;
  out.q.resize(size_t(n * cols));
  out.scales.resize(size_t(blocks));
  out.scaled_sums.resize(size_t(blocks));
  out.scaled_sums16.resize(size_t(2 * blocks));
  if (const QuantDotKernels simd = x86_quant_dot_kernels(tier); simd.quantize != nullptr) {
    simd.quantize(x, blocks, out);
    return;
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const float* in = x + b * kActivationBlock;
    int8_t* q = out.q.data() + b * kActivationBlock;
    float amax = 0;
    for (int64_t i = 0; i < kActivationBlock; ++i) amax = std::max(amax, std::fabs(in[i]));
    const float d = amax / 127.0f, inverse = d != 0 ? 1.0f / d : 0.0f;
    int32_t sums[2] = {0, 0};  // of each 16
    for (int64_t i = 0; i < kActivationBlock; ++i) {
      q[i] = int8_t(std::nearbyint(in[i] * inverse));
      sums[i / 16] += q[i];
    }
    const float scale = d <= kMaxHalf ? fp16_to_float(float_to_fp16(d)) : d;
    out.scales[size_t(b)] = scale;
    out.scaled_sums[size_t(b)] = scale * float(sums[0] + sums[1]);
    out.scaled_sums16[size_t(2 * b)] = scale * float(sums[0]);
    out.scaled_sums16[size_t(2 * b + 1)] = scale * float(sums[1]);
  }
}

const char* quant_dot_tier_name(QuantDotTier tier) {
  switch (tier) {
    case QuantDotTier::kF32: return "f32";
    case QuantDotTier::kScalar: return "scalar";
    case QuantDotTier::kAvx2: return "avx2";
    case QuantDotTier::kAvxVnni: return "avx-vnni";
    case QuantDotTier::kAvx512Vnni: return "avx512-vnni";
  }
  return "?";
}

bool quant_dot_tier_supported(QuantDotTier tier) {
  switch (tier) {
    case QuantDotTier::kF32:
    case QuantDotTier::kScalar: return true;
#if defined(__x86_64__)
    // __builtin_cpu_supports also checks that the OS saves the registers.
    case QuantDotTier::kAvx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case QuantDotTier::kAvxVnni: return quant_dot_tier_supported(QuantDotTier::kAvx2) && cpu_has_avx_vnni();
    case QuantDotTier::kAvx512Vnni:
      return quant_dot_tier_supported(QuantDotTier::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && cpu_has_avx512_vnni();
#else
    default: return false;
#endif
  }
  return false;
}

QuantDotTier quant_dot_tier() {
  static const QuantDotTier tier = choose_tier();
  return tier;
}

void matvec_quant_dot(QuantDotTier tier, const QuantizedActivations& x, const void* w, BlockQuant quant, int64_t rows,
                      int64_t row_begin, int64_t row_end, float* y) {
  if (tier == QuantDotTier::kScalar) {
    matvec_by_rows<ScalarRows>(x, w, quant, rows, row_begin, row_end, y);
  } else if (const QuantDotKernels simd = x86_quant_dot_kernels(tier); simd.matvec != nullptr) {
    simd.matvec(x, w, quant, rows, row_begin, row_end, y);
  } else {
    std::abort();  // kF32 is matmul's other path, never this function's
  }
}

void matvec_quant_dot_reference(const QuantizedActivations& x, const void* w, BlockQuant quant, int64_t rows,
                                float* y) {
  const size_t row_bytes = size_t(x.cols / block_elements(quant)) * block_bytes(quant);
  std::vector<float> row(size_t(x.cols));
  for (int64_t o = 0; o < rows; ++o) {
    dequantize_reference(quant, static_cast<const uint8_t*>(w) + size_t(o) * row_bytes, row.data(), x.cols);
    for (int64_t i = 0; i < x.n; ++i) {
      double acc = 0;
      for (int64_t c = 0; c < x.cols; ++c) {
        const int64_t at = i * x.cols + c;
        acc += double(row[size_t(c)]) * double(x.scales[size_t(at / kActivationBlock)]) * double(x.q[size_t(at)]);
      }
      y[i * rows + o] = float(acc);
    }
  }
}

}  // namespace slimkv
