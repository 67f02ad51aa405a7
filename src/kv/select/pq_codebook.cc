#include "kv/select/pq_codebook.h"

#include <algorithm>

#include "kv/select/kmeans.h"
#include "util/half.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/select/pq_codebook.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace slimkv {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// table [m, k] of q·centroid, centroids FP16 [m, d, k]: for each sub-space, Σ_j q[j] · row j of k
// centroid values, four vectors of centroids at a time (independent FMA chains), then one, then lanes.
void ScoreTable(const float* q, const uint16_t* centroids, int m, int d, int k, float* table) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const int lanes = int(hn::Lanes(df));
  const auto* c16 = reinterpret_cast<const hwy::float16_t*>(centroids);
  for (int s = 0; s < m; ++s) {
    const float* qs = q + size_t(s) * d;
    const hwy::float16_t* cs = c16 + size_t(s) * d * k;
    float* out = table + size_t(s) * k;
    int c = 0;
    for (; c + 4 * lanes <= k; c += 4 * lanes) {
      auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
      for (int j = 0; j < d; ++j) {
        const auto qj = hn::Set(df, qs[j]);
        const hwy::float16_t* row = cs + size_t(j) * k + c;
        a0 = hn::MulAdd(qj, hn::PromoteTo(df, hn::LoadU(dh, row)), a0);
        a1 = hn::MulAdd(qj, hn::PromoteTo(df, hn::LoadU(dh, row + lanes)), a1);
        a2 = hn::MulAdd(qj, hn::PromoteTo(df, hn::LoadU(dh, row + 2 * lanes)), a2);
        a3 = hn::MulAdd(qj, hn::PromoteTo(df, hn::LoadU(dh, row + 3 * lanes)), a3);
      }
      hn::StoreU(a0, df, out + c);
      hn::StoreU(a1, df, out + c + lanes);
      hn::StoreU(a2, df, out + c + 2 * lanes);
      hn::StoreU(a3, df, out + c + 3 * lanes);
    }
    for (; c + lanes <= k; c += lanes) {
      auto a = hn::Zero(df);
      for (int j = 0; j < d; ++j) {
        a = hn::MulAdd(hn::Set(df, qs[j]), hn::PromoteTo(df, hn::LoadU(dh, cs + size_t(j) * k + c)), a);
      }
      hn::StoreU(a, df, out + c);
    }
    for (; c < k; ++c) {  // fewer centroids than lanes (b < 4 on AVX-512)
      float sum = 0.0f;
      for (int j = 0; j < d; ++j) sum += qs[j] * fp16_to_float(centroids[(size_t(s) * d + size_t(j)) * k + size_t(c)]);
      out[c] = sum;
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace slimkv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace slimkv {

HWY_EXPORT(ScoreTable);

void PqCodebook::train(const float* vectors, int n, int max_iters, uint64_t seed) {
  const int k = centroids_per_space(), d = sub_dim();
  centroids_.resize(size_t(m_) * d * k);
  for (int s = 0; s < m_; ++s) {
    uint64_t space_seed = seed ^ (uint64_t(s + 1) * 0x9e3779b97f4a7c15ull);
    next_uniform(space_seed);  // stir, so seeds s and s+1 do not start from neighbouring states
    const std::vector<float> c = kmeans(vectors + size_t(s) * d, n, d, dim_, k, max_iters, space_seed);  // [k, d]
    for (int i = 0; i < k; ++i) {
      for (int j = 0; j < d; ++j) centroids_[(size_t(s) * d + j) * k + i] = float_to_fp16(c[size_t(i) * d + j]);
    }
  }
}

void PqCodebook::centroid(int s, int c, float* out) const {
  const int k = centroids_per_space(), d = sub_dim();
  for (int j = 0; j < d; ++j) out[j] = fp16_to_float(centroids_[(size_t(s) * d + j) * k + size_t(c)]);
}

void PqCodebook::encode(const float* vectors, int n, uint8_t* codes) const {
  const int k = centroids_per_space(), d = sub_dim();
  thread_local std::vector<int> nearest;
  thread_local std::vector<float> space;  // one sub-space's centroids as assign_nearest takes them, [k, d] FP32
  nearest.resize(size_t(n));
  space.resize(size_t(k) * d);
  for (int s = 0; s < m_; ++s) {
    for (int c = 0; c < k; ++c) centroid(s, c, space.data() + size_t(c) * d);
    assign_nearest(vectors + size_t(s) * d, n, d, dim_, space.data(), k, nearest.data());
    for (int i = 0; i < n; ++i) codes[size_t(i) * m_ + s] = uint8_t(nearest[size_t(i)]);
  }
}

void PqCodebook::score_table(const float* q, float* table) const {
  HWY_DYNAMIC_DISPATCH(ScoreTable)(q, centroids_.data(), m_, sub_dim(), centroids_per_space(), table);
}

void PqCodebook::score_table_reference(const float* q, float* table) const {
  const int k = centroids_per_space(), d = sub_dim();
  std::vector<float> c(static_cast<size_t>(d));
  for (int s = 0; s < m_; ++s) {
    for (int i = 0; i < k; ++i) {
      centroid(s, i, c.data());
      double sum = 0.0;
      for (int j = 0; j < d; ++j) sum += double(q[size_t(s) * d + j]) * c[size_t(j)];
      table[size_t(s) * k + i] = float(sum);
    }
  }
}

void PqCodebook::score_codes(const float* table, const uint8_t* codes, int n, float* scores) const {
  const int k = centroids_per_space();
  for (int i = 0; i < n; ++i) {
    float sum = 0.0f;
    for (int s = 0; s < m_; ++s) sum += table[size_t(s) * k + codes[size_t(i) * m_ + s]];
    scores[i] = sum;
  }
}

void PqCodebook::reconstruct(const uint8_t* code, float* out) const {
  for (int s = 0; s < m_; ++s) centroid(s, code[s], out + size_t(s) * sub_dim());
}

}  // namespace slimkv
#endif  // HWY_ONCE
