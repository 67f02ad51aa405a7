#include "backend/cpu/bf16_gemm.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "backend/cpu/amx_gemm.h"
#include "backend/cpu/avx512_bf16_gemm.h"

#if defined(SLIMKV_HAVE_AVX512_BF16)
#include <immintrin.h>
#endif

namespace slimkv {
namespace {

constexpr Bf16GemmTier kTiers[] = {Bf16GemmTier::kNone, Bf16GemmTier::kAvx512Bf16, Bf16GemmTier::kAmx};
// Depth per packed panel: 32 rows x 512 BF16 = 32 KiB (L1), and the activations' chunk for every input
// (512 inputs x 512 x hi, lo) 1 MiB, which stays in L2 while the panels of a task pass over it. At the
// 8B shape 256, 1024 and 2048 were 5-20% slower on the AMX tier (bench_kernels --prefill-gemm).
constexpr int64_t kDepthChunk = 512;

// BF16 of one step of a weight panel: two B tiles.
constexpr int64_t kBf16PanelStep = 2 * 16 * kBf16StepDepth;
// Inputs per A tile in the decode layout (their hi and lo parts fill its 16 rows).
constexpr int64_t kDecodeGroupInputs = 8;

int64_t panel_steps(int64_t cols) { return (cols + kBf16StepDepth - 1) / kBf16StepDepth; }
int64_t panel_count(int64_t rows) { return (rows + kBf16Block - 1) / kBf16Block; }

// Input i's row in its A tile of depth step s, part 0 (hi) or 1 (lo): Bf16SplitActivations' layout.
uint16_t* tile_row(Bf16SplitActivations& a, int64_t i, int64_t s, int part) {
  if (a.n <= kBf16DecodeMaxInputs) {
    const int64_t tile = s * a.decode_groups + i / kDecodeGroupInputs;
    return a.data.get() + (tile * 16 + part * kDecodeGroupInputs + i % kDecodeGroupInputs) * kBf16StepDepth;
  }
  const int64_t tile = ((i / kBf16Block * a.steps + s) * 2 + i % kBf16Block / 16) * 2 + part;
  return a.data.get() + tile * 16 * kBf16StepDepth + i % 16 * kBf16StepDepth;
}

// The tier SLIMKV_BF16_GEMM names where this CPU supports it; else the default: AMX, else AVX-512 BF16
// where vdpbf16ps is fast, else none.
Bf16GemmTier choose_tier() {
  if (const char* value = std::getenv("SLIMKV_BF16_GEMM"); value != nullptr && *value != '\0') {
    for (const Bf16GemmTier tier : kTiers) {
      if (std::string_view(value) != bf16_gemm_tier_name(tier)) continue;
      if (bf16_gemm_tier_supported(tier)) return tier;
      std::fprintf(stderr, "SLIMKV_BF16_GEMM=%s: this CPU lacks that tier; ignored\n", value);
    }
    if (std::none_of(std::begin(kTiers), std::end(kTiers),
                     [&](Bf16GemmTier tier) { return std::string_view(value) == bf16_gemm_tier_name(tier); })) {
      std::fprintf(stderr, "SLIMKV_BF16_GEMM=%s: expected amx, avx512-bf16 or none; ignored\n", value);
    }
  }
  if (amx_bf16_available()) return Bf16GemmTier::kAmx;
  if (avx512_bf16_available() && avx512_bf16_beats_fp32()) return Bf16GemmTier::kAvx512Bf16;
  return Bf16GemmTier::kNone;
}

}  // namespace

const char* bf16_gemm_tier_name(Bf16GemmTier tier) {
  switch (tier) {
    case Bf16GemmTier::kNone: return "none";
    case Bf16GemmTier::kAvx512Bf16: return "avx512-bf16";
    case Bf16GemmTier::kAmx: return "amx";
  }
  return "?";
}

bool bf16_gemm_tier_supported(Bf16GemmTier tier) {
  switch (tier) {
    case Bf16GemmTier::kNone: return true;
    case Bf16GemmTier::kAvx512Bf16: return avx512_bf16_available();
    case Bf16GemmTier::kAmx: return amx_bf16_available();
  }
  return false;
}

Bf16GemmTier bf16_gemm_tier() {
  static const Bf16GemmTier tier = choose_tier();
  return tier;
}

void bf16_split_prepare(int64_t n, int64_t cols, Bf16SplitActivations& a) {
  a.n = n;
  a.cols = cols;
  a.steps = panel_steps(cols);
  a.decode_groups = n <= kBf16DecodeMaxInputs ? (n + kDecodeGroupInputs - 1) / kDecodeGroupInputs : 0;
  const int64_t padded = n <= kBf16DecodeMaxInputs ? a.decode_groups * kDecodeGroupInputs
                                                   : (n + kBf16Block - 1) / kBf16Block * kBf16Block;
  const int64_t elements = padded * a.steps * 2 * kBf16StepDepth;
  if (elements > a.capacity) {
    a.data = hwy::AllocateAligned<uint16_t>(size_t(elements));
    std::fill_n(a.data.get(), elements, uint16_t(0));  // never read uninitialized (the rows past n)
    a.capacity = elements;
  }
}

#if defined(SLIMKV_HAVE_AVX512_BF16)
namespace {

// Input i's row of x into a: hi = bf16(x), lo = bf16(x - hi), both rounded to nearest even, zeros past
// cols. Where hi is not finite, lo is 0: Inf - Inf would turn an infinite input into NaN.
SLIMKV_AVX512_BF16_TARGET void split_row(const float* x, int64_t i, Bf16SplitActivations& a) {
  const int64_t cols = a.cols;
  for (int64_t c = 0; c < a.steps * kBf16StepDepth; c += 16) {
    const __mmask16 valid = c + 16 <= cols ? __mmask16(0xffff) : c < cols ? __mmask16((1u << (cols - c)) - 1) : 0;
    const __m512 v = _mm512_maskz_loadu_ps(valid, x + c);
    const __m256i high = (__m256i)_mm512_cvtneps_pbh(v);
    // (maskz forms: GCC 12 warns that the plain ones' undefined source may be used uninitialized.)
    const __m512i widened = _mm512_maskz_cvtepu16_epi32(__mmask16(0xffff), high);
    const __m512 back = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(__mmask16(0xffff), widened, 16));
    const __mmask16 special = _mm512_fpclass_ps_mask(back, 0x01 | 0x08 | 0x10 | 0x80);  // NaN, ±Inf
    const __m512 rest = _mm512_maskz_sub_ps(__mmask16(~special), v, back);
    const int64_t step = c / kBf16StepDepth, half = c % kBf16StepDepth;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile_row(a, i, step, 0) + half), high);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile_row(a, i, step, 1) + half), (__m256i)_mm512_cvtneps_pbh(rest));
  }
}

