#include "attention/cpu/dense_block_attention.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "attention/cpu/spread_prefetch.h"

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
// decode; a tile of positions in prefill).
constexpr int kQueryBatch = 4;
// A query's scores, with room to round the block up to whole vectors (the widest target's 16 lanes).
constexpr int kScoreSlots = kMaxBlockTokens + 16;
// Accumulator vectors a loop keeps in registers: half of AVX-512's 32 vector registers, 8 elsewhere
// (AVX2 has 16; the rest hold the operands).
#if HWY_TARGET <= HWY_AVX3
constexpr int kAccumulators = 16;
#else
constexpr int kAccumulators = 8;
#endif

// The largest power of two <= n.
constexpr int FloorPow2(int n) { return n >= 2 ? 2 * FloorPow2(n / 2) : 1; }

// Sums of kCount vectors in one: lane i = Σ lanes of v[i] for kCount = the vector's lane count, by halving
// (pairwise sums of even and odd lanes keep each vector's partial sums contiguous and in order): a
// transposing reduction that costs about two operations per score instead of a full reduction each.
// For fewer vectors each keeps lanes / kCount lanes, the sums of its consecutive kCount-lane groups, so
// reducing groups of vectors first and then their results is the same tree (the same bits) as one call.
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

// Scores of kBatch queries against one whole vector of keys (lanes rows, k_dim apart), dims [0, body):
// scores[r][0..lanes) = q_r·k_t. Each key chunk is widened once for every query of the batch; keys go in
// passes of as many as keep the batch's accumulators (one per query and key) in registers, each pass
// reduced as far as its keys go and the passes' sums then together (SumEachToLane's tree). Asks for as
// much of the next block as it reads.
template <int kBatch, typename T>
HWY_INLINE void ScoreKeyVector(const float* q, const T* keys, int k_dim, int body, float (*scores)[kScoreSlots],
                               int j, SpreadPrefetch& ahead) {
  const DF df;
  constexpr size_t kLanes = HWY_LANES(float);
  constexpr size_t kKeys = std::min(kLanes, size_t(FloorPow2(kAccumulators / kBatch)));
  constexpr size_t kPasses = kLanes / kKeys;
  VF pass_sums[kBatch][kPasses];
  for (size_t pass = 0; pass < kPasses; ++pass) {
    const T* pass_keys = keys + pass * kKeys * size_t(k_dim);
    VF acc[kBatch][kKeys];
    for (int r = 0; r < kBatch; ++r) {
      for (size_t t = 0; t < kKeys; ++t) acc[r][t] = hn::Zero(df);
    }
    for (int c = 0; c < body; c += int(kLanes)) {
      VF query_part[kBatch];
      for (int r = 0; r < kBatch; ++r) query_part[r] = hn::LoadU(df, q + size_t(r) * size_t(k_dim) + c);
      for (size_t t = 0; t < kKeys; ++t) {
        const VF key_part = LoadWide(pass_keys + t * size_t(k_dim) + c);
        for (int r = 0; r < kBatch; ++r) acc[r][t] = hn::MulAdd(query_part[r], key_part, acc[r][t]);
      }
      ahead.advance(kKeys * kLanes * sizeof(T));
    }
    for (int r = 0; r < kBatch; ++r) pass_sums[r][pass] = SumEachToLane<kKeys>(df, acc[r]);
  }
  for (int r = 0; r < kBatch; ++r) hn::StoreU(SumEachToLane<kPasses>(df, pass_sums[r]), df, scores[r] + j);
}
#endif

