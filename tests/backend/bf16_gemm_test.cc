// Both BF16 prefill tiers (AMX tiles, AVX-512 BF16; BF16 weights x FP32 activations split into two BF16
// parts) against the FP64 reference matmul over the unsplit activations, at odd sizes: partial input and
// row blocks, depth not a multiple of a step's 32, several depth chunks, row ranges starting mid-matrix.
// A tier the CPU lacks is skipped (said so); the Matmul tests cover the portable path there.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/bf16_gemm.h"
#include "backend/cpu/matmul.h"
#include "random_values.h"
#include "slimkv/status.h"
#include "util/half.h"

namespace slimkv {
namespace {

struct Case {
  std::vector<float> x;
  std::vector<uint16_t> w;  // BF16 [rows, cols]
  int64_t n, rows, cols;
};

Case make_case(int64_t n, int64_t rows, int64_t cols, std::mt19937& rng) {
  Case c{random_values(size_t(n * cols), rng), {}, n, rows, cols};
  for (float e : random_values(size_t(rows * cols), rng)) c.w.push_back(float_to_bf16(e));
  return c;
}

// y over rows [begin, end) through `tier`; the other columns of y stay NaN.
std::vector<float> tier_product(Bf16GemmTier tier, const Case& c, int64_t begin, int64_t end) {
  Bf16SplitActivations a;
  bf16_split_prepare(c.n, c.cols, a);
  bf16_split_rows(c.x.data(), 0, c.n, a);
  std::vector<float> y(size_t(c.n * c.rows), NAN);
  bf16_gemm(tier, a, c.w.data(), c.rows, begin, end, y.data());
  return y;
}

class Bf16Gemm : public testing::TestWithParam<Bf16GemmTier> {
 protected:
  void SetUp() override {
    if (!bf16_gemm_tier_supported(GetParam())) {
      GTEST_SKIP() << "this CPU lacks the " << bf16_gemm_tier_name(GetParam())
                   << " tier (or the kernel refused the AMX tile state)";
    }
  }
};

TEST_P(Bf16Gemm, MatchesReferenceWithinTheSplitsRounding) {
  std::mt19937 rng(31);
  double worst = 0;
  for (const int64_t n : {1, 17, 32, 33, 70}) {
    for (const int64_t cols : {1, 37, 300, 1100}) {  // 1100: three depth chunks, the last partial
      const int64_t rows = 70;  // two whole blocks of 32 rows and a partial one
      const Case c = make_case(n, rows, cols, rng);
      std::vector<float> expected(size_t(n * rows));
      matmul_reference(c.x.data(), n, {c.w.data(), DType::kBF16, rows, cols}, expected.data());
      for (const auto& [begin, end] : {std::pair<int64_t, int64_t>{0, 70}, {32, 70}, {0, 32}, {64, 70}}) {
        SCOPED_TRACE(str_cat("n=", n, ",cols=", cols, ",rows ", begin, "..", end));
        const std::vector<float> y = tier_product(GetParam(), c, begin, end);
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t o = 0; o < rows; ++o) {
            const float got = y[size_t(i * rows + o)];
            if (o < begin || o >= end) {
              ASSERT_TRUE(std::isnan(got)) << "row " << o << " outside the range was written";
              continue;
            }
            // hi + lo is x to 2^-17 relative; FP32 sums of exact products add a few 2^-24 of the
            // magnitude per step, ~sqrt(cols) of them (random signs). One BF16 part alone would be
            // off by ~2^-9 relative, far outside.
            double magnitude = 0;
            for (int64_t k = 0; k < cols; ++k) {
              magnitude += std::fabs(double(c.x[size_t(i * cols + k)]) * bf16_to_float(c.w[size_t(o * cols + k)]));
            }
            const double error = std::fabs(double(got) - expected[size_t(i * rows + o)]);
            worst = std::max(worst, error / magnitude);
            ASSERT_LE(error, magnitude * (std::ldexp(1.0, -16) + std::sqrt(double(cols)) * std::ldexp(1.0, -22)))
                << "input " << i << " row " << o;
          }
        }
      }
    }
  }
  std::printf("%s: worst |error| / sum|x·w|: %.2e\n", bf16_gemm_tier_name(GetParam()), worst);
}

// An infinite or NaN activation gives what FP32 arithmetic gives (the split keeps Inf as Inf + 0).
TEST_P(Bf16Gemm, InfinityAndNanPropagateAsInFp32) {
  std::mt19937 rng(32);
  Case c = make_case(20, 32, 64, rng);
  c.x[3] = INFINITY;  // input 0
  c.x[64 + 5] = NAN;  // input 1
  for (uint16_t& e : c.w) e = float_to_bf16(std::fabs(bf16_to_float(e)) + 0.5f);  // positive: no Inf - Inf
  const std::vector<float> y = tier_product(GetParam(), c, 0, 32);
  for (int64_t o = 0; o < 32; ++o) {
    EXPECT_EQ(y[size_t(o)], INFINITY) << o;
    EXPECT_TRUE(std::isnan(y[size_t(32 + o)])) << o;
    EXPECT_TRUE(std::isfinite(y[size_t(64 + o)])) << o;
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, Bf16Gemm, testing::Values(Bf16GemmTier::kAvx512Bf16, Bf16GemmTier::kAmx),
                         [](const testing::TestParamInfo<Bf16GemmTier>& info) {
                           return info.param == Bf16GemmTier::kAmx ? std::string("amx") : std::string("avx512_bf16");
                         });

// The tier matmul takes is one the CPU supports (whatever SLIMKV_BF16_GEMM says).
TEST(Bf16GemmDispatch, ChosenTierIsSupported) {
  const Bf16GemmTier tier = bf16_gemm_tier();
  std::printf("matmul's BF16 tier here: %s\n", bf16_gemm_tier_name(tier));
  EXPECT_TRUE(bf16_gemm_tier_supported(tier));
}

}  // namespace
}  // namespace slimkv