// One 32-deep step of the weight panel (Bf16BlockProduct's layout): two B tiles (rows 0-15, 16-31), each
// 16 depth pairs x 16 rows x 2 BF16, from w: the panel's first row at the step's first column; zeros for
// rows past `valid` and columns past `present`.
SLIMKV_AVX512_BF16_TARGET void pack_step(const uint16_t* w, int64_t cols, int64_t valid, int64_t present,
                                         uint16_t* tiles) {
  if (valid == kBf16Block && present == kBf16StepDepth) {
    // A tile row is one pair from each of 16 rows: a gather (the 16x16 transposition of 32-bit pairs).
    const __m512i row_bytes = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                 _mm512_set1_epi32(int32_t(cols * 2)));
    for (int64_t half = 0; half < 2; ++half) {
      for (int64_t pair = 0; pair < 16; ++pair) {
        const uint16_t* first = w + half * 16 * cols + 2 * pair;
        _mm512_store_si512(tiles + half * 512 + pair * 32,
                           _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), __mmask16(0xffff), row_bytes, first, 1));
      }
    }
    return;
  }
  for (int64_t r = 0; r < kBf16Block; ++r) {
    for (int64_t k = 0; k < kBf16StepDepth; ++k) {
      tiles[(r / 16) * 512 + (k / 2) * 32 + (r % 16) * 2 + k % 2] = r < valid && k < present ? w[r * cols + k] : 0;
    }
  }
}

// The panel of rows [row0, row0 + valid) (valid ≤ 32) over depth [col0, col0 + depth): pack_step per step.
void pack_panel(const uint16_t* w, int64_t cols, int64_t row0, int64_t valid, int64_t col0, int64_t depth,
                uint16_t* panel) {
  for (int64_t k = 0; k < depth; k += kBf16StepDepth) {
    const int64_t present = std::clamp<int64_t>(cols - col0 - k, 0, kBf16StepDepth);
    const uint16_t* first = w + row0 * cols + std::min(col0 + k, cols);
    pack_step(first, cols, valid, present, panel + k / kBf16StepDepth * kBf16PanelStep);
  }
}

}  // namespace

void bf16_split_rows(const float* x, int64_t begin, int64_t end, Bf16SplitActivations& a) {
  for (int64_t i = begin; i < end; ++i) split_row(x + i * a.cols, i, a);
}

Bf16Panels bf16_pack_panels(const uint16_t* w, int64_t rows, int64_t cols) {
  const int64_t panel_elements = panel_steps(cols) * kBf16PanelStep;
  Bf16Panels panels = hwy::AllocateAligned<uint16_t>(size_t(panel_count(rows) * panel_elements));
  for (int64_t p = 0; p < panel_count(rows); ++p) {
    const int64_t row0 = p * kBf16Block;
    pack_panel(w, cols, row0, std::min(kBf16Block, rows - row0), 0, panel_steps(cols) * kBf16StepDepth,
               panels.get() + p * panel_elements);
  }
  return panels;
}