// Scores of kBatch queries (rows of q, k_dim apart) against tokens [0, n) of k: scores[r][j] = q_r·k_j.
// A vector's worth of keys at a time (ScoreKeyVector); the keys past the last whole vector (and dims past
// the last whole vector) one by one.
template <int kBatch, typename T>
HWY_INLINE void BlockScores(const float* q, const T* k, int n, int k_dim, float (*scores)[kScoreSlots],
                            [[maybe_unused]] SpreadPrefetch& ahead) {
  const DF df;
  const int lanes = int(hn::Lanes(df));
  const int body = k_dim / lanes * lanes;
  int j = 0;
#if HWY_TARGET != HWY_SCALAR
  for (; lanes == int(HWY_LANES(float)) && j + lanes <= n; j += lanes) {
    const T* keys = k + size_t(j) * size_t(k_dim);
    ScoreKeyVector<kBatch>(q, keys, k_dim, body, scores, j, ahead);
    for (int r = 0; r < kBatch && body < k_dim; ++r) {
      const float* query = q + size_t(r) * size_t(k_dim);
      for (int t = 0; t < lanes; ++t) {
        for (int c = body; c < k_dim; ++c) scores[r][j + t] += query[c] * ToFloat(keys[size_t(t) * size_t(k_dim) + size_t(c)]);
      }
    }
  }
#endif
  for (; j < n; ++j) {
    const T* key = k + size_t(j) * size_t(k_dim);
    VF acc[kBatch];
    for (int r = 0; r < kBatch; ++r) acc[r] = hn::Zero(df);
    for (int c = 0; c < body; c += lanes) {
      const VF key_part = LoadWide(key + c);
      for (int r = 0; r < kBatch; ++r) acc[r] = hn::MulAdd(hn::LoadU(df, q + size_t(r) * size_t(k_dim) + c), key_part, acc[r]);
    }
    for (int r = 0; r < kBatch; ++r) {
      float score = hn::GetLane(hn::SumOfLanes(df, acc[r]));
      for (int c = body; c < k_dim; ++c) score += q[size_t(r) * size_t(k_dim) + size_t(c)] * ToFloat(key[c]);
      scores[r][j] = score;
    }
  }
}

// acc_r[c, c + kColumns·lanes) += Σ_j weights[r][j] · v_j over rows [0, seen) of v, kColumns vectors of
// columns at a time with the batch's accumulators in registers: the rows are read in order, each value
// chunk loaded once for the whole batch. Asks for as much of the next block as it reads.
template <int kBatch, int kColumns, typename T>
HWY_INLINE void FoldColumns(float (*weights)[kScoreSlots], const T* v, int seen, int v_dim, int c,
                            AttentionPartials& partials, int first_partial, SpreadPrefetch& ahead) {
  const DF df;
  const int lanes = int(hn::Lanes(df));
  VF acc[kBatch][kColumns];
  for (int r = 0; r < kBatch; ++r) {
    for (int i = 0; i < kColumns; ++i) acc[r][i] = hn::LoadU(df, partials.acc(first_partial + r) + c + i * lanes);
  }
  for (int j = 0; j < seen; ++j) {
    const T* row = v + size_t(j) * size_t(v_dim) + c;
    VF weight[kBatch];
    for (int r = 0; r < kBatch; ++r) weight[r] = hn::Set(df, weights[r][j]);
    for (int i = 0; i < kColumns; ++i) {
      const VF value = LoadWide(row + i * lanes);
      for (int r = 0; r < kBatch; ++r) acc[r][i] = hn::MulAdd(weight[r], value, acc[r][i]);
    }
    ahead.advance(kColumns * lanes * sizeof(T));
  }
  for (int r = 0; r < kBatch; ++r) {
    for (int i = 0; i < kColumns; ++i) hn::StoreU(acc[r][i], df, partials.acc(first_partial + r) + c + i * lanes);
  }
}

// Whole vectors of columns [c, c + vectors·lanes) in groups of kColumns, then of halves of it.
template <int kBatch, int kColumns, typename T>
HWY_INLINE void FoldColumnGroups(float (*weights)[kScoreSlots], const T* v, int seen, int v_dim, int c, int vectors,
                                 AttentionPartials& partials, int first_partial, SpreadPrefetch& ahead) {
  const int lanes = int(hn::Lanes(DF()));
  for (; vectors >= kColumns; vectors -= kColumns, c += kColumns * lanes) {
    FoldColumns<kBatch, kColumns>(weights, v, seen, v_dim, c, partials, first_partial, ahead);
  }
  if constexpr (kColumns > 1) {
    FoldColumnGroups<kBatch, kColumns / 2>(weights, v, seen, v_dim, c, vectors, partials, first_partial, ahead);
  }
}

