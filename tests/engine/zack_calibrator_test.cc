// The ZACK calibrator (engine/zack_calibrator.h) against LAPACK's dgesvd of the explicitly stacked Q–K
// and V–W_O matrices (Fig. 9): its streamed Gram matrices must give the same singular values and
// directions. The calibration runs on the bundled model are in tests/zack/zack_test.cc.
#include "engine/zack_calibrator.h"

#include <gtest/gtest.h>
#include <lapacke.h>

#include <cmath>
#include <random>
#include <vector>

#include "slimkv/status.h"

namespace slimkv {
namespace {


// Singular values and right singular vectors (rows) of a [rows, d] matrix, descending, by dgesvd.
void lapack_svd(std::vector<double> a, int rows, int d, std::vector<double>& s, std::vector<double>& vt) {
  s.assign(size_t(d), 0.0);
  vt.assign(size_t(d) * d, 0.0);
  std::vector<double> superb(static_cast<size_t>(d));
  ASSERT_EQ(LAPACKE_dgesvd(LAPACK_ROW_MAJOR, 'N', 'A', rows, d, a.data(), d, s.data(), nullptr, 1, vt.data(), d,
                           superb.data()),
            0);
}

TEST(ZackCalibrator, MatchesTheSvdOfTheStackedVectors) {
  const int layers = 1, heads = 4, kv_heads = 2, d = 8, hidden = 12, group = heads / kv_heads;
  const unsigned seed = 7;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ZackCalibrator calibrator(layers, heads, kv_heads, d);
  std::vector<float> q_all, k_all, v_all;
  for (const int n : {5, 17}) {  // two calls: the statistics stream
    std::vector<float> q(size_t(n) * heads * d), k(size_t(n) * kv_heads * d), v(k.size());
    for (float& x : q) x = normal(rng);
    for (size_t i = 0; i < k.size(); ++i) k[i] = normal(rng) * float(1 + i % d);  // anisotropic
    for (float& x : v) x = normal(rng);
    calibrator.on_qkv(0, q.data(), k.data(), v.data(), n);
    q_all.insert(q_all.end(), q.begin(), q.end());
    k_all.insert(k_all.end(), k.begin(), k.end());
    v_all.insert(v_all.end(), v.begin(), v.end());
  }
  std::vector<float> o_proj(size_t(hidden) * heads * d);
  for (float& x : o_proj) x = normal(rng);
  calibrator.add_output_projection(0, o_proj.data(), hidden);
  auto c = calibrator.finish("test", "random");
  ASSERT_TRUE(c) << c.status().message();
  const int n = int(k_all.size()) / (kv_heads * d);
  for (int g = 0; g < kv_heads; ++g) {
    SCOPED_TRACE(str_cat("seed ", seed, " kv head ", g));
    std::vector<double> qk, vw;  // the stacks of Fig. 9
    for (int t = 0; t < n; ++t) {
      for (int c2 = 0; c2 < d; ++c2) qk.push_back(k_all[(size_t(t) * kv_heads + g) * d + c2]);
      for (int h = g * group; h < (g + 1) * group; ++h) {
        for (int c2 = 0; c2 < d; ++c2) qk.push_back(q_all[(size_t(t) * heads + h) * d + c2]);
      }
      for (int c2 = 0; c2 < d; ++c2) vw.push_back(v_all[(size_t(t) * kv_heads + g) * d + c2]);
    }
    for (int h = g * group; h < (g + 1) * group; ++h) {
      for (int row = 0; row < hidden; ++row) {
        for (int c2 = 0; c2 < d; ++c2) vw.push_back(o_proj[size_t(row) * heads * d + size_t(h) * d + c2]);
      }
    }
    for (const bool is_qk : {true, false}) {
      const std::vector<double>& stack = is_qk ? qk : vw;
      std::vector<double> s, vt;
      lapack_svd(stack, int(stack.size()) / d, d, s, vt);
      const float* basis = is_qk ? c->qk_basis_of(0, g) : c->vw_basis_of(0, g);
      const float* values = is_qk ? c->qk_singular_values_of(0, g) : c->vw_singular_values_of(0, g);
      for (int i = 0; i < d; ++i) {
        EXPECT_NEAR(values[i], s[size_t(i)], 1e-4 * s[0]) << (is_qk ? "qk" : "vw") << " singular value " << i;
        double dot = 0;
        for (int c2 = 0; c2 < d; ++c2) dot += basis[size_t(i) * d + c2] * vt[size_t(i) * d + c2];
        EXPECT_NEAR(std::fabs(dot), 1.0, 1e-4) << (is_qk ? "qk" : "vw") << " direction " << i;
      }
    }
  }
}

}  // namespace
}  // namespace slimkv