void bf16_gemm(Bf16GemmTier tier, const Bf16SplitActivations& a, const uint16_t* w, const uint16_t* panels,
               int64_t rows, int64_t row_begin, int64_t row_end, float* y) {
  const Bf16BlockProduct block_product = tier == Bf16GemmTier::kAmx ? amx_block_product : avx512_bf16_block_product;
  thread_local hwy::AlignedFreeUniquePtr<uint16_t[]> packed;
  if (!packed && panels == nullptr) packed = hwy::AllocateAligned<uint16_t>(size_t(kBf16Block * kDepthChunk));
  alignas(64) float edge[kBf16Block * kBf16Block] = {};  // a block past the last input or row, before it is copied to y
  if (tier == Bf16GemmTier::kAmx) amx_begin();
  // Depth chunks outermost: the chunk of every input's activations stays in L2 while this task's panels
  // pass over it; the sums go to y between chunks.
  const int64_t padded_cols = a.steps * kBf16StepDepth;
  for (int64_t col0 = 0; col0 < padded_cols; col0 += kDepthChunk) {
    const int64_t depth = std::min(kDepthChunk, padded_cols - col0);
    const bool accumulate = col0 > 0;
    for (int64_t row0 = row_begin; row0 < row_end; row0 += kBf16Block) {
      const int64_t valid_rows = std::min(kBf16Block, row_end - row0);
      const uint16_t* panel = packed.get();
      if (panels != nullptr) {
        panel = panels + (row0 / kBf16Block * a.steps + col0 / kBf16StepDepth) * kBf16PanelStep;
      } else {
        pack_panel(w, a.cols, row0, valid_rows, col0, depth, packed.get());
      }
      for (int64_t i0 = 0; i0 < a.n; i0 += kBf16Block) {
        const int64_t valid_inputs = std::min(kBf16Block, a.n - i0);
        const uint16_t* x = a.data.get() + (i0 / kBf16Block * a.steps + col0 / kBf16StepDepth) * 4 * 16 * kBf16StepDepth;
        float* out = y + i0 * rows + row0;
        if (valid_rows == kBf16Block && valid_inputs == kBf16Block) {
          block_product(x, panel, depth / kBf16StepDepth, accumulate, out, rows);
          continue;
        }
        if (accumulate) {
          for (int64_t i = 0; i < valid_inputs; ++i) std::copy_n(out + i * rows, valid_rows, edge + i * kBf16Block);
        }
        block_product(x, panel, depth / kBf16StepDepth, accumulate, edge, kBf16Block);
        for (int64_t i = 0; i < valid_inputs; ++i) std::copy_n(edge + i * kBf16Block, valid_rows, out + i * rows);
      }
    }
  }
  if (tier == Bf16GemmTier::kAmx) amx_end();
}

void bf16_decode_gemm(const Bf16SplitActivations& a, const uint16_t* panels, int64_t rows, int64_t row_begin,
                      int64_t row_end, float* y) {
  // Rows per block: two panels for one A tile, one for two (amx_decode_block_product).
  const int64_t block_rows = a.decode_groups == 1 ? 2 * kBf16Block : kBf16Block;
  constexpr int64_t kPitch = 2 * kBf16Block;  // sums' row pitch
  alignas(64) float sums[2 * 16 * kPitch];  // [group, part, input, row]
  const int64_t panel_elements = a.steps * kBf16PanelStep;
  amx_begin();
  for (int64_t row0 = row_begin; row0 < row_end; row0 += block_rows) {
    const int64_t valid_rows = std::min(block_rows, row_end - row0);
    const uint16_t* panel = panels + row0 / kBf16Block * panel_elements;
    const int64_t panel_stride = valid_rows > kBf16Block ? panel_elements : 0;
    amx_decode_block_product(a.data.get(), a.decode_groups, panel, panel_stride, a.steps, sums);
    for (int64_t i = 0; i < a.n; ++i) {
      const float* hi = sums + (i / kDecodeGroupInputs * 16 + i % kDecodeGroupInputs) * kPitch;
      const float* lo = hi + kDecodeGroupInputs * kPitch;
      float* out = y + i * rows + row0;
      for (int64_t r = 0; r < valid_rows; ++r) out[r] = hi[r] + lo[r];
    }
  }
  amx_end();
}

#else  // not x86-64 Linux: no tier but kNone is supported, and these may not be called

void bf16_split_rows(const float*, int64_t, int64_t, Bf16SplitActivations&) { std::abort(); }
Bf16Panels bf16_pack_panels(const uint16_t*, int64_t, int64_t) { std::abort(); }
void bf16_gemm(Bf16GemmTier, const Bf16SplitActivations&, const uint16_t*, const uint16_t*, int64_t, int64_t, int64_t,
               float*) {
  std::abort();
}
void bf16_decode_gemm(const Bf16SplitActivations&, const uint16_t*, int64_t, int64_t, int64_t, float*) { std::abort(); }

#endif

}  // namespace slimkv
