#include "backend/cpu/panel_gemm.h"

#include <algorithm>
#include <cstring>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/panel_gemm.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "backend/cpu/vec_ops-inl.h"
#include "hwy/aligned_allocator.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace slimkv {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Inputs per micro-tile: with two accumulators each, the widened panel row and the broadcast input they
// fill the registers (32 on AVX-512, 16 on AVX2 and below).
constexpr int kTileInputs = HWY_MAX_BYTES >= 64 ? 8 : 4;
// Depth (input features) per panel chunk: a panel of 2 vectors x 256 FP32 stays in L1 (32 KiB on AVX-512).
constexpr int64_t kDepthChunk = 256;

// y[j, 0 : 2·lanes] (+)= Σ_k x[j, k] · panel[k, :] for kInputs inputs x_j = x + j·x_stride over `depth`;
// panel [depth, 2·lanes] FP32. Adds to y when `accumulate` (a later depth chunk), else overwrites it.
template <int kInputs>
HWY_INLINE void PanelTile(const float* HWY_RESTRICT x, size_t x_stride, const float* HWY_RESTRICT panel, size_t depth,
                          bool accumulate, float* HWY_RESTRICT y, size_t y_stride) {
  const DF d;
  const size_t lanes = hn::Lanes(d);
  VF low[kInputs], high[kInputs];
  for (int j = 0; j < kInputs; ++j) {
    low[j] = accumulate ? hn::LoadU(d, y + j * y_stride) : hn::Zero(d);
    high[j] = accumulate ? hn::LoadU(d, y + j * y_stride + lanes) : hn::Zero(d);
  }
  for (size_t k = 0; k < depth; ++k) {
    const VF w_low = hn::Load(d, panel + k * 2 * lanes);
    const VF w_high = hn::Load(d, panel + k * 2 * lanes + lanes);
    for (int j = 0; j < kInputs; ++j) {
      const VF input = hn::Set(d, x[j * x_stride + k]);
      low[j] = hn::MulAdd(input, w_low, low[j]);
      high[j] = hn::MulAdd(input, w_high, high[j]);
    }
  }
  for (int j = 0; j < kInputs; ++j) {
    hn::StoreU(low[j], d, y + j * y_stride);
    hn::StoreU(high[j], d, y + j * y_stride + lanes);
  }
}

template <int kInputs>
void PanelTiles(const float* x, int64_t n, int64_t x_stride, const float* panel, int64_t depth, bool accumulate,
                float* y, int64_t y_stride, int64_t first_input) {
  for (int64_t i = first_input; i + kInputs <= n; i += kInputs) {
    PanelTile<kInputs>(x + i * x_stride, size_t(x_stride), panel, size_t(depth), accumulate, y + i * y_stride,
                       size_t(y_stride));
  }
}

// Every input against one panel chunk: whole tiles, then the remaining inputs one at a time.
void PanelChunk(const float* x, int64_t n, int64_t x_stride, const float* panel, int64_t depth, bool accumulate,
                float* y, int64_t y_stride) {
  PanelTiles<kTileInputs>(x, n, x_stride, panel, depth, accumulate, y, y_stride, 0);
  PanelTiles<1>(x, n, x_stride, panel, depth, accumulate, y, y_stride, n / kTileInputs * kTileInputs);
}

// panel[k, r] = float(w[row0 + r, col0 + k]) for r < valid rows (the rest 0), k < depth.
void PackPanel(const uint8_t* w, DType dtype, int64_t cols, int64_t row0, int valid, int panel_rows, int64_t col0,
               int64_t depth, float* widened, float* panel) {
  const size_t element = dtype_size_bytes(dtype);
  for (int r = 0; r < panel_rows; ++r) {
    if (r >= valid) {
      for (int64_t k = 0; k < depth; ++k) panel[k * panel_rows + r] = 0.0f;
      continue;
    }
    const uint8_t* row = w + (size_t(row0 + r) * size_t(cols) + size_t(col0)) * element;
    if (dtype == DType::kF32) {
      std::memcpy(widened, row, size_t(depth) * sizeof(float));
    } else {
      WidenHalf(reinterpret_cast<const uint16_t*>(row), dtype == DType::kBF16, widened, size_t(depth));
    }
    for (int64_t k = 0; k < depth; ++k) panel[k * panel_rows + r] = widened[k];
  }
}

void PanelGemmExport(const float* x, int64_t n, const void* w, DType dtype, int64_t rows, int64_t cols,
                     int64_t row_begin, int64_t row_end, float* y) {
  const DF d;
  const int panel_rows = int(2 * hn::Lanes(d));
  // This thread's panel and, for a partial panel, its outputs before they are copied to y.
  thread_local hwy::AlignedFreeUniquePtr<float[]> panel, partial;
  thread_local float widened[kDepthChunk];
  thread_local int64_t partial_inputs = 0;
  if (!panel) panel = hwy::AllocateAligned<float>(size_t(kDepthChunk) * size_t(panel_rows));
  for (int64_t row0 = row_begin; row0 < row_end; row0 += panel_rows) {
    const int valid = int(std::min<int64_t>(panel_rows, row_end - row0));
    // A full panel writes straight into y; a partial one into `partial` [n, panel_rows] first.
    float* out = y + row0;
    int64_t out_stride = rows;
    if (valid < panel_rows) {
      if (partial_inputs < n) {
        partial = hwy::AllocateAligned<float>(size_t(n) * size_t(panel_rows));
        partial_inputs = n;
      }
      out = partial.get();
      out_stride = panel_rows;
    }
    for (int64_t col0 = 0; col0 < cols; col0 += kDepthChunk) {
      const int64_t depth = std::min(kDepthChunk, cols - col0);
      PackPanel(static_cast<const uint8_t*>(w), dtype, cols, row0, valid, panel_rows, col0, depth, widened,
                panel.get());
      PanelChunk(x + col0, n, cols, panel.get(), depth, col0 > 0, out, out_stride);
    }
    if (valid < panel_rows) {
      for (int64_t i = 0; i < n; ++i) std::copy_n(out + i * panel_rows, valid, y + i * rows + row0);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace slimkv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace slimkv {

HWY_EXPORT(PanelGemmExport);

void panel_gemm(const float* x, int64_t n, const void* w, DType dtype, int64_t rows, int64_t cols, int64_t row_begin,
                int64_t row_end, float* y) {
  HWY_DYNAMIC_DISPATCH(PanelGemmExport)(x, n, w, dtype, rows, cols, row_begin, row_end, y);
}

}  // namespace slimkv
#endif  // HWY_ONCE
