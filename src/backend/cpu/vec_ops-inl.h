// SIMD building blocks, compiled once per CPU target by Highway (include from a file that sets
// HWY_TARGET_INCLUDE and includes hwy/foreach_target.h). Any length n: a vector body, a scalar tail.
#if defined(SLIMKV_BACKEND_CPU_VEC_OPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SLIMKV_BACKEND_CPU_VEC_OPS_INL_H_
#undef SLIMKV_BACKEND_CPU_VEC_OPS_INL_H_
#else
#define SLIMKV_BACKEND_CPU_VEC_OPS_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "hwy/highway.h"
#include "util/half.h"

HWY_BEFORE_NAMESPACE();
namespace slimkv {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Σ a[i]·b[i], FP32 accumulation in two independent vector chains.
HWY_INLINE float Dot(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  auto sum0 = hn::Zero(d);
  auto sum1 = hn::Zero(d);
  size_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    sum0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), sum0);
    sum1 = hn::MulAdd(hn::LoadU(d, a + i + lanes), hn::LoadU(d, b + i + lanes), sum1);
  }
  for (; i + lanes <= n; i += lanes) sum0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), sum0);
  float total = hn::GetLane(hn::SumOfLanes(d, hn::Add(sum0, sum1)));
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

// y[i] += alpha · x[i]
HWY_INLINE void MulAddTo(float alpha, const float* HWY_RESTRICT x, float* HWY_RESTRICT y, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const auto va = hn::Set(d, alpha);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::MulAdd(va, hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d, y + i);
  for (; i < n; ++i) y[i] += alpha * x[i];
}

// y[i] *= alpha
HWY_INLINE void ScaleBy(float alpha, float* HWY_RESTRICT y, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const auto va = hn::Set(d, alpha);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::Mul(va, hn::LoadU(d, y + i)), d, y + i);
  for (; i < n; ++i) y[i] *= alpha;
}

// y[j·y_stride + r] = Σ_i x_j[i]·float(w_r[i]) for a tile of kRows rows w_r = w + r·w_stride of BF16 or FP16
// weights (dh: the half type's tag) and kInputs inputs x_j = x + j·x_stride: each weight vector is widened
// in registers once for all inputs, each input vector loaded once for all rows (register blocking). Every
// (row, input) sum runs in its own vector chain over whole vectors, then across lanes, then over the
// scalar tail: the same order whatever the tile, so a batched decode gives each sequence the bits it gets
// alone, and kRows independent chains hide the FMA latency even for one input.
template <int kRows, int kInputs, class HalfTag>
HWY_INLINE void HalfTile(const float* HWY_RESTRICT x, size_t x_stride, const uint16_t* HWY_RESTRICT w,
                         size_t w_stride, HalfTag dh, size_t n, float* HWY_RESTRICT y, size_t y_stride) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  using V = decltype(hn::Zero(d));
  V sum[kRows][kInputs];
  for (int r = 0; r < kRows; ++r) {
    for (int j = 0; j < kInputs; ++j) sum[r][j] = hn::Zero(d);
  }
  const auto* src = reinterpret_cast<const hn::TFromD<HalfTag>*>(w);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    V wide[kRows];
    for (int r = 0; r < kRows; ++r) wide[r] = hn::PromoteTo(d, hn::LoadU(dh, src + r * w_stride + i));
    for (int j = 0; j < kInputs; ++j) {
      const V input = hn::LoadU(d, x + j * x_stride + i);
      for (int r = 0; r < kRows; ++r) sum[r][j] = hn::MulAdd(input, wide[r], sum[r][j]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int j = 0; j < kInputs; ++j) {
      float total = hn::GetLane(hn::SumOfLanes(d, sum[r][j]));
      for (size_t t = i; t < n; ++t) {
        const uint16_t bits = w[r * w_stride + t];
        const float weight = std::is_same_v<hn::TFromD<HalfTag>, hwy::bfloat16_t> ? bf16_to_float(bits) : fp16_to_float(bits);
        total += x[j * x_stride + t] * weight;
      }
      y[j * y_stride + r] = total;
    }
  }
}

// out[i] = float(in[i]) for BF16 (is_bf16) or IEEE FP16 bits.
HWY_INLINE void WidenHalf(const uint16_t* HWY_RESTRICT in, bool is_bf16, float* HWY_RESTRICT out, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  if (is_bf16) {
    const hn::Rebind<hwy::bfloat16_t, decltype(d)> dh;
    const auto* src = reinterpret_cast<const hwy::bfloat16_t*>(in);
    for (; i + lanes <= n; i += lanes) hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, src + i)), d, out + i);
    for (; i < n; ++i) out[i] = bf16_to_float(in[i]);
  } else {
    const hn::Rebind<hwy::float16_t, decltype(d)> dh;
    const auto* src = reinterpret_cast<const hwy::float16_t*>(in);
    for (; i + lanes <= n; i += lanes) hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, src + i)), d, out + i);
    for (; i < n; ++i) out[i] = fp16_to_float(in[i]);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace slimkv
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
