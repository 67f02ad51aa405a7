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

// out[j] = Σ x_j[i]·float(w[i]) for kInputs inputs x_j = x + j·x_stride against one row of BF16 or FP16
// weights (dh: the half type's tag), widened in registers once for all of them. Each input's sum runs
// in the same order whatever kInputs is (two vector chains, then the scalar tail), so a row's result
// for an input does not depend on how many inputs share the call: a batched decode gives each sequence
// the bits it gets alone.
template <int kInputs, class HalfTag>
HWY_INLINE void DotsHalfRow(const float* HWY_RESTRICT x, size_t x_stride, const uint16_t* HWY_RESTRICT w, HalfTag dh,
                            size_t n, float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  using V = decltype(hn::Zero(d));
  V sum0[kInputs], sum1[kInputs];
  for (int j = 0; j < kInputs; ++j) sum0[j] = sum1[j] = hn::Zero(d);
  const auto* src = reinterpret_cast<const hn::TFromD<HalfTag>*>(w);
  size_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    const auto w0 = hn::PromoteTo(d, hn::LoadU(dh, src + i));
    const auto w1 = hn::PromoteTo(d, hn::LoadU(dh, src + i + lanes));
    for (int j = 0; j < kInputs; ++j) {
      sum0[j] = hn::MulAdd(hn::LoadU(d, x + j * x_stride + i), w0, sum0[j]);
      sum1[j] = hn::MulAdd(hn::LoadU(d, x + j * x_stride + i + lanes), w1, sum1[j]);
    }
  }
  for (; i + lanes <= n; i += lanes) {
    const auto w0 = hn::PromoteTo(d, hn::LoadU(dh, src + i));
    for (int j = 0; j < kInputs; ++j) sum0[j] = hn::MulAdd(hn::LoadU(d, x + j * x_stride + i), w0, sum0[j]);
  }
  for (int j = 0; j < kInputs; ++j) {
    float total = hn::GetLane(hn::SumOfLanes(d, hn::Add(sum0[j], sum1[j])));
    for (size_t t = i; t < n; ++t) {
      const float weight = std::is_same_v<hn::TFromD<HalfTag>, hwy::bfloat16_t> ? bf16_to_float(w[t]) : fp16_to_float(w[t]);
      total += x[j * x_stride + t] * weight;
    }
    out[j] = total;
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
