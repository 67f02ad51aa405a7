// ggml's block types: the scalar references against values worked out by hand from the block
// layouts, the SIMD dequantization against the references, and the quantized matmul (both paths:
// integer products for decode against their reference, widened chunks + BLAS for prefill against
// matmul_reference).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/dequantize.h"
#include "backend/cpu/quant_dot.h"
#include "backend/cpu/matmul.h"
#include "backend/random_ggml_blocks.h"
#include "tensor/ggml_type.h"
#include "slimkv/status.h"
#include "util/half.h"
#include "util/thread_pool.h"

namespace slimkv {
namespace {

constexpr BlockQuant kAll[] = {BlockQuant::kQ8_0, BlockQuant::kQ4_0, BlockQuant::kQ4_K, BlockQuant::kQ6_K};

using test::put_half;
using test::random_blocks;

TEST(GgmlBlocks, Q8_0AndQ4_0ReferencesFollowTheLayout) {
  uint8_t q8[34];
  put_half(q8, 0.25f);
  for (int i = 0; i < 32; ++i) q8[2 + i] = uint8_t(int8_t(i - 16));
  float out[32];
  dequantize_reference(BlockQuant::kQ8_0, q8, out, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[i], 0.25f * float(i - 16)) << i;

  uint8_t q4[18];
  put_half(q4, 0.5f);
  for (int j = 0; j < 16; ++j) q4[2 + j] = uint8_t(j | ((15 - j) << 4));  // low nibble: value j, high: value j + 16
  dequantize_reference(BlockQuant::kQ4_0, q4, out, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.5f * float(j - 8)) << j;
    EXPECT_EQ(out[j + 16], 0.5f * float(7 - j)) << j;
  }
}

TEST(GgmlBlocks, Q4_KReferenceUnpacksSixBitScalesAndMins) {
  // Sub-block s gets scale 10 + s and min 40 + s (6-bit values, sub-blocks 4..7 split across bytes);
  // every code is 3.
  uint8_t block[144] = {};
  put_half(block, 1.0f);
  put_half(block + 2, 0.5f);
  uint8_t* packed = block + 4;
  for (int s = 0; s < 8; ++s) {
    const int scale = 10 + s + (s >= 4 ? 40 : 0), min = 40 + s - (s >= 4 ? 20 : 0);
    if (s < 4) {
      packed[s] = uint8_t(scale);
      packed[s + 4] = uint8_t(min);
    } else {
      packed[s + 4] = uint8_t((scale & 15) | ((min & 15) << 4));
      packed[s - 4] |= uint8_t((scale >> 4) << 6);
      packed[s] |= uint8_t((min >> 4) << 6);
    }
  }
  std::memset(block + 16, 0x33, 128);
  float out[256];
  dequantize_reference(BlockQuant::kQ4_K, block, out, 256);
  for (int i = 0; i < 256; ++i) {
    const int s = i / 32;
    const int scale = 10 + s + (s >= 4 ? 40 : 0), min = 40 + s - (s >= 4 ? 20 : 0);
    ASSERT_EQ(out[i], 1.0f * float(scale) * 3.0f - 0.5f * float(min)) << i;
  }
}

TEST(GgmlBlocks, Q6_KReferenceJoinsLowAndHighBits) {
  // Value i of the block gets code (i % 64) in 0..63: low 4 bits in ql, high 2 in qh; scales 1..16.
  uint8_t block[210] = {};
  for (int i = 0; i < 256; ++i) {
    const int code = i % 64, half = i / 128, r = i % 128, run = r / 32, l = r % 32;
    uint8_t& low = block[half * 64 + l + (run % 2) * 32];
    low |= uint8_t(run < 2 ? (code & 15) : (code & 15) << 4);
    block[128 + half * 32 + l] |= uint8_t((code >> 4) << (2 * run));
  }
  for (int s = 0; s < 16; ++s) block[192 + s] = uint8_t(int8_t(s + 1));
  put_half(block + 208, 0.125f);
  float out[256];
  dequantize_reference(BlockQuant::kQ6_K, block, out, 256);
  for (int i = 0; i < 256; ++i) ASSERT_EQ(out[i], 0.125f * float(i / 16 + 1) * float(i % 64 - 32)) << i;
}

TEST(GgmlBlocks, SimdDequantizationMatchesTheReference) {
  std::mt19937 rng(5);
  for (BlockQuant quant : kAll) {
    const int64_t n = 8 * block_elements(quant);
    const std::vector<uint8_t> blocks = random_blocks(quant, n, rng);
    std::vector<float> fast(static_cast<size_t>(n)), reference(static_cast<size_t>(n));
    dequantize(quant, blocks.data(), fast.data(), n);
    dequantize_reference(quant, blocks.data(), reference.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      // The fast path folds the zero point into an FMA: equal up to a rounding of the scale product.
      ASSERT_NEAR(fast[size_t(i)], reference[size_t(i)], 1e-6f * (1.0f + std::fabs(reference[size_t(i)])))
          << block_quant_name(quant) << " value " << i;
    }
  }
}

TEST(GgmlBlocks, FirstNonFiniteBlockFindsABadScale) {
  std::mt19937 rng(6);
  for (BlockQuant quant : kAll) {
    std::vector<uint8_t> blocks = random_blocks(quant, 4 * block_elements(quant), rng);
    EXPECT_EQ(first_non_finite_block(quant, blocks.data(), 4 * block_elements(quant)), -1);
    const size_t scale_offset = quant == BlockQuant::kQ6_K ? 208 : quant == BlockQuant::kQ4_K ? 2 : 0;
    put_half(blocks.data() + 2 * block_bytes(quant) + scale_offset, INFINITY);
    EXPECT_EQ(first_non_finite_block(quant, blocks.data(), 4 * block_elements(quant)), 2) << block_quant_name(quant);
  }
}

TEST(Matmul, QuantizedWeightsMatchTheReference) {
  ThreadPool pool(3);
  std::mt19937 rng(12);
  std::normal_distribution<float> normal;
  for (BlockQuant quant : kAll) {
    for (const int n : {1, 3, 16, 17, 40}) {  // matrix-vector up to 16 inputs, widened chunks + BLAS beyond
      for (const int64_t cols : {block_elements(quant), 2 * block_elements(quant), int64_t(512)}) {
        const int64_t rows = 37;
        SCOPED_TRACE(str_cat("matmul(quant=", block_quant_name(quant), ",n=", n, ",rows=", rows, ",cols=", cols, ")"));
        const std::vector<uint8_t> w_bytes = random_blocks(quant, rows * cols, rng);
        std::vector<float> x(size_t(n * cols));
        for (float& e : x) e = normal(rng);
        const WeightMatrix w{w_bytes.data(), DType::kF32, rows, cols, quant};
        std::vector<float> y(size_t(n * rows), NAN), expected(y.size());
        matmul(x.data(), n, w, y.data(), pool);
        if (n <= 16 && quant_dot_tier() != QuantDotTier::kF32) {  // decode: integer products (quant_dot_test.cc)
          QuantizedActivations quantized;
          quantize_activations(quant_dot_tier(), x.data(), n, cols, quantized);
          matvec_quant_dot_reference(quantized, w_bytes.data(), quant, rows, expected.data());
        } else {
          matmul_reference(x.data(), n, w, expected.data());
        }
        double scale = 0;
        for (float e : expected) scale = std::max(scale, double(std::fabs(e)));
        for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], expected[i], 1e-5 * scale + 1e-6) << i;
        if (n <= 16) {  // the FP32 decode path (SLIMKV_QUANT_DOT=f32) on unrounded inputs
          matvec_quantized(x.data(), n, w_bytes.data(), quant, rows, cols, 0, rows, y.data());
          matmul_reference(x.data(), n, w, expected.data());
          for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], expected[i], 1e-5 * scale + 1e-6) << "f32 " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace slimkv
