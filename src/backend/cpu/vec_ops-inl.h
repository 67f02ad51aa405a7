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

// Σ x[i]·float(w[i]) for BF16 (is_bf16) or FP16 weights, widened in registers.
HWY_INLINE float DotHalf(const float* HWY_RESTRICT x, const uint16_t* HWY_RESTRICT w, bool is_bf16, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  auto sum0 = hn::Zero(d);
  auto sum1 = hn::Zero(d);
  size_t i = 0;
  if (is_bf16) {
    const hn::Rebind<hwy::bfloat16_t, decltype(d)> dh;
    const auto* src = reinterpret_cast<const hwy::bfloat16_t*>(w);
    for (; i + 2 * lanes <= n; i += 2 * lanes) {
      sum0 = hn::MulAdd(hn::LoadU(d, x + i), hn::PromoteTo(d, hn::LoadU(dh, src + i)), sum0);
      sum1 = hn::MulAdd(hn::LoadU(d, x + i + lanes), hn::PromoteTo(d, hn::LoadU(dh, src + i + lanes)), sum1);
    }
    for (; i + lanes <= n; i += lanes) sum0 = hn::MulAdd(hn::LoadU(d, x + i), hn::PromoteTo(d, hn::LoadU(dh, src + i)), sum0);
  } else {
    const hn::Rebind<hwy::float16_t, decltype(d)> dh;
    const auto* src = reinterpret_cast<const hwy::float16_t*>(w);
    for (; i + 2 * lanes <= n; i += 2 * lanes) {
      sum0 = hn::MulAdd(hn::LoadU(d, x + i), hn::PromoteTo(d, hn::LoadU(dh, src + i)), sum0);
      sum1 = hn::MulAdd(hn::LoadU(d, x + i + lanes), hn::PromoteTo(d, hn::LoadU(dh, src + i + lanes)), sum1);
    }
    for (; i + lanes <= n; i += lanes) sum0 = hn::MulAdd(hn::LoadU(d, x + i), hn::PromoteTo(d, hn::LoadU(dh, src + i)), sum0);
  }
  float total = hn::GetLane(hn::SumOfLanes(d, hn::Add(sum0, sum1)));
  for (; i < n; ++i) total += x[i] * (is_bf16 ? bf16_to_float(w[i]) : fp16_to_float(w[i]));
  return total;
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
