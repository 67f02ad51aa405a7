// Both BF16 prefill tiers (AMX tiles, AVX-512 BF16; BF16 weights x FP32 activations split into two BF16
// parts) against the FP64 reference matmul over the unsplit activations, at odd sizes: partial input and
// row blocks, depth not a multiple of a step's 32, several depth chunks, row ranges starting mid-matrix;
// the same from weights packed once (bf16_pack_panels), and the AMX decode product (1..16 inputs) against
// the reference and against itself: each input's bits whatever the other inputs are.
// A tier the CPU lacks is skipped (said so); the Matmul tests cover the portable path there.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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

// y over rows [begin, end) through `tier` (kNone: bf16_decode_gemm), from w or from `panels` where given;
// the other columns of y stay NaN.
std::vector<float> tier_product(Bf16GemmTier tier, const Case& c, int64_t begin, int64_t end,
                                const uint16_t* panels = nullptr) {
  Bf16SplitActivations a;
  bf16_split_prepare(c.n, c.cols, a);
  bf16_split_rows(c.x.data(), 0, c.n, a);
  std::vector<float> y(size_t(c.n * c.rows), NAN);
  if (tier == Bf16GemmTier::kNone) {
    bf16_decode_gemm(a, panels, c.rows, begin, end, y.data());
  } else {
    bf16_gemm(tier, a, c.w.data(), panels, c.rows, begin, end, y.data());
  }
  return y;
}

// Checks y (rows [begin, end) written, the others NaN) against the FP64 reference within the split's bound.
// Returns the worst |error| / Σ|x·w|.
double expect_near_reference(const Case& c, const std::vector<float>& y, int64_t begin, int64_t end) {
  std::vector<float> expected(size_t(c.n * c.rows));
  matmul_reference(c.x.data(), c.n, {c.w.data(), DType::kBF16, c.rows, c.cols}, expected.data());
  double worst = 0;
  for (int64_t i = 0; i < c.n; ++i) {
    for (int64_t o = 0; o < c.rows; ++o) {
      const float got = y[size_t(i * c.rows + o)];
      if (o < begin || o >= end) {
        EXPECT_TRUE(std::isnan(got)) << "input " << i << " row " << o << " outside the range was written";
        continue;
      }
      // hi + lo is x to 2^-17 relative; FP32 sums of exact products add a few 2^-24 of the magnitude per
      // step, ~sqrt(cols) of them (random signs). One BF16 part alone would be off by ~2^-9 relative, far
      // outside.
      double magnitude = 0;
      for (int64_t k = 0; k < c.cols; ++k) {
        magnitude += std::fabs(double(c.x[size_t(i * c.cols + k)]) * bf16_to_float(c.w[size_t(o * c.cols + k)]));
      }
      const double error = std::fabs(double(got) - expected[size_t(i * c.rows + o)]);
      worst = std::max(worst, error / magnitude);
      EXPECT_LE(error, magnitude * (std::ldexp(1.0, -16) + std::sqrt(double(c.cols)) * std::ldexp(1.0, -22)))
          << "input " << i << " row " << o;
    }
  }
  return worst;
}

// Row ranges the tests take of a 70-row matrix: whole, from the second panel, one panel, the partial last.
constexpr std::pair<int64_t, int64_t> kRowRanges[] = {{0, 70}, {32, 70}, {0, 32}, {64, 70}};

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
  for (const int64_t n : {17, 32, 33, 70}) {  // ≤ 16 inputs are bf16_decode_gemm's
    for (const int64_t cols : {1, 37, 300, 1100}) {  // 1100: three depth chunks, the last partial
      const int64_t rows = 70;  // two whole blocks of 32 rows and a partial one
      const Case c = make_case(n, rows, cols, rng);
      for (const auto& [begin, end] : kRowRanges) {
        SCOPED_TRACE(str_cat("n=", n, ",cols=", cols, ",rows ", begin, "..", end));
        worst = std::max(worst, expect_near_reference(c, tier_product(GetParam(), c, begin, end), begin, end));
        if (HasFailure()) return;
      }
    }
  }
  std::printf("%s: worst |error| / sum|x·w|: %.2e\n", bf16_gemm_tier_name(GetParam()), worst);
}

