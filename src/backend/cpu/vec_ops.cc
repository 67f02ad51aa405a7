#include "backend/cpu/vec_ops.h"

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
// Inputs four at a time (eight accumulator chains), the rest one by one.
template <class HalfTag>
void MatVecHalfRows(const float* x, int64_t n, const uint16_t* w, HalfTag dh, int64_t rows, int64_t cols,
                    int64_t row_begin, int64_t row_end, float* y) {
  // Inputs in groups of 8 (16 accumulators and the widened weights fill AVX-512's 32 registers), then 4.
  float out[8];
  for (int64_t o = row_begin; o < row_end; ++o) {
    const uint16_t* row = w + size_t(o) * size_t(cols);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      DotsHalfRow<8>(x + i * cols, size_t(cols), row, dh, size_t(cols), out);
      for (int j = 0; j < 8; ++j) y[(i + j) * rows + o] = out[j];
    }
    for (; i + 4 <= n; i += 4) {
      DotsHalfRow<4>(x + i * cols, size_t(cols), row, dh, size_t(cols), out);
      for (int j = 0; j < 4; ++j) y[(i + j) * rows + o] = out[j];
    }
    for (; i < n; ++i) {
      DotsHalfRow<1>(x + i * cols, size_t(cols), row, dh, size_t(cols), out);
      y[i * rows + o] = out[0];
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
