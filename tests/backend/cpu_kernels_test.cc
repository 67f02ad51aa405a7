// CPU kernels against their references: vector ops (dot, dots, ...) at every length 0..2·(widest vector) and
// misaligned starts; matmul for F32/F16/BF16 weights on both paths (in-register widening for few
// inputs, panel_gemm for many) with odd sizes, partial panels and several depth chunks.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/bf16_gemm.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/vec_ops.h"
#include "slimkv/status.h"
#include "util/half.h"

namespace slimkv {
namespace {

TEST(VecOps, EveryLengthAndOffsetMatchesScalar) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<float> a(200), b(200);
  std::vector<uint16_t> bf(200), fp(200);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = uniform(rng);
    b[i] = uniform(rng);
    bf[i] = float_to_bf16(b[i]);
    fp[i] = float_to_fp16(b[i]);
  }
  for (int offset = 0; offset < 3; ++offset) {
    for (size_t n = 0; n <= 2 * 16 + 3; ++n) {
      SCOPED_TRACE(str_cat("n=", n, " offset=", offset));
      double expected = 0, expected_bf = 0, expected_fp = 0;
      for (size_t i = 0; i < n; ++i) {
        expected += double(a[offset + i]) * b[offset + i];
        expected_bf += double(a[offset + i]) * bf16_to_float(bf[offset + i]);
        expected_fp += double(a[offset + i]) * fp16_to_float(fp[offset + i]);
      }
      EXPECT_NEAR(dot(&a[offset], &b[offset], n), expected, 1e-5);
      std::vector<float> scores(3 * 2 + 1, -1.0f);  // 3 queries (rows of a) · 2 rows of b, n apart
      dots(&a[offset], 3, &b[offset], 2, n, scores.data());
      for (size_t i = 0; i < 2; ++i) {
        for (size_t r = 0; r < 3; ++r) {
          double expected_dot = 0;
          for (size_t j = 0; j < n; ++j) expected_dot += double(a[offset + r * n + j]) * b[offset + i * n + j];
          EXPECT_NEAR(scores[i * 3 + r], expected_dot, 1e-5) << "dots row " << i << " query " << r;
        }
      }
      EXPECT_EQ(scores[6], -1.0f) << "dots wrote past the end";
      float y_bf = 0, y_fp = 0;
      matvec_half(&a[offset], 1, &bf[offset], DType::kBF16, 1, int64_t(n), 0, 1, &y_bf);
      matvec_half(&a[offset], 1, &fp[offset], DType::kF16, 1, int64_t(n), 0, 1, &y_fp);
      EXPECT_NEAR(y_bf, expected_bf, 1e-5);
      EXPECT_NEAR(y_fp, expected_fp, 1e-5);
      std::vector<float> y(n + 1, 7.0f), widened(n + 1, -1.0f);
      mul_add_to(0.5f, &a[offset], y.data(), n);
      widen_to_f32(&bf[offset], DType::kBF16, widened.data(), n);
      for (size_t i = 0; i < n; ++i) {
        EXPECT_FLOAT_EQ(y[i], 7.0f + 0.5f * a[offset + i]);
        EXPECT_EQ(widened[i], bf16_to_float(bf[offset + i]));
      }
      EXPECT_EQ(y[n], 7.0f) << "wrote past the end";
      EXPECT_EQ(widened[n], -1.0f) << "wrote past the end";
    }
  }
}

// A batched decode must give each sequence the bits it gets alone: matvec_half of n inputs (tiles of rows x
// inputs, 15 inputs and 1, 6, 7 rows leave edge tiles of every size) writes, for every input, exactly what a call
// with that input alone writes.
TEST(CpuKernels, MatVecHalfOfManyInputsGivesEachInputItsBitsAlone) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const int64_t cols : {1, 7, 16, 33, 384}) {
      for (const int64_t rows : {1, 6, 7}) {
        const int64_t n = 15;
        std::vector<uint16_t> w(size_t(rows * cols));
        for (uint16_t& value : w) value = dtype == DType::kBF16 ? float_to_bf16(normal(rng)) : float_to_fp16(normal(rng));
        std::vector<float> x(size_t(n * cols));
        for (float& value : x) value = normal(rng);
        std::vector<float> together(size_t(n * rows));
        matvec_half(x.data(), n, w.data(), dtype, rows, cols, 0, rows, together.data());
        for (int64_t i = 0; i < n; ++i) {
          std::vector<float> alone(static_cast<size_t>(rows));
          matvec_half(x.data() + i * cols, 1, w.data(), dtype, rows, cols, 0, rows, alone.data());
          for (int64_t o = 0; o < rows; ++o) {
            EXPECT_EQ(together[size_t(i * rows + o)], alone[size_t(o)])
                << dtype_name(dtype) << " rows " << rows << " cols " << cols << " input " << i;
          }
        }
      }
    }
  }
}

TEST(HalfConversion, RoundsToNearestEvenAndKeepsSpecials) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);  // rounds up to inf
  EXPECT_EQ(float_to_fp16(5.9604645e-8f), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(NAN))));
  EXPECT_EQ(float_to_bf16(1.00390625f), 0x3f80);  // tie → even
  EXPECT_EQ(float_to_bf16(1.01171875f), 0x3f82);  // tie → even (up)
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite FP16 survives the round trip
    ASSERT_EQ(float_to_fp16(fp16_to_float(uint16_t(h))), h) << h;
  }
}

