#include "kv/rotation.h"

#include <bit>
#include <cmath>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/rotation.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"

// The transform runs per decode token on q and on the attention output of every head (and per prefill
// row): scalar, it was 4-5% of a 16-sequence decode step of the bundled model. The vector stages do the
// scalar butterflies' additions in the scalar order, so the bits are the same on every target.
HWY_BEFORE_NAMESPACE();
namespace slimkv {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The fast Walsh–Hadamard transform of a power-of-two length, scaled to be orthonormal: stages of
// butterflies x[i], x[i + half] ← x[i] + x[i + half], x[i] - x[i + half] for half = 1, 2, 4, ...
void WalshHadamard(float* HWY_RESTRICT x, int n) {
  const hn::ScalableTag<float> d;
  const int lanes = int(hn::Lanes(d));
  int half = 1;
#if HWY_TARGET != HWY_SCALAR
  if (n >= lanes) {
    // Stages within a vector: lane i pairs with lane i ^ half, the lower of the two takes the sum.
    const hn::RebindToSigned<decltype(d)> di;
    for (; half < lanes; half *= 2) {
      const auto partner = hn::IndicesFromVec(d, hn::Xor(hn::Iota(di, 0), hn::Set(di, half)));
      const auto lower = hn::RebindMask(d, hn::Eq(hn::And(hn::Iota(di, 0), hn::Set(di, half)), hn::Zero(di)));
      for (int i = 0; i < n; i += lanes) {
        const auto v = hn::LoadU(d, x + i), other = hn::TableLookupLanes(v, partner);
        hn::StoreU(hn::IfThenElse(lower, hn::Add(v, other), hn::Sub(other, v)), d, x + i);
      }
    }
  }
#endif
  for (; half < n; half *= 2) {
    for (int start = 0; start < n; start += 2 * half) {
      int i = start;
      if (half >= lanes) {  // whole vectors on both sides
        for (; i < start + half; i += lanes) {
          const auto a = hn::LoadU(d, x + i), b = hn::LoadU(d, x + i + half);
          hn::StoreU(hn::Add(a, b), d, x + i);
          hn::StoreU(hn::Sub(a, b), d, x + i + half);
        }
      }
      for (; i < start + half; ++i) {
        const float a = x[i], b = x[i + half];
        x[i] = a + b;
        x[i + half] = a - b;
      }
    }
  }
  const float scale = 1.0f / std::sqrt(float(n));
  int i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), hn::Set(d, scale)), d, x + i);
  for (; i < n; ++i) x[i] *= scale;
}

}  // namespace HWY_NAMESPACE
}  // namespace slimkv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace slimkv {

HWY_EXPORT(WalshHadamard);

void hadamard_rotate(float* x, int n) {
  int done = 0;
  for (int chunk = std::bit_floor(unsigned(n)); chunk >= 1; chunk /= 2) {  // largest power-of-two chunks first
    while (n - done >= chunk) {
      HWY_DYNAMIC_DISPATCH(WalshHadamard)(x + done, chunk);
      done += chunk;
    }
  }
}

}  // namespace slimkv
#endif  // HWY_ONCE
