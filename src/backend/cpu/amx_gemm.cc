#include "backend/cpu/amx_gemm.h"

#include <algorithm>
#include <cstdlib>

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define SLIMKV_HAVE_AMX 1
// Functions that use the tiles or AVX-512 BF16 are compiled for them alone: the rest of the binary stays
// portable, and they run only after amx_bf16_available() said yes.
#define SLIMKV_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))
#endif

namespace slimkv {
namespace {

// Inputs and weight rows per block: two tiles of 16 each way, so four FP32 accumulator tiles, two
// activation tiles and two weight tiles fill the eight tile registers.
constexpr int64_t kBlock = 32;
// Depth per tile product (BF16 pairs of a 64-byte tile row).
constexpr int64_t kTileDepth = 32;
// Depth per packed panel: 32 rows x 512 BF16 = 32 KiB (L1), and the activations' chunk for every input
// (512 inputs x 512 x hi, lo) 1 MiB, which stays in L2 while the panels of a task pass over it. At the
// 8B shape 256, 1024 and 2048 were 5-20% slower (bench_kernels --prefill-gemm).
constexpr int64_t kDepthChunk = 512;

// Input i's row in its A tile of depth step s, part 0 (hi) or 1 (lo): AmxActivations' layout.
uint16_t* tile_row(AmxActivations& a, int64_t i, int64_t s, int part) {
  const int64_t tile = ((i / kBlock * a.steps + s) * 2 + i % kBlock / 16) * 2 + part;
  return a.data.get() + tile * 16 * kTileDepth + i % 16 * kTileDepth;
}

}  // namespace

void amx_prepare(int64_t n, int64_t cols, AmxActivations& a) {
  a.n = n;
  a.cols = cols;
  a.steps = (cols + kTileDepth - 1) / kTileDepth;
  const int64_t padded = (n + kBlock - 1) / kBlock * kBlock;
  const int64_t elements = padded * a.steps * 2 * kTileDepth;
  if (elements > a.capacity) {
    a.data = hwy::AllocateAligned<uint16_t>(size_t(elements));
    a.capacity = elements;
  }
  for (int64_t i = n; i < padded; ++i) {
    for (int64_t s = 0; s < a.steps; ++s) {
      for (const int part : {0, 1}) std::fill_n(tile_row(a, i, s, part), kTileDepth, uint16_t(0));
    }
  }
}

#if defined(SLIMKV_HAVE_AMX)
namespace {

// The tile configuration ldtilecfg reads (Intel SDM, palette 1): every tile 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Linux hands out the 8 KiB tile state only to processes that ask (arch_prctl, kernel 5.16+).
bool request_tile_state() {
  constexpr long kRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
  constexpr long kTileData = 18;  // XFEATURE_XTILEDATA
  return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
}

bool cpu_has_amx_bf16() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool amx = (edx >> 24 & 1) && (edx >> 22 & 1);  // AMX-TILE, AMX-BF16
  if (!amx || eax < 1 || !__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) return false;
  const bool avx512_bf16 = eax >> 5 & 1;
  // __builtin_cpu_supports also checks that the OS saves the AVX-512 registers.
  return avx512_bf16 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

// Input i's row of x into a: hi = bf16(x), lo = bf16(x - hi), both rounded to nearest even, zeros past
// cols. Where hi is not finite, lo is 0: Inf - Inf would turn an infinite input into NaN.
SLIMKV_AMX_TARGET void split_row(const float* x, int64_t i, AmxActivations& a) {
  const int64_t cols = a.cols;
  for (int64_t c = 0; c < a.steps * kTileDepth; c += 16) {
    const __mmask16 valid = c + 16 <= cols ? __mmask16(0xffff) : c < cols ? __mmask16((1u << (cols - c)) - 1) : 0;
    const __m512 v = _mm512_maskz_loadu_ps(valid, x + c);
    const __m256i high = (__m256i)_mm512_cvtneps_pbh(v);
    // (maskz forms: GCC 12 warns that the plain ones' undefined source may be used uninitialized.)
    const __m512i widened = _mm512_maskz_cvtepu16_epi32(__mmask16(0xffff), high);
    const __m512 back = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(__mmask16(0xffff), widened, 16));
    const __mmask16 special = _mm512_fpclass_ps_mask(back, 0x01 | 0x08 | 0x10 | 0x80);  // NaN, ±Inf
    const __m512 rest = _mm512_maskz_sub_ps(__mmask16(~special), v, back);
    const int64_t step = c / kTileDepth, half = c % kTileDepth;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile_row(a, i, step, 0) + half), high);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile_row(a, i, step, 1) + half), (__m256i)_mm512_cvtneps_pbh(rest));
  }
}