TEST(Matmul, EveryDtypeAndPathMatchesReference) {
  ThreadPool pool(3);  // more threads than cores: tasks must still all run, once
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (const int n : {1, 2, 4, 5, 17, 41}) {
      for (const int cols : {1, 37, 129, 300}) {  // 300: two depth chunks of panel_gemm
        const int rows = 70;  // two whole panels of 32 and a partial one
        SCOPED_TRACE(str_cat("matmul(dtype=", dtype_name(dtype), ",n=", n, ",rows=", rows, ",cols=", cols, ")"));
        std::vector<float> x(size_t(n) * cols), w32(size_t(rows) * cols);
        for (float& e : x) e = normal(rng);
        for (float& e : w32) e = normal(rng);
        std::vector<uint16_t> w16(w32.size());
        for (size_t i = 0; i < w32.size(); ++i) w16[i] = dtype == DType::kBF16 ? float_to_bf16(w32[i]) : float_to_fp16(w32[i]);
        const WeightMatrix w{dtype == DType::kF32 ? static_cast<const void*>(w32.data()) : w16.data(), dtype, rows, cols};
        std::vector<float> y(size_t(n) * rows), expected(y.size());
        matmul(x.data(), n, w, y.data(), pool);
        matmul_reference(x.data(), n, w, expected.data());
        for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], expected[i], 1e-4 * std::sqrt(double(cols))) << i;
      }
    }
  }
}

// q, k and v (or gate and up) in one pool loop: each output as its own matmul gives it, whatever the
// products' sizes (tasks numbered across products, one product's last task partial) and the threads.
TEST(Matmul, SharedInputProductsEachMatchTheirOwnMatmul) {
  std::mt19937 rng(12);
  std::normal_distribution<float> normal;
  for (const int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      for (const int n : {1, 3, 20}) {
        const int cols = 384;
        const std::vector<int> rows = {512, 70, 256};  // several tasks, a single partial panel, several again
        SCOPED_TRACE(str_cat("threads=", threads, ",dtype=", dtype_name(dtype), ",n=", n));
        std::vector<float> x(size_t(n) * cols);
        for (float& e : x) e = normal(rng);
        std::vector<std::vector<float>> w32(rows.size());
        std::vector<std::vector<uint16_t>> w16(rows.size());
        std::vector<WeightMatrix> w(rows.size());
        std::vector<std::vector<float>> y(rows.size()), alone(rows.size());
        std::vector<MatmulProduct> products;
        for (size_t m = 0; m < rows.size(); ++m) {
          w32[m].resize(size_t(rows[m]) * cols);
          for (float& e : w32[m]) e = normal(rng);
          for (float e : w32[m]) w16[m].push_back(float_to_bf16(e));
          w[m] = {dtype == DType::kF32 ? static_cast<const void*>(w32[m].data()) : w16[m].data(), dtype, rows[m], cols};
          y[m].assign(size_t(n) * rows[m], NAN);
          alone[m].resize(y[m].size());
          products.push_back({&w[m], y[m].data()});
        }
        matmul_shared_input(x.data(), n, products, pool);
        for (size_t m = 0; m < rows.size(); ++m) {
          matmul(x.data(), n, w[m], alone[m].data(), pool);
          std::vector<float> expected(y[m].size());
          matmul_reference(x.data(), n, w[m], expected.data());
          for (size_t i = 0; i < y[m].size(); ++i) {
            if (dtype != DType::kF32) {
              ASSERT_EQ(y[m][i], alone[m][i]) << "product " << m << " element " << i;
            }
            ASSERT_NEAR(y[m][i], expected[i], 1e-4 * std::sqrt(double(cols))) << "product " << m << " element " << i;
          }
        }
      }
    }
  }
}

// A batch's items (MatmulItems) each get the bits they get alone, whichever path the batch's size would
// have taken: short items (decodes, short prompts) beside long ones, more short rows than one few-input
// call holds, on every dtype and, for BF16, the packed panels where this CPU's tier reads them.
TEST(Matmul, EachItemOfABatchGetsItsBitsAlone) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal;
  ThreadPool pool(2);
  const std::vector<int> items = {1, 20, 3, 1, 40, 12, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  int n = 0;
  for (int item : items) n += item;
  const int rows = 70, cols = 300;
  std::vector<float> x(size_t(n) * cols), w32(size_t(rows) * cols);
  for (float& e : x) e = normal(rng);
  for (float& e : w32) e = normal(rng);
  std::vector<uint16_t> w16(w32.size());
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (size_t i = 0; i < w32.size(); ++i) w16[i] = dtype == DType::kBF16 ? float_to_bf16(w32[i]) : float_to_fp16(w32[i]);
    WeightMatrix w{dtype == DType::kF32 ? static_cast<const void*>(w32.data()) : w16.data(), dtype, rows, cols};
    Bf16Panels panels;
    if (takes_bf16_panels(w)) {
      panels = bf16_pack_panels(w16.data(), rows, cols);
      w.bf16_panels = panels.get();
    }
    SCOPED_TRACE(str_cat("dtype=", dtype_name(dtype), w.bf16_panels != nullptr ? " (packed panels)" : ""));
    std::vector<float> y(size_t(n) * rows), alone(y.size());
    matmul(x.data(), n, w, y.data(), pool, items);
    int first = 0;
    for (int item : items) {
      matmul(x.data() + size_t(first) * cols, item, w, alone.data() + size_t(first) * rows, pool);
      first += item;
    }
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], alone[i]) << "element " << i << " (row " << i / rows << ")";
  }
}

}  // namespace
}  // namespace slimkv
