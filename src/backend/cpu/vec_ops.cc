#include "backend/cpu/vec_ops.h"

#include <algorithm>
#include <cstring>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/vec_ops.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "backend/cpu/vec_ops-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace slimkv {
namespace HWY_NAMESPACE {

float DotExport(const float* a, const float* b, size_t n) { return Dot(a, b, n); }
void DotsExport(const float* q, int n_queries, const float* x, int n_rows, size_t n, float* out) {
  for (int i = 0; i < n_rows; ++i) {
    for (int r = 0; r < n_queries; ++r) *out++ = Dot(q + size_t(r) * n, x + size_t(i) * n, n);
  }
}
void MulAddToExport(float alpha, const float* x, float* y, size_t n) { MulAddTo(alpha, x, y, n); }
// Tiles of kTileRows rows x kTileInputs inputs: their accumulators, the widened weights and one input
// vector fill most of the registers (32 on AVX-512, 16 on AVX2 and below); the edges take smaller tiles.
constexpr int kTileRows = 4;
constexpr int kTileInputs = HWY_MAX_BYTES >= 64 ? 4 : 2;

// The tile [rows, inputs] (each at most the full tile) at row o, input i.
template <int kRows, class HalfTag>
void HalfTileOfInputs(int inputs, const float* x, const uint16_t* w, HalfTag dh, int64_t rows, int64_t cols, int64_t o,
                      int64_t i, float* y) {
  const float* xi = x + i * cols;
  const uint16_t* wo = w + o * cols;
  float* yo = y + i * rows + o;
  const size_t c = size_t(cols), r = size_t(rows);
  switch (inputs) {
    case 1: return HalfTile<kRows, 1>(xi, c, wo, c, dh, c, yo, r);
    case 2: return HalfTile<kRows, 2>(xi, c, wo, c, dh, c, yo, r);
#if HWY_MAX_BYTES >= 64
    case 3: return HalfTile<kRows, 3>(xi, c, wo, c, dh, c, yo, r);
    case 4: return HalfTile<kRows, 4>(xi, c, wo, c, dh, c, yo, r);
#endif
  }
}

template <class HalfTag>
void MatVecHalfRows(const float* x, int64_t n, const uint16_t* w, HalfTag dh, int64_t rows, int64_t cols,
                    int64_t row_begin, int64_t row_end, float* y) {
  for (int64_t o = row_begin; o < row_end; o += kTileRows) {
    const int tile_rows = int(std::min<int64_t>(kTileRows, row_end - o));
    for (int64_t i = 0; i < n; i += kTileInputs) {
      const int inputs = int(std::min<int64_t>(kTileInputs, n - i));
      switch (tile_rows) {
        case 1: HalfTileOfInputs<1>(inputs, x, w, dh, rows, cols, o, i, y); break;
        case 2: HalfTileOfInputs<2>(inputs, x, w, dh, rows, cols, o, i, y); break;
        case 3: HalfTileOfInputs<3>(inputs, x, w, dh, rows, cols, o, i, y); break;
        default: HalfTileOfInputs<kTileRows>(inputs, x, w, dh, rows, cols, o, i, y); break;
      }
    }
  }
}

void MatVecHalfExport(const float* x, int64_t n, const uint16_t* w, bool is_bf16, int64_t rows, int64_t cols,
                      int64_t row_begin, int64_t row_end, float* y) {
  const hn::ScalableTag<float> d;
  if (is_bf16) {
    MatVecHalfRows(x, n, w, hn::Rebind<hwy::bfloat16_t, decltype(d)>(), rows, cols, row_begin, row_end, y);
  } else {
    MatVecHalfRows(x, n, w, hn::Rebind<hwy::float16_t, decltype(d)>(), rows, cols, row_begin, row_end, y);
  }
}
void WidenHalfExport(const uint16_t* in, bool is_bf16, float* out, size_t n) { WidenHalf(in, is_bf16, out, n); }

}  // namespace HWY_NAMESPACE
}  // namespace slimkv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace slimkv {

HWY_EXPORT(DotExport);
HWY_EXPORT(DotsExport);
HWY_EXPORT(MulAddToExport);
HWY_EXPORT(WidenHalfExport);
HWY_EXPORT(MatVecHalfExport);

void matvec_half(const float* x, int64_t n, const uint16_t* w, DType dtype, int64_t rows, int64_t cols,
                 int64_t row_begin, int64_t row_end, float* y) {
  HWY_DYNAMIC_DISPATCH(MatVecHalfExport)(x, n, w, dtype == DType::kBF16, rows, cols, row_begin, row_end, y);
}

float dot(const float* a, const float* b, size_t n) { return HWY_DYNAMIC_DISPATCH(DotExport)(a, b, n); }

void dots(const float* q, int n_queries, const float* x, int n_rows, size_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(DotsExport)(q, n_queries, x, n_rows, n, out);
}

void mul_add_to(float alpha, const float* x, float* y, size_t n) {
  HWY_DYNAMIC_DISPATCH(MulAddToExport)(alpha, x, y, n);
}

void widen_to_f32(const void* in, DType dtype, float* out, size_t n) {
  if (dtype == DType::kF32) {
    std::memcpy(out, in, n * sizeof(float));
    return;
  }
  HWY_DYNAMIC_DISPATCH(WidenHalfExport)(static_cast<const uint16_t*>(in), dtype == DType::kBF16, out, n);
}

}  // namespace slimkv
#endif  // HWY_ONCE
