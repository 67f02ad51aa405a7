// The quantized block format of `hack` and `quant` (tensor/quantized_block.h, HACK §5.2): round trips
// within one quantization step with sums that match the codes, token-subset decoding equal to the whole
// block's rows, and unbiased stochastic rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "slimkv/status.h"
#include "tensor/quantized_block.h"
#include "random_values.h"

namespace slimkv {
namespace {

struct FormatCase {
  int bits, tokens, k_dim, v_dim;
  Rounding rounding;
  std::string name() const {
    return str_cat("format(bits=", bits, ",pi=", tokens, ",k_dim=", k_dim, ",v_dim=", v_dim,
                   rounding == Rounding::kNearest ? ",nearest)" : ",stochastic)");
  }
};

// Stored sums equal the sums of the unpacked codes: per (K partition, token) and per V column.
void expect_sums_match_codes(const QuantizedBlockLayout& layout, const uint8_t* block) {
  const int tokens = layout.shape.block_tokens, k_dim = layout.shape.k_dim, v_dim = layout.shape.v_dim;
  std::vector<uint8_t> kc(size_t(tokens) * k_dim), vc(size_t(tokens) * v_dim);
  unpack_block_codes(layout, block, kc.data(), vc.data());
  const auto* k_sums = reinterpret_cast<const int16_t*>(block + layout.k_sums);
  const auto* v_sums = reinterpret_cast<const int16_t*>(block + layout.v_sums);
  for (int t = 0; t < tokens; ++t) {
    for (int p = 0; p < layout.k_partitions; ++p) {
      int sum = 0;
      for (int d = p * layout.k_partition; d < p * layout.k_partition + layout.k_partition_dims(p); ++d) sum += kc[size_t(t) * k_dim + d];
      ASSERT_EQ(k_sums[size_t(p) * tokens + t], sum) << "token " << t << ", partition " << p;
    }
  }
  for (int col = 0; col < v_dim; ++col) {
    int sum = 0;
    for (int t = 0; t < tokens; ++t) sum += vc[size_t(t) * v_dim + col];
    ASSERT_EQ(v_sums[col], sum) << "column " << col;
  }
}

TEST(QuantizedBlock, RoundTripWithinOneStepAndSumsMatchCodes) {
  std::mt19937 rng(5);
  for (const FormatCase c : {FormatCase{2, 64, 128, 128, Rounding::kNearest}, FormatCase{4, 32, 80, 64, Rounding::kNearest},
                             FormatCase{8, 128, 64, 96, Rounding::kStochastic}, FormatCase{2, 64, 32, 16, Rounding::kStochastic},
                             FormatCase{4, 128, 128, 128, Rounding::kStochastic}}) {
    SCOPED_TRACE(c.name());
    const QuantizationConfig config{c.bits, c.bits, c.rounding, true};
    const QuantizedBlockLayout layout(config, {c.tokens, c.k_dim, c.v_dim});
    ASSERT_TRUE(check_quantized_shape(config, layout.shape).is_ok());
    auto k = random_values(size_t(c.tokens) * c.k_dim, rng, 2.0f), v = random_values(size_t(c.tokens) * c.v_dim, rng);
    std::vector<uint8_t> block(layout.block_bytes + 64, 0xAB);
    quantize_block(layout, k.data(), v.data(), 99, block.data());
    for (size_t i = layout.block_bytes; i < block.size(); ++i) ASSERT_EQ(block[i], 0xAB) << "wrote past the block";
    std::vector<float> k2(k.size()), v2(v.size());
    dequantize_block(layout, block.data(), k2.data(), v2.data());
    const float levels = float((1 << c.bits) - 1);
    const float step_tolerance = c.rounding == Rounding::kNearest ? 0.5f : 1.0f;
    for (int t = 0; t < c.tokens; ++t) {
      for (int p = 0; p < layout.k_partitions; ++p) {
        float lo = 1e30f, hi = -1e30f;
        for (int d = p * layout.k_partition; d < p * layout.k_partition + layout.k_partition_dims(p); ++d) {
          lo = std::min(lo, k[size_t(t) * c.k_dim + d]);
          hi = std::max(hi, k[size_t(t) * c.k_dim + d]);
        }
        const float step = (hi - lo) / levels;
        for (int d = p * layout.k_partition; d < p * layout.k_partition + layout.k_partition_dims(p); ++d) {
          ASSERT_LE(std::fabs(k2[size_t(t) * c.k_dim + d] - k[size_t(t) * c.k_dim + d]), step * step_tolerance + 2e-3f * (std::fabs(hi) + std::fabs(lo)) + 1e-3f);
        }
      }
    }
    expect_sums_match_codes(layout, block.data());
  }
}

// What a token selection reads (pq): some tokens' rows, keys and values or either alone, exactly as
// dequantize_block gives them.
TEST(QuantizedBlock, SomeTokensDecodeToTheirRowsOfTheBlock) {
  std::mt19937 rng(6);
  for (const FormatCase c :
       {FormatCase{2, 64, 128, 128, Rounding::kNearest}, FormatCase{4, 32, 80, 64, Rounding::kNearest},
        FormatCase{8, 128, 64, 96, Rounding::kStochastic}, FormatCase{2, 64, 32, 16, Rounding::kStochastic}}) {
    SCOPED_TRACE(c.name());
    const QuantizationConfig config{c.bits, c.bits, c.rounding, true};
    const QuantizedBlockLayout layout(config, {c.tokens, c.k_dim, c.v_dim});
    auto k = random_values(size_t(c.tokens) * c.k_dim, rng, 2.0f), v = random_values(size_t(c.tokens) * c.v_dim, rng);
    std::vector<uint8_t> block(layout.block_bytes);
    quantize_block(layout, k.data(), v.data(), 7, block.data());
    std::vector<float> all_k(k.size()), all_v(v.size());
    dequantize_block(layout, block.data(), all_k.data(), all_v.data());
    const std::vector<int> tokens = {0, 1, 5, 6, 7, c.tokens / 2 + 3, c.tokens - 1};
    const int n = int(tokens.size());
    std::vector<float> some_k(size_t(n) * c.k_dim + 1, -7.0f), some_v(size_t(n) * c.v_dim + 1, -7.0f);
    std::vector<float> keys_only(some_k.size(), -7.0f), values_only(some_v.size(), -7.0f);
    dequantize_tokens(layout, block.data(), tokens.data(), n, some_k.data(), some_v.data());
    dequantize_tokens(layout, block.data(), tokens.data(), n, keys_only.data(), nullptr);
    dequantize_tokens(layout, block.data(), tokens.data(), n, nullptr, values_only.data());
    for (int i = 0; i < n; ++i) {
      for (int d = 0; d < c.k_dim; ++d) {
        ASSERT_EQ(some_k[size_t(i) * c.k_dim + d], all_k[size_t(tokens[size_t(i)]) * c.k_dim + d])
            << "token " << tokens[size_t(i)];
        ASSERT_EQ(keys_only[size_t(i) * c.k_dim + d], some_k[size_t(i) * c.k_dim + d]);
      }
      for (int col = 0; col < c.v_dim; ++col) {
        ASSERT_EQ(some_v[size_t(i) * c.v_dim + col], all_v[size_t(tokens[size_t(i)]) * c.v_dim + col])
            << "token " << tokens[size_t(i)];
        ASSERT_EQ(values_only[size_t(i) * c.v_dim + col], some_v[size_t(i) * c.v_dim + col]);
      }
    }
    EXPECT_EQ(some_k.back(), -7.0f) << "wrote past the keys";
    EXPECT_EQ(some_v.back(), -7.0f) << "wrote past the values";
    EXPECT_EQ(keys_only.back(), -7.0f);
    EXPECT_EQ(values_only.back(), -7.0f);
    EXPECT_LT(dequantized_token_bytes(layout, n, true, true), layout.block_bytes) << "a few tokens read less";
  }
}

// KIVI's layouts (K per channel over groups of tokens, V per token over groups of columns) and
// symmetric ranges: each value within half a step of its own group's range, the group being the
// values the layout's definition puts together; sums match the codes; token reads match the block.
TEST(QuantizedBlock, ChannelAndTokenLayoutsRoundTripWithinTheirGroupsStep) {
  std::mt19937 rng(8);
  struct Case {
    int bits, tokens, dim, k_group, v_group;
    bool symmetric;
  };
  for (const Case c : {Case{2, 64, 128, 0, 0, false}, Case{2, 128, 128, 32, 32, false}, Case{4, 32, 64, 16, 16, true},
                       Case{2, 64, 80, 32, 16, true}}) {
    SCOPED_TRACE(str_cat("bits=", c.bits, ",pi=", c.tokens, ",d=", c.dim, ",kgroup=", c.k_group, ",vgroup=", c.v_group,
                         c.symmetric ? ",sym" : ""));
    QuantizationConfig config{c.bits, c.bits, Rounding::kNearest, true};
    config.k_per_channel = config.v_per_token = true;
    config.k_group = c.k_group;
    config.v_group = c.v_group;
    config.symmetric = c.symmetric;
    const QuantizedBlockLayout layout(config, {c.tokens, c.dim, c.dim});
    ASSERT_TRUE(check_quantized_shape(config, layout.shape).is_ok());
    auto k = random_values(size_t(c.tokens) * c.dim, rng, 2.0f), v = random_values(size_t(c.tokens) * c.dim, rng);
    for (int t = 0; t < c.tokens; ++t) k[size_t(t) * c.dim + 3] = 20.0f + float(t % 5);  // an outlier channel
    std::vector<uint8_t> block(layout.block_bytes + 64, 0xAB);
    quantize_block(layout, k.data(), v.data(), 1, block.data());
    for (size_t i = layout.block_bytes; i < block.size(); ++i) ASSERT_EQ(block[i], 0xAB) << "wrote past the block";
    std::vector<float> k2(k.size()), v2(v.size());
    dequantize_block(layout, block.data(), k2.data(), v2.data());
    const int k_group = c.k_group ? c.k_group : c.tokens, v_group = c.v_group ? c.v_group : c.dim;
    const float levels = float((1 << c.bits) - 1);
    // The step of the group of values x(i), i in [0, n).
    const auto step = [&](auto x, int n) {
      float lo = 1e30f, hi = -1e30f;
      for (int i = 0; i < n; ++i) {
        lo = std::min(lo, x(i));
        hi = std::max(hi, x(i));
      }
      if (c.symmetric) hi = std::max(hi, -lo), lo = -hi;
      return ((hi - lo) / levels) * 0.5f + 2e-3f * (std::fabs(hi) + std::fabs(lo)) + 1e-3f;
    };
    for (int t = 0; t < c.tokens; ++t) {
      for (int d = 0; d < c.dim; ++d) {
        const int t0 = t / k_group * k_group, c0 = d / v_group * v_group;
        const float k_step = step([&](int i) { return k[size_t(t0 + i) * c.dim + d]; }, k_group);
        const float v_step = step([&](int i) { return v[size_t(t) * c.dim + c0 + i]; }, v_group);
        ASSERT_LE(std::fabs(k2[size_t(t) * c.dim + d] - k[size_t(t) * c.dim + d]), k_step) << t << "," << d;
        ASSERT_LE(std::fabs(v2[size_t(t) * c.dim + d] - v[size_t(t) * c.dim + d]), v_step) << t << "," << d;
      }
    }
    expect_sums_match_codes(layout, block.data());
    const std::vector<int> tokens = {0, 3, 17, c.tokens - 1};
    std::vector<float> some_k(tokens.size() * size_t(c.dim)), some_v(some_k.size());
    dequantize_tokens(layout, block.data(), tokens.data(), int(tokens.size()), some_k.data(), some_v.data());
    for (size_t i = 0; i < tokens.size(); ++i) {
      for (int d = 0; d < c.dim; ++d) {
        ASSERT_EQ(some_k[i * c.dim + d], k2[size_t(tokens[i]) * c.dim + d]);
        ASSERT_EQ(some_v[i * c.dim + d], v2[size_t(tokens[i]) * c.dim + d]);
      }
    }
  }
  QuantizationConfig bad{2, 2, Rounding::kNearest, true};
  bad.k_per_channel = true;
  bad.k_group = 48;
  EXPECT_FALSE(check_quantized_shape(bad, {64, 128, 128}).is_ok()) << "a K group must divide the block";
}

TEST(QuantizedBlock, StochasticRoundingIsUnbiased) {
  std::mt19937 rng(8);
  const QuantizationConfig config{2, 2, Rounding::kStochastic, true};
  const QuantizedBlockLayout layout(config, {32, 32, 32});
  auto k = random_values(32 * 32, rng), v = random_values(32 * 32, rng);
  std::vector<double> mean_k(k.size(), 0.0);
  std::vector<uint8_t> block(layout.block_bytes);
  std::vector<float> k2(k.size()), v2(v.size());
  const int trials = 2000;
  for (int seed = 0; seed < trials; ++seed) {
    quantize_block(layout, k.data(), v.data(), uint64_t(seed), block.data());
    dequantize_block(layout, block.data(), k2.data(), v2.data());
    for (size_t i = 0; i < k.size(); ++i) mean_k[i] += k2[i] / trials;
  }
  double bias = 0, single = 0;
  quantize_block(layout, k.data(), v.data(), 12345, block.data());
  dequantize_block(layout, block.data(), k2.data(), v2.data());
  for (size_t i = 0; i < k.size(); ++i) {
    bias += std::fabs(mean_k[i] - k[i]) / double(k.size());
    single += std::fabs(k2[i] - k[i]) / double(k.size());
  }
  // One draw errs by ~a third of a step; the mean of 2000 by ~1/sqrt(2000) of that, plus the FP16
  // rounding of min and scale (the only bias left).
  EXPECT_LT(bias, single / 15) << "mean error " << bias << ", single-draw error " << single;
  // Nearest rounding is deterministic; stochastic rounding with the same seed is reproducible.
  std::vector<uint8_t> again(layout.block_bytes);
  quantize_block(layout, k.data(), v.data(), 12345, again.data());
  EXPECT_EQ(block, again);
}

}  // namespace
}  // namespace slimkv