// The online-softmax fold of kBatch queries over tokens [0, visible[r]) of a block whose scores are
// given: each partial is rescaled to its new running max, the scores become their weights
// exp(s - max) in place (0 past a query's visible tokens), then acc += Σ_j weight_j · v_j
// (FoldColumnGroups; each accumulator lane sums its rows in order, whatever the grouping).
template <int kBatch, typename T>
HWY_INLINE void FoldScores(float (*scores)[kScoreSlots], const int* visible, const T* v, int v_dim,
                           AttentionPartials& partials, int first_partial, SpreadPrefetch& ahead) {
  const DF df;
  const int lanes = int(hn::Lanes(df));
  int seen = 0;  // tokens any query of the batch sees
  for (int r = 0; r < kBatch; ++r) seen = std::max(seen, visible[r]);
  const int slots = (seen + lanes - 1) / lanes * lanes;  // whole vectors of scores
  for (int r = 0; r < kBatch; ++r) std::fill(scores[r] + std::max(visible[r], 0), scores[r] + slots, -INFINITY);
  for (int r = 0; r < kBatch; ++r) {
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
  for (int r = 0; r < kBatch; ++r) {
    if (visible[r] <= 0) std::fill(scores[r], scores[r] + slots, 0.0f);  // a query that sees nothing adds 0
  }
  const int body = v_dim / lanes * lanes;
  FoldColumnGroups<kBatch, FloorPow2(kAccumulators / kBatch)>(scores, v, seen, v_dim, 0, body / lanes, partials,
                                                               first_partial, ahead);
  for (int r = 0; r < kBatch; ++r) {
    float* acc = partials.acc(first_partial + r);
    for (int j = 0; j < seen; ++j) {
      for (int c = body; c < v_dim; ++c) acc[c] += scores[r][j] * ToFloat(v[size_t(j) * size_t(v_dim) + size_t(c)]);
    }
  }
}

// Calls f(std::integral_constant<int, batch>) for a batch of 1 to kQueryBatch queries.
template <typename F>
HWY_INLINE void WithBatch(int batch, const F& f) {
  switch (batch) {
    case 1: return f(std::integral_constant<int, 1>());
    case 2: return f(std::integral_constant<int, 2>());
    case 3: return f(std::integral_constant<int, 3>());
    default: return f(std::integral_constant<int, kQueryBatch>());
  }
}

template <typename T>
void AttendBlock(const QueryTile& tile, const T* k, const T* v, int k_dim, int v_dim, AttentionPartials& partials,
                 int first_partial, SpreadPrefetch& ahead) {
  HWY_ALIGN float scores[kQueryBatch][kScoreSlots];
  for (int first = 0; first < tile.n_queries; first += kQueryBatch) {
    const int batch = std::min(kQueryBatch, tile.n_queries - first);
    const int seen = *std::max_element(tile.visible + first, tile.visible + first + batch);
    if (seen <= 0) continue;
    WithBatch(batch, [&](auto batch_size) {
      constexpr int kBatch = decltype(batch_size)::value;
      BlockScores<kBatch>(tile.q + size_t(first) * size_t(k_dim), k, seen, k_dim, scores, ahead);
      FoldScores<kBatch>(scores, tile.visible + first, v, v_dim, partials, first_partial + first, ahead);
    });
  }
}

// A block of T rows; FP16/BF16 ones widened in registers where both dims are whole vectors.
template <typename T>
void AttendBlockOf(const QueryTile& tile, const T* k, const T* v, int k_dim, int v_dim, AttentionPartials& partials,
                   int first_partial, SpreadPrefetch& ahead) {
  const int lanes = int(hn::Lanes(DF()));
  if (std::is_same_v<T, float> || (k_dim % lanes == 0 && v_dim % lanes == 0)) {
    AttendBlock(tile, k, v, k_dim, v_dim, partials, first_partial, ahead);
    return;
  }
  // Dims with a scalar tail: the compiler may contract the tail's products into FMAs differently in
  // each instantiation, so such rows are widened first and take the FP32 kernel itself (the same bits).
  const int tokens = *std::max_element(tile.visible, tile.visible + tile.n_queries);
  if (tokens <= 0) return;
  thread_local std::vector<float> wide_k, wide_v;
  wide_k.resize(size_t(tokens) * size_t(k_dim));
  wide_v.resize(size_t(tokens) * size_t(v_dim));
  for (size_t i = 0; i < wide_k.size(); ++i) wide_k[i] = ToFloat(k[i]);
  for (size_t i = 0; i < wide_v.size(); ++i) wide_v[i] = ToFloat(v[i]);
  AttendBlock(tile, wide_k.data(), wide_v.data(), k_dim, v_dim, partials, first_partial, ahead);
}

void AttendBlockF32(const QueryTile& tile, const float* k, const float* v, int k_dim, int v_dim,
                    AttentionPartials& partials, int first_partial) {
  SpreadPrefetch nothing(nullptr, 0);
  AttendBlockOf(tile, k, v, k_dim, v_dim, partials, first_partial, nothing);
}

void AttendBlockHalf(const QueryTile& tile, const uint16_t* k, const uint16_t* v, bool is_bf16, int k_dim, int v_dim,
                     AttentionPartials& partials, int first_partial) {
  SpreadPrefetch nothing(nullptr, 0);
  if (is_bf16) {
    AttendBlockOf(tile, reinterpret_cast<const hwy::bfloat16_t*>(k), reinterpret_cast<const hwy::bfloat16_t*>(v),
                  k_dim, v_dim, partials, first_partial, nothing);
  } else {
    AttendBlockOf(tile, reinterpret_cast<const hwy::float16_t*>(k), reinterpret_cast<const hwy::float16_t*>(v), k_dim,
                  v_dim, partials, first_partial, nothing);
  }
}

// A run of blocks, each K then V in T, asking for the next block's lines while one is read.
template <typename T>
void AttendRunOf(std::span<const uint8_t* const> blocks, const BlockShape& shape, const QueryTile& tile,
                 AttentionPartials& partials, int first_partial) {
  const size_t bytes = size_t(shape.block_tokens) * size_t(shape.k_dim + shape.v_dim) * sizeof(T);
  for (size_t i = 0; i < blocks.size(); ++i) {
    SpreadPrefetch ahead(i + 1 < blocks.size() ? blocks[i + 1] : nullptr, bytes);
    const auto* k = reinterpret_cast<const T*>(blocks[i]);
    AttendBlockOf(tile, k, k + size_t(shape.block_tokens) * size_t(shape.k_dim), shape.k_dim, shape.v_dim, partials,
                  first_partial, ahead);
    ahead.finish();
  }
}

void AttendDenseBlocks(std::span<const uint8_t* const> blocks, DType dtype, const BlockShape& shape,
                       const QueryTile& tile, AttentionPartials& partials, int first_partial) {
  switch (dtype) {
    case DType::kF32: return AttendRunOf<float>(blocks, shape, tile, partials, first_partial);
    case DType::kF16: return AttendRunOf<hwy::float16_t>(blocks, shape, tile, partials, first_partial);
    case DType::kBF16: return AttendRunOf<hwy::bfloat16_t>(blocks, shape, tile, partials, first_partial);
  }
}

void AttendScoredF32(const float* given, float scale, int n_queries, const float* v, int n, int v_dim,
                     AttentionPartials& partials, int first_partial) {
  HWY_ALIGN float scores[kQueryBatch][kScoreSlots];
  const int visible[kQueryBatch] = {n, n, n, n};
  SpreadPrefetch nothing(nullptr, 0);
  for (int first = 0; n > 0 && first < n_queries; first += kQueryBatch) {
    const int batch = std::min(kQueryBatch, n_queries - first);
    for (int r = 0; r < batch; ++r) {
      for (int j = 0; j < n; ++j) scores[r][j] = given[size_t(j) * size_t(n_queries) + size_t(first + r)] * scale;
    }
    WithBatch(batch, [&](auto batch_size) {
      FoldScores<decltype(batch_size)::value>(scores, visible, v, v_dim, partials, first_partial + first, nothing);
    });
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace slimkv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace slimkv {

HWY_EXPORT(AttendBlockF32);
HWY_EXPORT(AttendBlockHalf);
HWY_EXPORT(AttendDenseBlocks);
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

void attend_dense_blocks(std::span<const uint8_t* const> blocks, DType dtype, const BlockShape& shape,
                         const QueryTile& tile, AttentionPartials& partials, int first_partial) {
  HWY_DYNAMIC_DISPATCH(AttendDenseBlocks)(blocks, dtype, shape, tile, partials, first_partial);
}

void attend_scored_f32(const float* scores, float scale, int n_queries, const float* v, int n, int v_dim,
                       AttentionPartials& partials, int first_partial) {
  HWY_DYNAMIC_DISPATCH(AttendScoredF32)(scores, scale, n_queries, v, n, v_dim, partials, first_partial);
}

}  // namespace slimkv
#endif  // HWY_ONCE
