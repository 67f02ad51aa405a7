// Choosing tokens on the GPU (backend/cuda/sampling.h): greedy picks the CPU's argmax; sampling draws
// from the distribution engine/sampler.h defines (temperature, top-k, top-p), checked by drawing many
// tokens at once (one row per draw, each its own counter) against the exact probabilities.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cuda/sampling.h"
#include "cuda_test_util.h"
#include "engine/sampler.h"

namespace slimkv::cuda {
namespace {

using CudaSamplingTest = CudaTest;


// The probabilities engine/sampler.h draws from: the top_k largest logits, softmax at the temperature,
// then the smallest prefix (by descending logit) whose mass reaches top_p.
std::vector<double> expected_probabilities(const std::vector<float>& logits, const RowSampling& s) {
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
  size_t keep = s.top_k > 0 ? std::min(order.size(), size_t(s.top_k)) : order.size();
  std::vector<double> weight(logits.size(), 0.0);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    const int t = order[i];
    total += weight[size_t(t)] = std::exp((double(logits[size_t(t)]) - logits[size_t(order[0])]) / s.temperature);
  }
  if (s.top_p < 1.0f) {
    double cumulative = 0;
    size_t cut = 0;
    while (cut < keep && cumulative < s.top_p * total) cumulative += weight[size_t(order[cut++])];
    for (size_t i = cut; i < keep; ++i) weight[size_t(order[i])] = 0;
    total = cumulative;
  }
  for (double& w : weight) w /= total;
  return weight;
}

TEST_F(CudaSamplingTest, ArgmaxPicksTheFirstOfEqualMaxima) {
  std::mt19937 rng(13);
  const int vocab = 5000;
  std::vector<float> logits;
  random_halves(size_t(2) * vocab, 1.0f, rng, logits);
  logits[5] = logits[700] = 100.0f;           // row 0: a tie, the first wins (as std::max_element)
  logits[size_t(vocab) + vocab - 1] = 50.0f;  // row 1: the last entry
  auto logits_device = on_device(logits);
  auto out_device = on_device(std::vector<int32_t>(2, -1));
  SLIMKV_ASSERT_OK(argmax_rows(logits_device.data(), 2, vocab, out_device.data()));
  const auto out = on_host(out_device);
  EXPECT_EQ(out[0], 5);
  EXPECT_EQ(out[1], vocab - 1);
}

TEST_F(CudaSamplingTest, DrawsFollowTheSamplersDistribution) {
  std::mt19937 rng(29);
  const int vocab = 300, draws = 40000;
  std::vector<float> logits;
  random_halves(size_t(vocab), 1.5f, rng, logits);
  logits[17] = logits[18] = logits[19] = 2.0f;  // ties (inside every cut below)
  for (RowSampling s : {RowSampling{1.0f, 0, 1.0f}, RowSampling{0.7f, 5, 1.0f}, RowSampling{1.0f, 0, 0.9f},
                        RowSampling{1.3f, 40, 0.5f}, RowSampling{0.5f, 0, 0.3f}}) {
    SCOPED_TRACE(str_cat("temperature ", s.temperature, " top_k ", s.top_k, " top_p ", s.top_p));
    std::vector<float> rows;
    std::vector<RowSampling> settings;
    for (int d = 0; d < draws; ++d) {
      rows.insert(rows.end(), logits.begin(), logits.end());
      settings.push_back(s);
      settings.back().seed = 99;
      settings.back().counter = uint64_t(d);
    }
    auto rows_device = on_device(rows);
    auto settings_device = on_device(settings);
    auto out_device = on_device(std::vector<int32_t>(size_t(draws), -1));
    SLIMKV_ASSERT_OK(sample_rows(rows_device.data(), draws, vocab, settings_device.data(), out_device.data()));
    const auto out = on_host(out_device);
    std::vector<int> counts(size_t(vocab), 0);
    for (int32_t t : out) {
      ASSERT_GE(t, 0);
      ASSERT_LT(t, vocab);
      ++counts[size_t(t)];
    }
    const auto p = expected_probabilities(logits, s);
    for (int t = 0; t < vocab; ++t) {
      const double expected = p[size_t(t)] * draws, sigma = std::sqrt(expected * (1 - p[size_t(t)]));
      if (p[size_t(t)] == 0) {
        EXPECT_EQ(counts[size_t(t)], 0) << "token " << t << " drawn outside the cut";
        continue;
      }
      EXPECT_NEAR(counts[size_t(t)], expected, 5 * sigma + 3) << "token " << t;
    }
  }
}

TEST_F(CudaSamplingTest, DegenerateSettingsPickTheArgmax) {
  std::mt19937 rng(31);
  const int vocab = 128256;  // Llama 3's
  std::vector<float> logits;
  random_halves(size_t(vocab), 2.0f, rng, logits);
  logits[123457] = 30.0f;
  const std::vector<RowSampling> settings = {{0.0f, 0, 1.0f, 1, 0}, {1.0f, 1, 1.0f, 1, 0}, {1.0f, 0, 1e-6f, 1, 0},
                                             {2.0f, 1, 0.5f, 1, 7}};
  std::vector<float> rows;
  for (size_t i = 0; i < settings.size(); ++i) rows.insert(rows.end(), logits.begin(), logits.end());
  auto rows_device = on_device(rows);
  auto settings_device = on_device(settings);
  auto out_device = on_device(std::vector<int32_t>(settings.size(), -1));
  SLIMKV_ASSERT_OK(sample_rows(rows_device.data(), int(settings.size()), vocab, settings_device.data(), out_device.data()));
  for (int32_t t : on_host(out_device)) EXPECT_EQ(t, argmax(logits));
}

}  // namespace
}  // namespace slimkv::cuda