// One 32-deep step of the weight panel as the tile products read it: two B tiles (rows 0-15, 16-31),
// each 16 depth pairs x 16 rows x 2 BF16 (the pair interleaving of TDPBF16PS):
// tiles[(r / 16) * 512 + pair * 32 + (r % 16) * 2 + k % 2] = w[r, 2 * pair + k % 2], w: the panel's first
// row at the step's first column; zeros for rows past `valid` and columns past `present`.
SLIMKV_AMX_TARGET void pack_step(const uint16_t* w, int64_t cols, int64_t valid, int64_t present, uint16_t* tiles) {
  if (valid == kBlock && present == kTileDepth) {
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
  for (int64_t r = 0; r < kBlock; ++r) {
    for (int64_t k = 0; k < kTileDepth; ++k) {
      tiles[(r / 16) * 512 + (k / 2) * 32 + (r % 16) * 2 + k % 2] = r < valid && k < present ? w[r * cols + k] : 0;
    }
  }
}

// The panel of rows [row0, row0 + valid) (valid ≤ 32) over depth [col0, col0 + depth): pack_step per step.
void pack_panel(const uint16_t* w, int64_t cols, int64_t row0, int64_t valid, int64_t col0, int64_t depth,
                uint16_t* panel) {
  for (int64_t k = 0; k < depth; k += kTileDepth) {
    const int64_t present = std::clamp<int64_t>(cols - col0 - k, 0, kTileDepth);
    const uint16_t* first = w + row0 * cols + std::min(col0 + k, cols);
    pack_step(first, cols, valid, present, panel + k / kTileDepth * 1024);
  }
}

// The y block of inputs [i0, i0 + 32) x rows [row0, row0 + 32) += its product over one depth chunk (or =
// for the first chunk): tmm0-3 hold the four 16x16 sums, tmm4-5 the activations, tmm6-7 the weights.
// x: the block's A tiles of the chunk's first step (AmxActivations' layout: 4 tiles a step, 0-15 hi,
// 0-15 lo, 16-31 hi, 16-31 lo); c: the block's first output, c_stride its row pitch in floats.
SLIMKV_AMX_TARGET void block_product(const uint16_t* x, const uint16_t* panel, int64_t steps, bool accumulate, float* c,
                                     int64_t c_stride) {
  const int64_t c_bytes = c_stride * int64_t(sizeof(float));
  if (accumulate) {
    _tile_loadd(0, c, c_bytes);
    _tile_loadd(1, c + 16, c_bytes);
    _tile_loadd(2, c + 16 * c_stride, c_bytes);
    _tile_loadd(3, c + 16 * c_stride + 16, c_bytes);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(6, panel + s * 1024, 64);
    _tile_loadd(7, panel + s * 1024 + 512, 64);
    for (const int64_t part : {0, 512}) {  // hi, then lo
      const uint16_t* a = x + s * 2048 + part;
      _tile_loadd(4, a, 64);
      _tile_loadd(5, a + 1024, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, c_bytes);
  _tile_stored(1, c + 16, c_bytes);
  _tile_stored(2, c + 16 * c_stride, c_bytes);
  _tile_stored(3, c + 16 * c_stride + 16, c_bytes);
}

SLIMKV_AMX_TARGET void load_tile_config() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.bytes_per_row[t] = 64;
    config.rows[t] = 16;
  }
  // GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes of the config: without this barrier
  // the row sizes are dropped as dead stores (and the first tile instruction faults).
  asm volatile("" ::: "memory");
  _tile_loadconfig(&config);
}

SLIMKV_AMX_TARGET void release_tiles() { _tile_release(); }

}  // namespace

bool amx_bf16_available() {
  static const bool available = cpu_has_amx_bf16() && request_tile_state();
  return available;
}

void amx_split_rows(const float* x, int64_t begin, int64_t end, AmxActivations& a) {
  for (int64_t i = begin; i < end; ++i) split_row(x + i * a.cols, i, a);
}

void amx_gemm_bf16(const AmxActivations& a, const uint16_t* w, int64_t rows, int64_t row_begin, int64_t row_end,
                   float* y) {
  thread_local hwy::AlignedFreeUniquePtr<uint16_t[]> panel;
  if (!panel) panel = hwy::AllocateAligned<uint16_t>(size_t(kBlock * kDepthChunk));
  alignas(64) float edge[kBlock * kBlock] = {};  // a block past the last input or row, before it is copied to y
  load_tile_config();
  // Depth chunks outermost: the chunk of every input's activations stays in L2 while this task's panels
  // pass over it; the sums go to y between chunks.
  const int64_t padded_cols = a.steps * kTileDepth;
  for (int64_t col0 = 0; col0 < padded_cols; col0 += kDepthChunk) {
    const int64_t depth = std::min(kDepthChunk, padded_cols - col0);
    const bool accumulate = col0 > 0;
    for (int64_t row0 = row_begin; row0 < row_end; row0 += kBlock) {
      const int64_t valid_rows = std::min(kBlock, row_end - row0);
      pack_panel(w, a.cols, row0, valid_rows, col0, depth, panel.get());
      for (int64_t i0 = 0; i0 < a.n; i0 += kBlock) {
        const int64_t valid_inputs = std::min(kBlock, a.n - i0);
        const uint16_t* x = a.data.get() + (i0 / kBlock * a.steps + col0 / kTileDepth) * 4 * 16 * kTileDepth;
        float* out = y + i0 * rows + row0;
        if (valid_rows == kBlock && valid_inputs == kBlock) {
          block_product(x, panel.get(), depth / kTileDepth, accumulate, out, rows);
          continue;
        }
        if (accumulate) {
          for (int64_t i = 0; i < valid_inputs; ++i) std::copy_n(out + i * rows, valid_rows, edge + i * kBlock);
        }
        block_product(x, panel.get(), depth / kTileDepth, accumulate, edge, kBlock);
        for (int64_t i = 0; i < valid_inputs; ++i) std::copy_n(edge + i * kBlock, valid_rows, out + i * rows);
      }
    }
  }
  release_tiles();
}

#else  // no AMX on this architecture: amx_bf16_available() is false and nothing else may be called

bool amx_bf16_available() { return false; }
void amx_split_rows(const float*, int64_t, int64_t, AmxActivations&) { std::abort(); }
void amx_gemm_bf16(const AmxActivations&, const uint16_t*, int64_t, int64_t, int64_t, float*) { std::abort(); }

#endif

}  // namespace slimkv
