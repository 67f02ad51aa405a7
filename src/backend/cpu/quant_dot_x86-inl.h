// quant_dot.h's row products on 256-bit x86 SIMD, written once for every tier: quant_dot_x86.cc includes
// this file (no include guard) once per tier, inside that tier's namespace and target attributes, after
// defining the one instruction the tiers differ by and what it allows:
//   __m256i DotU8S8(__m256i acc, __m256i u, __m256i s): acc + the sums of four products u·s (u unsigned,
//   s signed bytes) in 8 int32 lanes — vpdpbusd (AVX-512 VNNI, AVX-VNNI), or vpmaddubsw + vpmaddwd (AVX2);
//   kDotTakesAnyUnsignedByte: false where 16-bit pair sums saturate past 32767 (AVX2), so that u ≤ 128.
// 256 bits is one activation block (32 int8): each block's scale multiplies a whole vector. Weight codes go
// in unsigned (stored value + k: no sign shuffles), and k · scale · Σ q is subtracted once per 4 blocks or
// 128 values (the inputs' scaled sums). Per 32 values the vector ALUs run the dot product, one convert and
// one FMA whose scale is broadcast from memory; the scales themselves are computed 4 or 8 at a time.

inline float HorizontalSum(__m128 sum) {
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  return _mm_cvtss_f32(_mm_add_ss(sum, _mm_movehdup_ps(sum)));
}

inline float HorizontalSum(__m256 v) {
  return HorizontalSum(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

inline __m256i Load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// acc += lanes · *scale (a broadcast from memory: a load, not a shuffle).
inline void Accumulate(__m256i lanes, const float* scale, __m256& acc) {
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_broadcast_ss(scale), acc);
}

inline uint16_t Bits16(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return bits;
}

// The FP16 scales at the start of 4 consecutive blocks, `stride` bytes apart.
inline __m128 BlockScales4(const uint8_t* w, int64_t stride) {
  __m128i halves = _mm_cvtsi32_si128(Bits16(w));
  halves = _mm_insert_epi16(halves, Bits16(w + stride), 1);
  halves = _mm_insert_epi16(halves, Bits16(w + 2 * stride), 2);
  halves = _mm_insert_epi16(halves, Bits16(w + 3 * stride), 3);
  return _mm_cvtph_ps(halves);
}

// One Q8_0 block's 32 int8 by one activation block: stored value + 128 where the dot product takes any
// unsigned byte (kQ8_0Offset), else |w| (at most 128) times q with w's sign.
constexpr int kQ8_0Offset = kDotTakesAnyUnsignedByte ? 128 : 0;
inline __m256i DotQ8_0(const uint8_t* codes, const int8_t* q) {
  const __m256i w = Load(codes);
  if constexpr (kQ8_0Offset != 0) {
    return DotU8S8(_mm256_setzero_si256(), _mm256_xor_si256(w, _mm256_set1_epi8(-128)), Load(q));
  } else {
    return DotU8S8(_mm256_setzero_si256(), _mm256_abs_epi8(w), _mm256_sign_epi8(Load(q), w));
  }
}

// One Q4_0 block's 16 bytes of nibbles (values 0..15 low, 16..31 high; stored value + 8).
inline __m256i DotQ4_0(const uint8_t* packed, const int8_t* q) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed));
  const __m128i nibble = _mm_set1_epi8(15);
  const __m256i codes = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), nibble), _mm_and_si128(bytes, nibble));
  return DotU8S8(_mm256_setzero_si256(), codes, Load(q));
}

// Q8_0 and Q4_0: blocks of 32 values with an FP16 scale first, kBlockBytes apart; Dot(codes, q) their dot
// product with codes = stored value + kOffset. Blocks alternate between two sums, so that consecutive FMAs
// do not wait for each other.
template <int64_t kBlockBytes, int kOffset, __m256i (*Dot)(const uint8_t*, const int8_t*)>
[[gnu::always_inline]] inline float RowOfBlocks32(const uint8_t* w, const InputRow& x, int64_t blocks) {
  __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps();
  __m128 offsets = _mm_setzero_ps();
  alignas(16) float scales[4];
  // Groups of 4 blocks, not 8: a row of the bundled model's matrices is 12 or 24 blocks, and a remainder
  // block costs several of a group's.
  int64_t b = 0;
  for (; b + 4 <= blocks; b += 4) {
    const __m128 weight_scales = BlockScales4(w + kBlockBytes * b, kBlockBytes);
    _mm_store_ps(scales, _mm_mul_ps(weight_scales, _mm_loadu_ps(x.scales + b)));
    if constexpr (kOffset != 0) offsets = _mm_fmadd_ps(weight_scales, _mm_loadu_ps(x.scaled_sums + b), offsets);
    Accumulate(Dot(w + kBlockBytes * b + 2, x.q + 32 * b), scales, even);
    Accumulate(Dot(w + kBlockBytes * (b + 1) + 2, x.q + 32 * (b + 1)), scales + 1, odd);
    Accumulate(Dot(w + kBlockBytes * (b + 2) + 2, x.q + 32 * (b + 2)), scales + 2, even);
    Accumulate(Dot(w + kBlockBytes * (b + 3) + 2, x.q + 32 * (b + 3)), scales + 3, odd);
  }
  float tail_offsets = 0;
  for (; b < blocks; ++b) {
    const float weight_scale = _cvtsh_ss(Bits16(w + kBlockBytes * b));
    scales[0] = weight_scale * x.scales[b];
    Accumulate(Dot(w + kBlockBytes * b + 2, x.q + 32 * b), scales, even);
    tail_offsets += weight_scale * x.scaled_sums[b];
  }
  return HorizontalSum(_mm256_add_ps(even, odd)) - float(kOffset) * (HorizontalSum(offsets) + tail_offsets);
}

