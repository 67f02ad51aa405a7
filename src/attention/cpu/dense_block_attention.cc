#include "attention/cpu/dense_block_attention.h"

#include <algorithm>
#include <cmath>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/cpu/dense_block_attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "backend/cpu/vec_ops-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace slimkv {
namespace HWY_NAMESPACE {

// Folds n tokens of scores [n] (scaled) and values v [n, v_dim] into partial p.
HWY_INLINE void FoldScores(const float* scores, const float* v, int n, int v_dim, AttentionPartials& partials, int p) {
  float block_max = -INFINITY;
  for (int j = 0; j < n; ++j) block_max = std::max(block_max, scores[j]);
  partials.rescale(p, std::max(partials.max(p), block_max));
  const float running_max = partials.max(p);
  float* acc = partials.acc(p);
  float sum = 0.0f;
  for (int j = 0; j < n; ++j) {
    const float weight = std::exp(scores[j] - running_max);
    sum += weight;
    MulAddTo(weight, v + size_t(j) * size_t(v_dim), acc, size_t(v_dim));
  }
  partials.sum(p) += sum;
}

void AttendBlockF32(const QueryTile& tile, const float* k, const float* v, int k_dim, int v_dim,
                    AttentionPartials& partials, int first_partial) {
  float scores[kMaxBlockTokens];
  for (int i = 0; i < tile.n_queries; ++i) {
    const int n = tile.visible[i];
    if (n <= 0) continue;
    const float* q = tile.q + size_t(i) * size_t(k_dim);
    for (int j = 0; j < n; ++j) scores[j] = Dot(q, k + size_t(j) * size_t(k_dim), size_t(k_dim));
    FoldScores(scores, v, n, v_dim, partials, first_partial + i);
  }
}

void AttendScoredF32(const float* given, float scale, int n_queries, const float* v, int n, int v_dim,
                     AttentionPartials& partials, int first_partial) {
  float scores[kMaxBlockTokens];
  for (int i = 0; n > 0 && i < n_queries; ++i) {
    for (int j = 0; j < n; ++j) scores[j] = given[size_t(j) * size_t(n_queries) + size_t(i)] * scale;
    FoldScores(scores, v, n, v_dim, partials, first_partial + i);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace slimkv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace slimkv {

HWY_EXPORT(AttendBlockF32);
HWY_EXPORT(AttendScoredF32);

void attend_block_f32(const QueryTile& tile, const float* k, const float* v, int k_dim, int v_dim,
                      AttentionPartials& partials, int first_partial) {
  HWY_DYNAMIC_DISPATCH(AttendBlockF32)(tile, k, v, k_dim, v_dim, partials, first_partial);
}

void attend_scored_f32(const float* scores, float scale, int n_queries, const float* v, int n, int v_dim,
                       AttentionPartials& partials, int first_partial) {
  HWY_DYNAMIC_DISPATCH(AttendScoredF32)(scores, scale, n_queries, v, n, v_dim, partials, first_partial);
}

}  // namespace slimkv
#endif  // HWY_ONCE
