#include "backend/cpu/amx_gemm.h"

#include <cstdlib>
#include <initializer_list>

#include "backend/cpu/avx512_bf16_gemm.h"

#if defined(SLIMKV_HAVE_AVX512_BF16)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
// Functions that use the tiles are compiled for them alone: the rest of the binary stays portable, and
// they run only after amx_bf16_available() said yes.
#define SLIMKV_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))
#endif

namespace slimkv {

#if defined(SLIMKV_HAVE_AVX512_BF16)
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

// AMX-TILE and AMX-BF16 (the activations are split with AVX-512 BF16, which AMX CPUs have too).
bool cpu_has_amx_bf16() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  return (edx >> 24 & 1) && (edx >> 22 & 1) && avx512_bf16_available();
}

}  // namespace

bool amx_bf16_available() {
  static const bool available = cpu_has_amx_bf16() && request_tile_state();
  return available;
}

SLIMKV_AMX_TARGET void amx_begin() {
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

SLIMKV_AMX_TARGET void amx_end() { _tile_release(); }

// tmm0-3 hold the four 16x16 sums, tmm4-5 the activations (inputs 0-15, 16-31), tmm6-7 the weights
// (rows 0-15, 16-31).
SLIMKV_AMX_TARGET void amx_block_product(const uint16_t* x, const uint16_t* panel, int64_t steps, bool accumulate,
                                         float* c, int64_t c_stride) {
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

// tmm0-3 hold the four 16x16 sums, tmm4-5 the A tiles, tmm6-7 the B tiles of one panel (rows 0-15,
// 16-31). One dpbf16ps per B tile and A tile: a tile product costs the same whatever rows it holds, so
// putting 8 inputs' hi and lo parts in one A tile halves a decode step's products for ≤ 8 inputs.
SLIMKV_AMX_TARGET void amx_decode_block_product(const uint16_t* x, int64_t groups, const uint16_t* panel,
                                                int64_t panel_stride, int64_t steps, float* c) {
  constexpr int64_t kBytes = 64 * sizeof(float);  // c's row pitch
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  if (groups == 1) {
    for (int64_t s = 0; s < steps; ++s) {
      const uint16_t* weights = panel + s * 1024;
      _tile_loadd(4, x + s * 512, 64);
      _tile_loadd(6, weights, 64);
      _tile_loadd(7, weights + 512, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(6, weights + panel_stride, 64);
      _tile_loadd(7, weights + panel_stride + 512, 64);
      _tile_dpbf16ps(2, 4, 6);
      _tile_dpbf16ps(3, 4, 7);
    }
    _tile_stored(0, c, kBytes);
    _tile_stored(1, c + 16, kBytes);
    _tile_stored(2, c + 32, kBytes);
    _tile_stored(3, c + 48, kBytes);
    return;
  }
  for (int64_t s = 0; s < steps; ++s) {
    const uint16_t* weights = panel + s * 1024;
    _tile_loadd(4, x + s * 1024, 64);
    _tile_loadd(5, x + s * 1024 + 512, 64);
    _tile_loadd(6, weights, 64);
    _tile_loadd(7, weights + 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, kBytes);
  _tile_stored(1, c + 16, kBytes);
  _tile_stored(2, c + 16 * 64, kBytes);
  _tile_stored(3, c + 16 * 64 + 16, kBytes);
}

#else  // no AMX on this architecture: amx_bf16_available() is false and nothing else may be called

bool amx_bf16_available() { return false; }
void amx_begin() { std::abort(); }
void amx_end() { std::abort(); }
void amx_block_product(const uint16_t*, const uint16_t*, int64_t, bool, float*, int64_t) { std::abort(); }
void amx_decode_block_product(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, float*) { std::abort(); }

#endif

}  // namespace slimkv