// Q4_K's eight 6-bit scales (low 64 bits) and mins (high) as bytes, from its 12 packed bytes (the layout of
// q4_k_scale_min in tensor/ggml_type.h, four sub-blocks per 32-bit operation).
inline __m128i Q4KScalesAndMins(const uint8_t* packed) {
  uint32_t a, b, c;
  std::memcpy(&a, packed, 4);
  std::memcpy(&b, packed + 4, 4);
  std::memcpy(&c, packed + 8, 4);
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kTop2 = 0x03030303;
  const uint32_t scales_high = (c & kLow4) | (((a >> 6) & kTop2) << 4);
  const uint32_t mins_high = ((c >> 4) & kLow4) | (((b >> 6) & kTop2) << 4);
  return _mm_setr_epi32(int(a & kLow6), int(scales_high), int(b & kLow6), int(mins_high));
}

// quantize_activations' rounding (quant_dot.cc's plain loops) on 32 values at a time, with the
// same IEEE operations in the same order, so the same bits: the largest |x|, d = max / 127, q =
// nearest-even(x · (1 / d)) (vcvtps2dq under the default rounding mode), d kept as FP16 when it fits.
inline void Quantize(const float* x, int64_t blocks, QuantizedActivations& out) {
  const __m256 magnitude_bits = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t b = 0; b < blocks; ++b, x += 32) {
    const __m256 v[4] = {_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8), _mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)};
    __m256 amax = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], magnitude_bits), _mm256_and_ps(v[1], magnitude_bits)),
                                _mm256_max_ps(_mm256_and_ps(v[2], magnitude_bits), _mm256_and_ps(v[3], magnitude_bits)));
    __m128 max4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    max4 = _mm_max_ps(max4, _mm_movehl_ps(max4, max4));
    const float d = _mm_cvtss_f32(_mm_max_ss(max4, _mm_movehdup_ps(max4))) / 127.0f;
    const __m256 inverse = _mm256_set1_ps(d != 0 ? 1.0f / d : 0.0f);
    const __m256i q16_low = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[0], inverse)),
                                               _mm256_cvtps_epi32(_mm256_mul_ps(v[1], inverse)));
    const __m256i q16_high = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[2], inverse)),
                                                _mm256_cvtps_epi32(_mm256_mul_ps(v[3], inverse)));
    // The packs work within 128-bit halves: 4-value groups come out in the order 0 2 4 6 1 3 5 7.
    const __m256i q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16_low, q16_high),
                                                  _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q.data() + 32 * b), q);
    // Σ q of each 16: the two halves of the sums of four.
    const __m256i quad_sums = DotU8S8(_mm256_setzero_si256(), _mm256_set1_epi8(1), q);
    __m128i sums = _mm_hadd_epi32(_mm256_castsi256_si128(quad_sums), _mm256_extracti128_si256(quad_sums, 1));
    sums = _mm_hadd_epi32(sums, sums);
    const int32_t sum_low = _mm_cvtsi128_si32(sums), sum_high = _mm_extract_epi32(sums, 1);
    const float scale = d <= kMaxHalf ? _cvtsh_ss(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT)) : d;
    out.scales[size_t(b)] = scale;
    out.scaled_sums[size_t(b)] = scale * float(sum_low + sum_high);
    out.scaled_sums16[size_t(2 * b)] = scale * float(sum_low);
    out.scaled_sums16[size_t(2 * b + 1)] = scale * float(sum_high);
  }
}

struct SimdRows {
  static float q8_0(const uint8_t* w, const InputRow& x, int64_t blocks) {
    return RowOfBlocks32<34, kQ8_0Offset, DotQ8_0>(w, x, blocks);
  }
  static float q4_0(const uint8_t* w, const InputRow& x, int64_t blocks) { return RowOfBlocks32<18, 8, DotQ4_0>(w, x, blocks); }

