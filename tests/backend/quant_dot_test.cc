// The integer decode products (backend/cpu/quant_dot.h): the activations' rounding within its stated
// bound, every tier this CPU has against the FP64 reference on the same rounded inputs, the SIMD tiers
// against each other bit for bit, and the whole product against the FP32 one of the unrounded inputs
// within the bound the 8-bit rounding implies.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/quant_dot.h"
#include "backend/random_ggml_blocks.h"
#include "slimkv/status.h"
#include "tensor/ggml_type.h"

namespace slimkv {
namespace {

constexpr BlockQuant kAll[] = {BlockQuant::kQ8_0, BlockQuant::kQ4_0, BlockQuant::kQ4_K, BlockQuant::kQ6_K};
constexpr QuantDotTier kIntegerTiers[] = {QuantDotTier::kScalar, QuantDotTier::kAvx2, QuantDotTier::kAvxVnni,
                                          QuantDotTier::kAvx512Vnni};

// |x - d̂·q| for one input of a block with max |x| = amax: rounding to the nearest multiple of d = amax/127
// costs d/2, and the FP16 scale d̂ (|d̂ - d| ≤ 2^-11·d) up to 127·2^-11·d more: 0.5621·d in all.
double rounding_bound(double amax) { return (0.5 + 127.0 / 2048.0) * amax / 127.0 * (1 + 1e-6); }

struct Case {
  BlockQuant quant;
  int64_t n, rows, cols;
  std::string name() const {
    return str_cat("quant_dot(quant=", block_quant_name(quant), ",n=", n, ",rows=", rows, ",cols=", cols, ")");
  }
};

std::vector<Case> cases() {
  std::vector<Case> all;
  for (const BlockQuant quant : kAll) {
    const int64_t block = block_elements(quant);
    for (const int64_t cols : {block, 2 * block, 3 * block, int64_t(2048)}) {
      for (const int64_t n : {1, 3}) all.push_back({quant, n, 7, cols});
    }
  }
  return all;
}

std::vector<float> normal_inputs(int64_t count, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(count));
  for (float& e : x) e = normal(rng);
  return x;
}

TEST(QuantDot, ActivationsRoundWithinTheirBound) {
  const unsigned seed = 21;
  std::mt19937 rng(seed);
  const int64_t n = 2, cols = 256;
  std::vector<float> x = normal_inputs(n * cols, rng);
  for (int64_t c = 0; c < 32; ++c) x[size_t(c)] = 0;  // an all-zero block: scale 0, codes 0
  x[40] = 1e4f;                                        // one large outlier in a block
  QuantizedActivations q;
  quantize_activations(QuantDotTier::kScalar, x.data(), n, cols, q);
  ASSERT_EQ(q.q.size(), size_t(n * cols));
  ASSERT_EQ(q.scales.size(), size_t(n * cols / 32));
  for (int64_t b = 0; b < n * cols / 32; ++b) {
    double amax = 0;
    int32_t sum = 0;
    for (int64_t i = 0; i < 32; ++i) {
      amax = std::max(amax, double(std::fabs(x[size_t(32 * b + i)])));
      sum += q.q[size_t(32 * b + i)];
    }
    for (int64_t i = 0; i < 32; ++i) {
      const int64_t at = 32 * b + i;
      ASSERT_GE(q.q[size_t(at)], -127) << "seed " << seed << " value " << at;
      ASSERT_NEAR(double(q.scales[size_t(b)]) * q.q[size_t(at)], x[size_t(at)], rounding_bound(amax))
          << "seed " << seed << " value " << at;
    }
    EXPECT_FLOAT_EQ(q.scaled_sums[size_t(b)], q.scales[size_t(b)] * float(sum)) << "block " << b;
  }
  EXPECT_EQ(q.scales[0], 0.0f);
}

// Each tier against the FP64 reference on the same quantized inputs: the integer sums are exact, so the
// only difference is FP32 rounding of the scale products and of about cols / 32 accumulations per lane:
// within 1e-5 of Σ |w·x̂| (FP32's 6e-8 times a few hundred steps).
class QuantDotTierTest : public ::testing::TestWithParam<QuantDotTier> {};

TEST_P(QuantDotTierTest, MatchesTheReferenceOnTheQuantizedInputs) {
  const QuantDotTier tier = GetParam();
  if (!quant_dot_tier_supported(tier)) GTEST_SKIP() << quant_dot_tier_name(tier) << ": this CPU lacks it";
  const unsigned seed = 7;
  std::mt19937 rng(seed);
  for (const Case& c : cases()) {
    SCOPED_TRACE(str_cat(c.name(), " tier=", quant_dot_tier_name(tier), " seed=", seed));
    const std::vector<uint8_t> w = test::random_blocks(c.quant, c.rows * c.cols, rng);
    const std::vector<float> x = normal_inputs(c.n * c.cols, rng);
    QuantizedActivations q;
    quantize_activations(tier, x.data(), c.n, c.cols, q);
    // Guards on both sides of the rows a task owns: rows 1..rows-2 only.
    std::vector<float> y(size_t(c.n * c.rows), NAN), expected(y.size());
    matvec_quant_dot(tier, q, w.data(), c.quant, c.rows, 1, c.rows - 1, y.data());
    matvec_quant_dot_reference(q, w.data(), c.quant, c.rows, expected.data());
    std::vector<float> row(size_t(c.cols));
    const size_t row_bytes = size_t(c.cols / block_elements(c.quant)) * block_bytes(c.quant);
    for (int64_t o = 0; o < c.rows; ++o) {
      dequantize_reference(c.quant, w.data() + size_t(o) * row_bytes, row.data(), c.cols);
      for (int64_t i = 0; i < c.n; ++i) {
        const float out = y[size_t(i * c.rows + o)];
        if (o == 0 || o == c.rows - 1) {
          ASSERT_TRUE(std::isnan(out)) << "wrote outside its rows: row " << o;
          continue;
        }
        double magnitude = 0;
        for (int64_t k = 0; k < c.cols; ++k) {
          magnitude += std::fabs(double(row[size_t(k)]) * q.scales[size_t((i * c.cols + k) / 32)] * q.q[size_t(i * c.cols + k)]);
        }
        ASSERT_NEAR(out, expected[size_t(i * c.rows + o)], 1e-5 * magnitude + 1e-30) << "input " << i << " row " << o;
      }
    }
  }
}

// The largest codes every format can hold against inputs of ±127: AVX2's 16-bit pair sums are nearest
// to saturating there (Q8_0: 128·127·2 = 32512 ≤ 32767).
TEST_P(QuantDotTierTest, ExtremeCodesDoNotSaturate) {
  const QuantDotTier tier = GetParam();
  if (!quant_dot_tier_supported(tier)) GTEST_SKIP() << quant_dot_tier_name(tier) << ": this CPU lacks it";
  for (const BlockQuant quant : kAll) {
    SCOPED_TRACE(str_cat(block_quant_name(quant), " tier=", quant_dot_tier_name(tier)));
    const int64_t cols = block_elements(quant) * 2;
    // Code bytes all 0x80 (Q8_0: -128; Q4_0/Q4_K: nibbles 0 and 8; Q6_K: codes 0 and 32) or all 0xff (the
    // other extreme), with the inputs' signs alternating by pairs so that pair sums add up.
    for (const uint8_t fill : {uint8_t(0x80), uint8_t(0xff), uint8_t(0x00)}) {
      std::mt19937 rng(3);
      std::vector<uint8_t> w = test::random_blocks(quant, cols, rng);
      for (int64_t b = 0; b < cols / block_elements(quant); ++b) {
        uint8_t* block = w.data() + size_t(b) * block_bytes(quant);
        switch (quant) {
          case BlockQuant::kQ8_0: std::memset(block + 2, fill, 32); break;
          case BlockQuant::kQ4_0: std::memset(block + 2, fill, 16); break;
          case BlockQuant::kQ4_K: std::memset(block + 16, fill, 128); break;
          case BlockQuant::kQ6_K: std::memset(block, fill, 192); break;
          case BlockQuant::kNone: break;
        }
      }
      std::vector<float> x(static_cast<size_t>(cols));
      for (int64_t c = 0; c < cols; ++c) x[size_t(c)] = (c / 2) % 2 ? -1.0f : 1.0f;
      QuantizedActivations q;
      quantize_activations(tier, x.data(), 1, cols, q);
      float y = NAN, expected = NAN;
      matvec_quant_dot(tier, q, w.data(), quant, 1, 0, 1, &y);
      matvec_quant_dot_reference(q, w.data(), quant, 1, &expected);
      ASSERT_NEAR(y, expected, 1e-5 * std::fabs(expected) + 1e-6) << "fill " << int(fill);
    }
  }
}

// Zeros, ties (x·(1/d) at k + 0.5), scales past FP16's range and below its normal range, random values.
TEST_P(QuantDotTierTest, QuantizesAsThePlainLoopsBitForBit) {
  const QuantDotTier tier = GetParam();
  if (!quant_dot_tier_supported(tier)) GTEST_SKIP() << quant_dot_tier_name(tier) << ": this CPU lacks it";
  const unsigned seed = 5;
  std::mt19937 rng(seed);
  std::vector<float> x = normal_inputs(32 * 64, rng);
  for (int i = 0; i < 32; ++i) x[size_t(i)] = 0;                           // block 0: all zero
  for (int i = 0; i < 32; ++i) x[size_t(32 + i)] = float(i - 16) + 0.5f;    // block 1: max 16.5, many ties
  x[64] = 127.0f;                                                            // block 2: d = 1, x·(1/d) ties at k + 0.5
  for (int i = 1; i < 32; ++i) x[size_t(64 + i)] = float(i) - 0.5f;
  for (int i = 0; i < 32; ++i) x[size_t(96 + i)] *= 3e7f;                   // block 3: d past FP16's largest
  for (int i = 0; i < 32; ++i) x[size_t(128 + i)] *= 1e-4f;                 // block 4: d an FP16 subnormal
  QuantizedActivations plain, simd;
  quantize_activations(QuantDotTier::kScalar, x.data(), 2, 32 * 32, plain);
  quantize_activations(tier, x.data(), 2, 32 * 32, simd);
  EXPECT_EQ(plain.q, simd.q) << "seed " << seed;
  ASSERT_EQ(plain.scales.size(), simd.scales.size());
  EXPECT_EQ(std::memcmp(plain.scales.data(), simd.scales.data(), plain.scales.size() * 4), 0);
  EXPECT_EQ(std::memcmp(plain.scaled_sums.data(), simd.scaled_sums.data(), plain.scaled_sums.size() * 4), 0);
  ASSERT_EQ(plain.scaled_sums16.size(), simd.scaled_sums16.size());
  EXPECT_EQ(std::memcmp(plain.scaled_sums16.data(), simd.scaled_sums16.data(), plain.scaled_sums16.size() * 4), 0);
  EXPECT_TRUE(std::isfinite(plain.scales[3]) && plain.scales[3] > kMaxHalf) << plain.scales[3];
}

INSTANTIATE_TEST_SUITE_P(Tiers, QuantDotTierTest, ::testing::ValuesIn(kIntegerTiers),
                         [](const auto& info) {
                           std::string name = quant_dot_tier_name(info.param);
                           for (char& ch : name) ch = ch == '-' ? '_' : ch;
                           return name;
                         });

// The SIMD tiers differ only in the instruction that sums four byte products: the same integer sums and the
// same float operations in the same order, so the same bits. Except AVX2 on Q8_0, whose 16-bit pair sums
// cannot take codes up to 255: it multiplies signed values (no offset to subtract), held to the reference.
TEST(QuantDot, SimdTiersAgreeBitForBit) {
  std::vector<QuantDotTier> tiers;
  for (const QuantDotTier tier : {QuantDotTier::kAvx512Vnni, QuantDotTier::kAvxVnni, QuantDotTier::kAvx2}) {
    if (quant_dot_tier_supported(tier)) tiers.push_back(tier);
  }
  if (tiers.size() < 2) GTEST_SKIP() << "fewer than two SIMD tiers on this CPU";
  std::mt19937 rng(11);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name());
    const std::vector<uint8_t> w = test::random_blocks(c.quant, c.rows * c.cols, rng);
    const std::vector<float> x = normal_inputs(c.n * c.cols, rng);
    QuantizedActivations q;
    quantize_activations(QuantDotTier::kScalar, x.data(), c.n, c.cols, q);
    std::vector<float> first(size_t(c.n * c.rows)), other(first.size());
    matvec_quant_dot(tiers[0], q, w.data(), c.quant, c.rows, 0, c.rows, first.data());
    for (size_t t = 1; t < tiers.size(); ++t) {
      if (tiers[t] == QuantDotTier::kAvx2 && c.quant == BlockQuant::kQ8_0) continue;
      matvec_quant_dot(tiers[t], q, w.data(), c.quant, c.rows, 0, c.rows, other.data());
      ASSERT_EQ(std::memcmp(first.data(), other.data(), first.size() * sizeof(float)), 0)
          << quant_dot_tier_name(tiers[t]) << " vs " << quant_dot_tier_name(tiers[0]);
    }
  }
}

