// top_k_indices (kv/select/top_k.h) against its sort-based reference: every k of short lengths, ties
// (scores from a few values, or all equal), a wide range, and the lengths a 64K decode step ranks.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kv/select/top_k.h"

namespace slimkv {
namespace {

// How the scores of a case are drawn.
enum class Scores { kNormal, kFewValues, kAllEqual, kWideRange };

const char* name(Scores scores) {
  const char* names[] = {"normal", "few-values", "all-equal", "wide-range"};
  return names[static_cast<int>(scores)];
}

std::vector<float> draw(Scores kind, int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> scores(static_cast<size_t>(n));
  for (float& s : scores) {
    switch (kind) {
      case Scores::kNormal: s = normal(rng); break;
      case Scores::kFewValues: s = float(int(rng() % 5)) * 0.25f; break;  // ties across bins and in them
      case Scores::kAllEqual: s = 3.0f; break;
      case Scores::kWideRange: s = normal(rng) * (rng() % 2 ? 1e-20f : 1e20f); break;
    }
  }
  return scores;
}

void expect_reference(Scores kind, int n, int k, unsigned seed) {
  const std::vector<float> scores = draw(kind, n, seed);
  std::vector<int> fast(size_t(k) + 1, -7), reference(size_t(k) + 1, -7);  // one guard element past k
  top_k_indices(scores.data(), n, k, fast.data());
  top_k_indices_reference(scores.data(), n, k, reference.data());
  ASSERT_EQ(fast, reference) << "top_k(scores=" << name(kind) << ",n=" << n << ",k=" << k << ",seed=" << seed << ")";
}

TEST(TopK, EveryKOfShortLengthsMatchesTheReference) {
  for (Scores kind : {Scores::kNormal, Scores::kFewValues, Scores::kAllEqual, Scores::kWideRange}) {
    for (int n = 0; n <= 70; ++n) {
      for (int k = 0; k <= n; ++k) expect_reference(kind, n, k, unsigned(n));
    }
  }
}

TEST(TopK, DecodeStepLengthsMatchTheReference) {
  // 1/5 and 1/4 of a 64K context's middle tokens, and the re-rank's k of its 1.25 k candidates.
  for (Scores kind : {Scores::kNormal, Scores::kFewValues, Scores::kWideRange}) {
    for (const auto& [n, k] : std::vector<std::pair<int, int>>{{52000, 10400}, {52000, 13000}, {13000, 10400},
                                                               {4001, 1}, {4001, 4000}}) {
      expect_reference(kind, n, k, 11);
    }
  }
}

}  // namespace
}  // namespace slimkv
