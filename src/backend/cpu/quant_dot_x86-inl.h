// quant_dot.h's row products on 256-bit x86 SIMD, written once for every tier: quant_dot_x86.cc includes
// this file (no include guard) once per tier, inside that tier's namespace and target attributes, after
// defining the one instruction the tiers differ by:
//   __m256i DotU8S8(__m256i acc, __m256i u, __m256i s): acc + the sums of four products u·s (u unsigned,
//   s signed bytes) in 8 int32 lanes — vpdpbusd (AVX-512 VNNI, AVX-VNNI), or vpmaddubsw + vpmaddwd
//   (AVX2, whose 16-bit pair sums saturate past 32767: every caller keeps |u| ≤ 128 and |s| ≤ 127).
// 256 bits is one activation block (32 int8): each block's scale multiplies a whole vector. The integer
// sums are exact; the float work is one convert and one FMA per 32 values, as in llama.cpp's kernels.

inline float HalfAt(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);
}

inline float HorizontalSum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  return _mm_cvtss_f32(_mm_add_ss(sum, _mm_movehdup_ps(sum)));
}

// Signed by signed bytes: |a| (unsigned, at most 128) times b with a's sign (|b| ≤ 127: quantized inputs).
inline __m256i DotS8S8(__m256i a, __m256i b) {
  return DotU8S8(_mm256_setzero_si256(), _mm256_abs_epi8(a), _mm256_sign_epi8(b, a));
}

inline __m256i Load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// acc += lanes · scale
inline void Accumulate(__m256i lanes, float scale, __m256& acc) {
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(scale), acc);
}

// One Q8_0 block (34 bytes: FP16 d, 32 int8) by one activation block.
inline void BlockQ8_0(const uint8_t* w, const int8_t* q, float scale, __m256& acc) {
  Accumulate(DotS8S8(Load(w + 2), Load(q)), HalfAt(w) * scale, acc);
}

// One Q4_0 block (18 bytes: FP16 d, 16 bytes of nibbles: values 0..15 low, 16..31 high), nibble - 8.
inline void BlockQ4_0(const uint8_t* w, const int8_t* q, float scale, __m256& acc) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2));
  const __m128i nibble = _mm_set1_epi8(15);
  const __m256i codes = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), nibble), _mm_and_si128(packed, nibble));
  Accumulate(DotS8S8(_mm256_sub_epi8(codes, _mm256_set1_epi8(8)), Load(q)), HalfAt(w) * scale, acc);
}

struct SimdRows {
  // Blocks alternate between two sums, so that consecutive FMAs do not wait for each other.
  static float q8_0(const uint8_t* w, const int8_t* q, const float* scales, int64_t blocks) {
    __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= blocks; b += 2) {
      BlockQ8_0(w + 34 * b, q + 32 * b, scales[b], even);
      BlockQ8_0(w + 34 * (b + 1), q + 32 * (b + 1), scales[b + 1], odd);
    }
    if (b < blocks) BlockQ8_0(w + 34 * b, q + 32 * b, scales[b], even);
    return HorizontalSum(_mm256_add_ps(even, odd));
  }

  static float q4_0(const uint8_t* w, const int8_t* q, const float* scales, int64_t blocks) {
    __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= blocks; b += 2) {
      BlockQ4_0(w + 18 * b, q + 32 * b, scales[b], even);
      BlockQ4_0(w + 18 * (b + 1), q + 32 * (b + 1), scales[b + 1], odd);
    }
    if (b < blocks) BlockQ4_0(w + 18 * b, q + 32 * b, scales[b], even);
    return HorizontalSum(_mm256_add_ps(even, odd));
  }

  // Q4_K (tensor/ggml_type.h): per 64 values 32 bytes, low nibbles the first 32, high the next; codes 0..15
  // (unsigned, as vpdpbusd wants them) times d·sc, minus dmin·m times the inputs' sum (their scaled_sums).
  static float q4_k(const uint8_t* w, const int8_t* q, const float* scales, const float* sums, int64_t superblocks) {
    __m256 low_sum = _mm256_setzero_ps(), high_sum = _mm256_setzero_ps();
    const __m256i nibble = _mm256_set1_epi8(15);
    float minimum = 0;
    for (int64_t s = 0; s < superblocks; ++s, w += 144) {
      const float d = HalfAt(w), dmin = HalfAt(w + 2);
      float block_minimum = 0;
      for (int pair = 0; pair < 4; ++pair, q += 64, scales += 2, sums += 2) {
        const __m256i bytes = Load(w + 16 + 32 * pair);
        int scale_low, min_low, scale_high, min_high;
        q4_k_scale_min(w + 4, 2 * pair, &scale_low, &min_low);
        q4_k_scale_min(w + 4, 2 * pair + 1, &scale_high, &min_high);
        Accumulate(DotU8S8(_mm256_setzero_si256(), _mm256_and_si256(bytes, nibble), Load(q)),
                   d * float(scale_low) * scales[0], low_sum);
        Accumulate(DotU8S8(_mm256_setzero_si256(), _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble), Load(q + 32)),
                   d * float(scale_high) * scales[1], high_sum);
        block_minimum += float(min_low) * sums[0] + float(min_high) * sums[1];
      }
      minimum += dmin * block_minimum;
    }
    return HorizontalSum(_mm256_add_ps(low_sum, high_sum)) - minimum;
  }

  // Q6_K (tensor/ggml_type.h): per 128 values 64 bytes of ql and 32 of qh make four runs of 32 six-bit codes
  // (minus 32: signed); each run is two sub-blocks of 16 with their own int8 scale, which multiply the
  // dot's lanes 0-3 and 4-7.
  static float q6_k(const uint8_t* w, const int8_t* q, const float* scales, int64_t superblocks) {
    __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(15), high2 = _mm256_set1_epi8(0x30), offset = _mm256_set1_epi8(32);
    for (int64_t s = 0; s < superblocks; ++s, w += 210) {
      const float d = HalfAt(w + 208);
      for (int half = 0; half < 2; ++half, q += 128, scales += 4) {
        const __m256i ql0 = Load(w + 64 * half), ql1 = Load(w + 64 * half + 32), qh = Load(w + 128 + 32 * half);
        // The half's eight sub-block scales, one per int32 lane; run r takes lanes 2r (x4) and 2r + 1 (x4).
        const __m256i sub_scales = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + 192 + 8 * half)));
        const __m256i codes[4] = {
            _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), high2)),
            _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), high2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(qh, high2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), high2)),
        };
        for (int run = 0; run < 4; ++run) {
          const __m256i run_scales =
              _mm256_permutevar8x32_epi32(sub_scales, _mm256_setr_epi32(2 * run, 2 * run, 2 * run, 2 * run, 2 * run + 1,
                                                                        2 * run + 1, 2 * run + 1, 2 * run + 1));
          const __m256i dot = DotS8S8(_mm256_sub_epi8(codes[run], offset), Load(q + 32 * run));
          Accumulate(_mm256_mullo_epi32(dot, run_scales), d * scales[run], run % 2 ? odd : even);
        }
      }
    }
    return HorizontalSum(_mm256_add_ps(even, odd));
  }
};
