// ZACK's projection of q and k onto each (layer, KV head)'s Q–K basis on the GPU (kv/cuda/zack_head_projection.h)
// against the plain FP32 product on the host: random ranks 1..head_dim (and the extremes), GQA, head dims
// 128 and 80, a step of many tokens and of one (a decode step's). Each token's row has the bits it has
// projected alone (the GPU's sums run in one order whatever else the step holds, issue 22), and q and k
// projected in one launch the bits of their own launches. Skips without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "kv/cuda/zack_head_projection.h"
#include "util/half.h"

namespace slimkv::cuda {
namespace {

struct ProjectionCase {
  int num_heads, num_kv_heads, head_dim, tokens;
};

// Projects `tokens` random rows of `heads` heads (queries: all the layer's heads; keys: its KV heads) and
// holds every row to the host's B_g[:k_rank] · x, then each token alone to its row in the step.
void check(const ProjectionCase& c, bool queries) {
  SCOPED_TRACE(str_cat(queries ? "queries" : "keys", " heads=", c.num_heads, "/", c.num_kv_heads, " d=", c.head_dim,
                       " tokens=", c.tokens));
  std::mt19937 rng(20261128u + unsigned(c.num_heads * 7 + c.head_dim + c.tokens));
  const int d = c.head_dim, G = c.num_kv_heads, layers = 2, layer = 1;
  const int heads = queries ? c.num_heads : G, per_basis = heads / G;
  ZackHeadProjectionShape shape;
  shape.num_layers = layers, shape.num_heads = c.num_heads, shape.num_kv_heads = G, shape.head_dim = d;
  shape.max_step_tokens = c.tokens;
  std::uniform_int_distribution<int> rank_of(1, d);
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(float(d)));
  std::vector<size_t> basis_at = {0};
  for (int i = 0; i < layers * G; ++i) {
    int rank = rank_of(rng);
    if (i / G == layer && i % G < 2) rank = i % G == 0 ? 1 : d;  // the extremes beside the random ranks
    shape.k_ranks.push_back(rank);
    for (int e = 0; e < rank * d; ++e) shape.qk_bases.push_back(normal(rng));
    basis_at.push_back(basis_at.back() + size_t(rank * d));
  }
  auto projection = take(CudaZackHeadProjection::create(shape));
  ASSERT_TRUE(projection);
  std::vector<float> x;
  const auto x_halves = random_halves(size_t(c.tokens) * heads * d, 1.0f, rng, x);
  auto x_dev = on_device(x_halves);
  const auto project = [&](int first, int n) {
    const uint16_t* rows = x_dev.data() + size_t(first) * heads * d;
    return queries ? projection->project_queries(layer, rows, n) : projection->project_keys(layer, rows, n);
  };
  const size_t row_values = size_t(heads) * d;
  std::vector<uint16_t> step(size_t(c.tokens) * row_values);
  const uint16_t* step_dev = take(project(0, c.tokens));
  ASSERT_TRUE(step_dev);
  SLIMKV_ASSERT_OK(copy_to_host(step.data(), step_dev, step.size() * sizeof(uint16_t)));

  for (int t = 0; t < c.tokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      const int g = h / per_basis, rank = shape.k_ranks[size_t(layer * G + g)];
      const float* basis = shape.qk_bases.data() + basis_at[size_t(layer * G + g)];
      const float* row = x.data() + (size_t(t) * heads + h) * d;
      const uint16_t* got = step.data() + size_t(t) * row_values + size_t(h) * d;
      for (int j = 0; j < d; ++j) {
        const float value = fp16_to_float(got[j]);
        if (j >= rank) {
          ASSERT_EQ(value, 0.0f) << "token " << t << " head " << h << " dim " << j << " past k_rank " << rank;
          continue;
        }
        float want = 0.0f;
        for (int i = 0; i < d; ++i) want += basis[size_t(j) * d + i] * row[i];
        // The GPU sums in another order, then rounds to FP16: within one FP16 step of the host's.
        ASSERT_NEAR(value, want, 2e-3f * std::max(1.0f, std::fabs(want))) << "token " << t << " head " << h << " dim " << j;
      }
    }
  }
  for (int t = 0; t < c.tokens; ++t) {
    std::vector<uint16_t> alone(row_values);
    const uint16_t* alone_dev = take(project(t, 1));
    ASSERT_TRUE(alone_dev);
    SLIMKV_ASSERT_OK(copy_to_host(alone.data(), alone_dev, alone.size() * sizeof(uint16_t)));
    ASSERT_TRUE(std::equal(alone.begin(), alone.end(), step.begin() + ptrdiff_t(size_t(t) * row_values)))
        << "token " << t << " projected alone differs from its row in the step";
  }
}

class ZackHeadProjectionTest : public CudaTest {};

TEST_F(ZackHeadProjectionTest, EachTokenMatchesTheHostProductAndItsBitsAlone) {
  const std::vector<ProjectionCase> cases = {
      {32, 8, 128, 1},   // Llama-3-8B's heads, a decode step
      {32, 8, 128, 21},  // a step of several CTAs' tokens, the last CTA partial
      {6, 3, 80, 9},     // head_dim 80 (its parts of 20 dims), GQA 2
      {4, 4, 64, 3},     // no GQA
  };
  for (const ProjectionCase& c : cases) {
    for (bool queries : {true, false}) check(c, queries);
  }
}

// Both projections in one launch (a step's attend) give each side's rows the bits of its own launch.
TEST_F(ZackHeadProjectionTest, BothInOneLaunchEqualEachAlone) {
  std::mt19937 rng(20261128u);
  const int layers = 2, layer = 1, H = 32, G = 8, d = 128, n = 3;
  ZackHeadProjectionShape shape;
  shape.num_layers = layers, shape.num_heads = H, shape.num_kv_heads = G, shape.head_dim = d, shape.max_step_tokens = n;
  std::uniform_int_distribution<int> rank_of(1, d);
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(float(d)));
  for (int i = 0; i < layers * G; ++i) {
    shape.k_ranks.push_back(rank_of(rng));
    for (int e = 0; e < shape.k_ranks.back() * d; ++e) shape.qk_bases.push_back(normal(rng));
  }
  auto projection = take(CudaZackHeadProjection::create(shape));
  ASSERT_TRUE(projection);
  std::vector<float> unused;
  auto q = on_device(random_halves(size_t(n) * H * d, 1.0f, rng, unused));
  auto k = on_device(random_halves(size_t(n) * G * d, 1.0f, rng, unused));
  const auto download = [](const uint16_t* rows, size_t values) {
    std::vector<uint16_t> host(values);
    EXPECT_TRUE(copy_to_host(host.data(), rows, values * sizeof(uint16_t)).is_ok());
    return host;
  };
  const std::vector<uint16_t> q_alone = download(take(projection->project_queries(layer, q.data(), n)), q.size());
  const std::vector<uint16_t> k_alone = download(take(projection->project_keys(layer, k.data(), n)), k.size());
  const ReducedQueriesAndKeys both = take(projection->project_queries_and_keys(layer, q.data(), k.data(), n));
  EXPECT_EQ(download(both.q, q.size()), q_alone);
  EXPECT_EQ(download(both.k, k.size()), k_alone);
}

}  // namespace
}  // namespace slimkv::cuda
