#include "attention/cpu/dense_block_attention.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/cpu/dense_block_attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "util/half.h"

HWY_BEFORE_NAMESPACE();
namespace slimkv {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Keys and values are read as FP32, or as FP16/BF16 widened in registers (exactly: every half value is
// a float), so a half-precision block costs no widened copy and gives the bits the FP32 kernel gives
// over its widened rows.
template <typename T>
HWY_INLINE VF LoadWide(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(DF(), p);
  } else {
    return hn::PromoteTo(DF(), hn::LoadU(hn::Rebind<T, DF>(), p));
  }
}

template <typename T>
HWY_INLINE float ToFloat(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    uint16_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    return std::is_same_v<T, hwy::bfloat16_t> ? bf16_to_float(bits) : fp16_to_float(bits);
  }
}

// Queries folded together: each key and value row is loaded once for all of them (a GQA group in
// decode; a tile of positions in prefill). Four keep their accumulators in registers on every target.
constexpr int kQueryBatch = 4;
// A query's scores, with room to round the block up to whole vectors (the widest target's 16 lanes).
constexpr int kScoreSlots = kMaxBlockTokens + 16;

// Sums of kCount vectors in one: lane i = Σ lanes of v[i] for kCount = the vector's lane count, by halving
// (pairwise sums of even and odd lanes keep each vector's partial sums contiguous and in order): a
// transposing reduction that costs about two operations per score instead of a full reduction each.
// (The scalar target, one lane, has no lanes to reduce and no ConcatEven.)
#if HWY_TARGET != HWY_SCALAR
template <size_t kCount>
HWY_INLINE VF SumEachToLane(DF d, const VF* v) {
  if constexpr (kCount == 1) {
    return v[0];
  } else {
    VF half[kCount / 2];
    for (size_t i = 0; i < kCount / 2; ++i) {
      half[i] = hn::Add(hn::ConcatEven(d, v[2 * i + 1], v[2 * i]), hn::ConcatOdd(d, v[2 * i + 1], v[2 * i]));
    }
    return SumEachToLane<kCount / 2>(d, half);
  }
}
#endif

// Scores of `batch` queries (rows of q, k_dim apart) against tokens [0, n) of k: scores[r][j] = q_r·k_j.
// A vector's worth of keys at a time per query: one accumulator per key, reduced together into a vector
// of scores; the keys past the last whole vector (and dims past the last whole vector) one by one.
template <typename T>
HWY_INLINE void BlockScores(const float* q, int batch, const T* k, int n, int k_dim, float (*scores)[kScoreSlots]) {
  const DF df;
  const int lanes = int(hn::Lanes(df));
  const int body = k_dim / lanes * lanes;
  int j = 0;
#if HWY_TARGET != HWY_SCALAR
  {
    constexpr size_t kLanes = HWY_LANES(float);
    for (; lanes == int(kLanes) && j + lanes <= n; j += lanes) {
      const T* keys = k + size_t(j) * size_t(k_dim);
      for (int r = 0; r < batch; ++r) {
        const float* query = q + size_t(r) * size_t(k_dim);
        VF acc[kLanes];
        for (size_t t = 0; t < kLanes; ++t) acc[t] = hn::Zero(df);
        for (int c = 0; c < body; c += lanes) {
          const VF query_part = hn::LoadU(df, query + c);
          for (size_t t = 0; t < kLanes; ++t) acc[t] = hn::MulAdd(query_part, LoadWide(keys + t * size_t(k_dim) + c), acc[t]);
        }
        hn::StoreU(SumEachToLane<kLanes>(df, acc), df, scores[r] + j);
        for (int t = 0; t < lanes && body < k_dim; ++t) {
          for (int c = body; c < k_dim; ++c) scores[r][j + t] += query[c] * ToFloat(keys[size_t(t) * size_t(k_dim) + size_t(c)]);
        }
      }
    }
  }
#endif
  for (; j < n; ++j) {
    const T* key = k + size_t(j) * size_t(k_dim);
    VF acc[kQueryBatch];
    for (int r = 0; r < batch; ++r) acc[r] = hn::Zero(df);
    for (int c = 0; c < body; c += lanes) {
      const VF key_part = LoadWide(key + c);
      for (int r = 0; r < batch; ++r) acc[r] = hn::MulAdd(hn::LoadU(df, q + size_t(r) * size_t(k_dim) + c), key_part, acc[r]);
    }
    for (int r = 0; r < batch; ++r) {
      float score = hn::GetLane(hn::SumOfLanes(df, acc[r]));
      for (int c = body; c < k_dim; ++c) score += q[size_t(r) * size_t(k_dim) + size_t(c)] * ToFloat(key[c]);
      scores[r][j] = score;
    }
  }
}