  // Q4_K (tensor/ggml_type.h): per 64 values 32 bytes, low nibbles the first 32, high the next; codes 0..15
  // times d·sc, minus dmin·m times the inputs' sums (scaled_sums), all eight sub-blocks' factors at once.
  static float q4_k(const uint8_t* w, const InputRow& x, int64_t superblocks) {
    __m256 low_sum = _mm256_setzero_ps(), high_sum = _mm256_setzero_ps(), minimum = _mm256_setzero_ps();
    const __m256i nibble = _mm256_set1_epi8(15);
    alignas(32) float scales[8];
    for (int64_t s = 0; s < superblocks; ++s, w += 144) {
      const __m128i scales_mins = Q4KScalesAndMins(w + 4);
      const __m256 sub_scales = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(scales_mins));
      const __m256 sub_mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(scales_mins, scales_mins)));
      _mm256_store_ps(scales, _mm256_mul_ps(_mm256_mul_ps(sub_scales, _mm256_set1_ps(_cvtsh_ss(Bits16(w)))),
                                            _mm256_loadu_ps(x.scales + 8 * s)));
      minimum = _mm256_fmadd_ps(_mm256_mul_ps(sub_mins, _mm256_set1_ps(_cvtsh_ss(Bits16(w + 2)))),
                                _mm256_loadu_ps(x.scaled_sums + 8 * s), minimum);
      const int8_t* q = x.q + 256 * s;
      for (int pair = 0; pair < 4; ++pair) {
        const __m256i bytes = Load(w + 16 + 32 * pair);
        const __m256i zero = _mm256_setzero_si256();
        Accumulate(DotU8S8(zero, _mm256_and_si256(bytes, nibble), Load(q + 64 * pair)), scales + 2 * pair, low_sum);
        Accumulate(DotU8S8(zero, _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble), Load(q + 64 * pair + 32)),
                   scales + 2 * pair + 1, high_sum);
      }
    }
    return HorizontalSum(_mm256_add_ps(low_sum, high_sum)) - HorizontalSum(minimum);
  }

  // Q6_K (tensor/ggml_type.h): per 128 values 64 bytes of ql and 32 of qh make four runs of 32 six-bit codes
  // (stored value + 32); each run is two sub-blocks of 16 with their own int8 scale, which multiply the
  // dot's lanes 0-3 and 4-7: a vector of the two factors per run. The offsets: per half, the eight scales
  // times the inputs' sums of 16 (scaled_sums16).
  static float q6_k(const uint8_t* w, const InputRow& x, int64_t superblocks) {
    __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps(), offsets = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(15), high2 = _mm256_set1_epi8(0x30);
    for (int64_t s = 0; s < superblocks; ++s, w += 210) {
      const __m256 d = _mm256_set1_ps(_cvtsh_ss(Bits16(w + 208)));
      for (int half = 0; half < 2; ++half) {
        const int64_t block = 8 * s + 4 * half;  // the half's first activation block
        const int8_t* q = x.q + 32 * block;
        const __m256i ql0 = Load(w + 64 * half), ql1 = Load(w + 64 * half + 32), qh = Load(w + 128 + 32 * half);
        // d times the half's eight sub-block scales; run r takes lanes 2r (x4) and 2r + 1 (x4).
        const __m256 sub_scales = _mm256_mul_ps(
            d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + 192 + 8 * half)))));
        const __m256i codes[4] = {
            _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), high2)),
            _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), high2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(qh, high2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), high2)),
        };
        offsets = _mm256_fmadd_ps(sub_scales, _mm256_loadu_ps(x.scaled_sums16 + 2 * block), offsets);
        for (int run = 0; run < 4; ++run) {
          const __m256 run_scales = _mm256_mul_ps(
              _mm256_permutevar8x32_ps(sub_scales, _mm256_setr_epi32(2 * run, 2 * run, 2 * run, 2 * run, 2 * run + 1,
                                                                     2 * run + 1, 2 * run + 1, 2 * run + 1)),
              _mm256_broadcast_ss(x.scales + block + run));
          const __m256i dot = DotU8S8(_mm256_setzero_si256(), codes[run], Load(q + 32 * run));
          (run % 2 ? odd : even) = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), run_scales, run % 2 ? odd : even);
        }
      }
    }
    return HorizontalSum(_mm256_add_ps(even, odd)) - 32.0f * HorizontalSum(offsets);
  }
};

inline void MatVec(const QuantizedActivations& x, const void* w, BlockQuant quant, int64_t rows, int64_t row_begin,
                   int64_t row_end, float* y) {
  matvec_by_rows<SimdRows>(x, w, quant, rows, row_begin, row_end, y);
}