// Weights packed once (the model's, where matmul reads panels) give the bits of panels packed per call.
TEST_P(Bf16Gemm, PackedPanelsGiveTheSameBits) {
  std::mt19937 rng(33);
  for (const int64_t n : {17, 70}) {
    for (const int64_t cols : {37, 1100}) {
      const Case c = make_case(n, 70, cols, rng);
      const Bf16Panels panels = bf16_pack_panels(c.w.data(), c.rows, c.cols);
      for (const auto& [begin, end] : kRowRanges) {
        SCOPED_TRACE(str_cat("n=", n, ",cols=", cols, ",rows ", begin, "..", end));
        const std::vector<float> packed = tier_product(GetParam(), c, begin, end, panels.get());
        const std::vector<float> unpacked = tier_product(GetParam(), c, begin, end);
        ASSERT_EQ(0, std::memcmp(packed.data(), unpacked.data(), packed.size() * sizeof(float)));
      }
    }
  }
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

// The AMX decode product (1..16 inputs, packed panels): against the reference at odd sizes, and each input's
// output the same bits as that input alone (what makes a batched decode step equal to steps one by one).
class Bf16DecodeGemm : public testing::Test {
 protected:
  void SetUp() override {
    if (!bf16_gemm_tier_supported(Bf16GemmTier::kAmx)) {
      GTEST_SKIP() << "this CPU lacks AMX (or the kernel refused the AMX tile state): decode takes matvec_half";
    }
  }
};

TEST_F(Bf16DecodeGemm, MatchesReferenceWithinTheSplitsRounding) {
  std::mt19937 rng(34);
  double worst = 0;
  for (int64_t n = 1; n <= kBf16DecodeMaxInputs; ++n) {
    for (const int64_t cols : {1, 37, 300, 1100}) {
      const Case c = make_case(n, 70, cols, rng);
      const Bf16Panels panels = bf16_pack_panels(c.w.data(), c.rows, c.cols);
      for (const auto& [begin, end] : kRowRanges) {
        SCOPED_TRACE(str_cat("n=", n, ",cols=", cols, ",rows ", begin, "..", end));
        const std::vector<float> y = tier_product(Bf16GemmTier::kNone, c, begin, end, panels.get());
        worst = std::max(worst, expect_near_reference(c, y, begin, end));
        if (HasFailure()) return;
      }
    }
  }
  std::printf("amx decode: worst |error| / sum|x·w|: %.2e\n", worst);
}

TEST_F(Bf16DecodeGemm, EachInputGetsItsOwnBitsWhateverTheBatch) {
  std::mt19937 rng(35);
  const int64_t rows = 100, cols = 300;
  const Case all = make_case(kBf16DecodeMaxInputs, rows, cols, rng);
  const Bf16Panels panels = bf16_pack_panels(all.w.data(), rows, cols);
  // Each input alone, then every batch size with the inputs in another order.
  std::vector<std::vector<float>> alone;
  for (int64_t i = 0; i < all.n; ++i) {
    Case one{std::vector<float>(all.x.begin() + i * cols, all.x.begin() + (i + 1) * cols), all.w, 1, rows, cols};
    alone.push_back(tier_product(Bf16GemmTier::kNone, one, 0, rows, panels.get()));
  }
  for (int64_t n = 2; n <= kBf16DecodeMaxInputs; ++n) {
    Case batch{{}, all.w, n, rows, cols};
    for (int64_t j = 0; j < n; ++j) {
      const int64_t input = (j * 5 + n) % all.n;
      batch.x.insert(batch.x.end(), all.x.begin() + input * cols, all.x.begin() + (input + 1) * cols);
    }
    const std::vector<float> y = tier_product(Bf16GemmTier::kNone, batch, 0, rows, panels.get());
    for (int64_t j = 0; j < n; ++j) {
      const int64_t input = (j * 5 + n) % all.n;
      ASSERT_EQ(0, std::memcmp(y.data() + j * rows, alone[size_t(input)].data(), rows * sizeof(float)))
          << "input " << input << " at position " << j << " of " << n;
    }
  }
}

// An infinite or NaN input gives what FP32 arithmetic gives, and leaves the batch's other inputs finite.
TEST_F(Bf16DecodeGemm, InfinityAndNanPropagateAsInFp32) {
  std::mt19937 rng(37);
  Case c = make_case(3, 64, 64, rng);
  c.x[3] = INFINITY;  // input 0
  c.x[64 + 5] = NAN;  // input 1
  for (uint16_t& e : c.w) e = float_to_bf16(std::fabs(bf16_to_float(e)) + 0.5f);  // positive: no Inf - Inf
  const Bf16Panels panels = bf16_pack_panels(c.w.data(), c.rows, c.cols);
  const std::vector<float> y = tier_product(Bf16GemmTier::kNone, c, 0, c.rows, panels.get());
  for (int64_t o = 0; o < c.rows; ++o) {
    EXPECT_EQ(y[size_t(o)], INFINITY) << o;
    EXPECT_TRUE(std::isnan(y[size_t(c.rows + o)])) << o;
    EXPECT_TRUE(std::isfinite(y[size_t(2 * c.rows + o)])) << o;
  }
}

// matmul reads a WeightMatrix's packed panels for every number of inputs (decode and prefill alike).
TEST_F(Bf16DecodeGemm, MatmulReadsPackedPanels) {
  std::mt19937 rng(36);
  ThreadPool pool(2);
  for (const int64_t n : {1, 5, 16, 17}) {
    const Case c = make_case(n, 200, 300, rng);
    const Bf16Panels panels = bf16_pack_panels(c.w.data(), c.rows, c.cols);
    WeightMatrix w{c.w.data(), DType::kBF16, c.rows, c.cols};
    EXPECT_EQ(takes_bf16_panels(w), bf16_gemm_tier() == Bf16GemmTier::kAmx);
    w.bf16_panels = panels.get();
    std::vector<float> y(size_t(n * c.rows), NAN);
    matmul(c.x.data(), n, w, y.data(), pool);
    SCOPED_TRACE(str_cat("n=", n));
    expect_near_reference(c, y, 0, c.rows);
    // The row-major data is not what it reads: garbage there changes nothing.
    std::vector<uint16_t> garbage(c.w.size(), float_to_bf16(1e30f));
    w.data = garbage.data();
    std::vector<float> again(y.size(), NAN);
    matmul(c.x.data(), n, w, again.data(), pool);
    EXPECT_EQ(0, std::memcmp(y.data(), again.data(), y.size() * sizeof(float)));
  }
}

// The tier matmul takes is one the CPU supports (whatever SLIMKV_BF16_GEMM says).
TEST(Bf16GemmDispatch, ChosenTierIsSupported) {
  const Bf16GemmTier tier = bf16_gemm_tier();
  std::printf("matmul's BF16 tier here: %s\n", bf16_gemm_tier_name(tier));
  EXPECT_TRUE(bf16_gemm_tier_supported(tier));
}

}  // namespace
}  // namespace slimkv