// Against the FP32 product of the unrounded inputs: y - y_exact = Σ w·(x̂ - x), so |y - y_exact| ≤
// Σ_c |w_c|·rounding_bound(max |x| of c's block), plus the FP32 rounding above.
TEST(QuantDot, WithinTheEightBitRoundingOfTheFp32Product) {
  const unsigned seed = 17;
  std::mt19937 rng(seed);
  const QuantDotTier tier = quant_dot_tier() == QuantDotTier::kF32 ? QuantDotTier::kScalar : quant_dot_tier();
  for (const Case& c : cases()) {
    SCOPED_TRACE(str_cat(c.name(), " tier=", quant_dot_tier_name(tier), " seed=", seed));
    const std::vector<uint8_t> w = test::random_blocks(c.quant, c.rows * c.cols, rng);
    const std::vector<float> x = normal_inputs(c.n * c.cols, rng);
    QuantizedActivations q;
    quantize_activations(QuantDotTier::kScalar, x.data(), c.n, c.cols, q);
    std::vector<float> y(size_t(c.n * c.rows));
    matvec_quant_dot(tier, q, w.data(), c.quant, c.rows, 0, c.rows, y.data());
    std::vector<float> row(size_t(c.cols));
    const size_t row_bytes = size_t(c.cols / block_elements(c.quant)) * block_bytes(c.quant);
    double worst_ratio = 0;  // error / bound, printed: how much of the bound the rounding uses
    for (int64_t o = 0; o < c.rows; ++o) {
      dequantize_reference(c.quant, w.data() + size_t(o) * row_bytes, row.data(), c.cols);
      for (int64_t i = 0; i < c.n; ++i) {
        const float* xi = x.data() + i * c.cols;
        double exact = 0, bound = 0, magnitude = 0;
        for (int64_t k = 0; k < c.cols; ++k) {
          double amax = 0;
          for (int64_t j = k / 32 * 32; j < k / 32 * 32 + 32; ++j) amax = std::max(amax, double(std::fabs(xi[j])));
          exact += double(row[size_t(k)]) * xi[k];
          bound += std::fabs(row[size_t(k)]) * rounding_bound(amax);
          magnitude += std::fabs(double(row[size_t(k)]) * xi[k]);
        }
        bound += 1e-5 * magnitude;
        const double error = std::fabs(y[size_t(i * c.rows + o)] - exact);
        ASSERT_LE(error, bound) << "input " << i << " row " << o << ": exact " << exact;
        worst_ratio = std::max(worst_ratio, error / bound);
      }
    }
    if (c.cols == 2048 && c.n == 3) std::printf("%s: worst error / bound %.3f\n", c.name().c_str(), worst_ratio);
  }
}

}  // namespace
}  // namespace slimkv