// The online-softmax fold of a batch of queries over tokens [0, visible[r]) of a block whose scores
// are given: each partial is rescaled to its new running max, the scores become their weights
// exp(s - max) in place (0 past a query's visible tokens), then acc += Σ_j weight_j · v_j runs over
// value columns a vector at a time with the batch's accumulators in registers, each value row loaded
// once for the whole batch.
template <typename T>
HWY_INLINE void FoldScores(float (*scores)[kScoreSlots], const int* visible, int batch, const T* v, int v_dim,
                           AttentionPartials& partials, int first_partial) {
  const DF df;
  const int lanes = int(hn::Lanes(df));
  int seen = 0;  // tokens any query of the batch sees
  for (int r = 0; r < batch; ++r) seen = std::max(seen, visible[r]);
  const int slots = (seen + lanes - 1) / lanes * lanes;  // whole vectors of scores
  for (int r = 0; r < batch; ++r) std::fill(scores[r] + std::max(visible[r], 0), scores[r] + slots, -INFINITY);
  for (int r = 0; r < batch; ++r) {
    if (visible[r] <= 0) continue;
    float* s = scores[r];
    VF maxima = hn::Set(df, -INFINITY);
    for (int j = 0; j < slots; j += lanes) maxima = hn::Max(maxima, hn::LoadU(df, s + j));
    const int index = first_partial + r;
    partials.rescale(index, std::max(partials.max(index), hn::GetLane(hn::MaxOfLanes(df, maxima))));
    const VF running_max = hn::Set(df, partials.max(index));
    VF sums = hn::Zero(df);
    for (int j = 0; j < slots; j += lanes) {
      const VF weight = hn::Exp(df, hn::Sub(hn::LoadU(df, s + j), running_max));  // exp(-inf) = 0
      sums = hn::Add(sums, weight);
      hn::StoreU(weight, df, s + j);
    }
    partials.sum(index) += hn::GetLane(hn::SumOfLanes(df, sums));
  }
  for (int r = 0; r < batch; ++r) {
    if (visible[r] <= 0) std::fill(scores[r], scores[r] + slots, 0.0f);  // a query that sees nothing adds 0
  }
  const int body = v_dim / lanes * lanes;
  for (int c = 0; c < body; c += lanes) {
    VF acc[kQueryBatch];
    for (int r = 0; r < batch; ++r) acc[r] = hn::LoadU(df, partials.acc(first_partial + r) + c);
    for (int j = 0; j < seen; ++j) {
      const VF value = LoadWide(v + size_t(j) * size_t(v_dim) + c);
      for (int r = 0; r < batch; ++r) acc[r] = hn::MulAdd(hn::Set(df, scores[r][j]), value, acc[r]);
    }
    for (int r = 0; r < batch; ++r) hn::StoreU(acc[r], df, partials.acc(first_partial + r) + c);
  }
  for (int r = 0; r < batch; ++r) {
    float* acc = partials.acc(first_partial + r);
    for (int j = 0; j < seen; ++j) {
      for (int c = body; c < v_dim; ++c) acc[c] += scores[r][j] * ToFloat(v[size_t(j) * size_t(v_dim) + size_t(c)]);
    }
  }
}

template <typename T>
void AttendBlock(const QueryTile& tile, const T* k, const T* v, int k_dim, int v_dim, AttentionPartials& partials,
                 int first_partial) {
  HWY_ALIGN float scores[kQueryBatch][kScoreSlots];
  for (int first = 0; first < tile.n_queries; first += kQueryBatch) {
    const int batch = std::min(kQueryBatch, tile.n_queries - first);
    const int seen = *std::max_element(tile.visible + first, tile.visible + first + batch);
    if (seen <= 0) continue;
    BlockScores(tile.q + size_t(first) * size_t(k_dim), batch, k, seen, k_dim, scores);
    FoldScores(scores, tile.visible + first, batch, v, v_dim, partials, first_partial + first);
  }
}

void AttendBlockF32(const QueryTile& tile, const float* k, const float* v, int k_dim, int v_dim,
                    AttentionPartials& partials, int first_partial) {
  AttendBlock(tile, k, v, k_dim, v_dim, partials, first_partial);
}

template <typename T>
void AttendBlockOf(const QueryTile& tile, const uint16_t* k, const uint16_t* v, int k_dim, int v_dim,
                   AttentionPartials& partials, int first_partial) {
  const auto* keys = reinterpret_cast<const T*>(k);
  const auto* values = reinterpret_cast<const T*>(v);
  const int lanes = int(hn::Lanes(DF()));
  if (k_dim % lanes == 0 && v_dim % lanes == 0) {
    AttendBlock(tile, keys, values, k_dim, v_dim, partials, first_partial);
    return;
  }
  // Dims with a scalar tail: the compiler may contract the tail's products into FMAs differently in
  // each instantiation, so such rows are widened first and take the FP32 kernel itself (the same bits).
  const int tokens = *std::max_element(tile.visible, tile.visible + tile.n_queries);
  if (tokens <= 0) return;
  thread_local std::vector<float> wide_k, wide_v;
  wide_k.resize(size_t(tokens) * size_t(k_dim));
  wide_v.resize(size_t(tokens) * size_t(v_dim));
  for (size_t i = 0; i < wide_k.size(); ++i) wide_k[i] = ToFloat(keys[i]);
  for (size_t i = 0; i < wide_v.size(); ++i) wide_v[i] = ToFloat(values[i]);
  AttendBlock(tile, wide_k.data(), wide_v.data(), k_dim, v_dim, partials, first_partial);
}

void AttendBlockHalf(const QueryTile& tile, const uint16_t* k, const uint16_t* v, bool is_bf16, int k_dim, int v_dim,
                     AttentionPartials& partials, int first_partial) {
  if (is_bf16) {
    AttendBlockOf<hwy::bfloat16_t>(tile, k, v, k_dim, v_dim, partials, first_partial);
  } else {
    AttendBlockOf<hwy::float16_t>(tile, k, v, k_dim, v_dim, partials, first_partial);
  }
}

void AttendScoredF32(const float* given, float scale, int n_queries, const float* v, int n, int v_dim,
                     AttentionPartials& partials, int first_partial) {
  HWY_ALIGN float scores[kQueryBatch][kScoreSlots];
  const int visible[kQueryBatch] = {n, n, n, n};
  for (int first = 0; n > 0 && first < n_queries; first += kQueryBatch) {
    const int batch = std::min(kQueryBatch, n_queries - first);
    for (int r = 0; r < batch; ++r) {
      for (int j = 0; j < n; ++j) scores[r][j] = given[size_t(j) * size_t(n_queries) + size_t(first + r)] * scale;
    }
    FoldScores(scores, visible, batch, v, v_dim, partials, first_partial + first);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace slimkv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace slimkv {

HWY_EXPORT(AttendBlockF32);
HWY_EXPORT(AttendBlockHalf);
HWY_EXPORT(AttendScoredF32);

void attend_block_f32(const QueryTile& tile, const float* k, const float* v, int k_dim, int v_dim,
                      AttentionPartials& partials, int first_partial) {
  HWY_DYNAMIC_DISPATCH(AttendBlockF32)(tile, k, v, k_dim, v_dim, partials, first_partial);
}

void attend_block_half(const QueryTile& tile, const uint16_t* k, const uint16_t* v, DType dtype, int k_dim, int v_dim,
                       AttentionPartials& partials, int first_partial) {
  assert(dtype == DType::kF16 || dtype == DType::kBF16);
  HWY_DYNAMIC_DISPATCH(AttendBlockHalf)(tile, k, v, dtype == DType::kBF16, k_dim, v_dim, partials, first_partial);
}

void attend_scored_f32(const float* scores, float scale, int n_queries, const float* v, int n, int v_dim,
                       AttentionPartials& partials, int first_partial) {
  HWY_DYNAMIC_DISPATCH(AttendScoredF32)(scores, scale, n_queries, v, n, v_dim, partials, first_partial);
}

}  // namespace slimkv
#endif  // HWY_ONCE
