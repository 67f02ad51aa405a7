// A step's weight products item by item (backend/cuda/item_products.h): each item's rows get the bits
// they get in a product of that item alone, whatever items come before and after it (decode rows,
// short prompt pieces padded together, long ones on their own; or, PlainItems::kAlone as an MoE layer's
// experts run, every item on its own, items of no rows among them), overwriting and accumulating into an
// output wider than the matrix; and the products equal the FP64 reference within FP32 summation's bound.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/item_products.h"
#include "cuda_test_util.h"

namespace slimkv::cuda {
namespace {

using ItemProductsTest = CudaTest;

TEST_F(ItemProductsTest, EachItemGetsTheBitsItGetsAlone) {
  constexpr int64_t kRows = 300, kCols = 256, kStride = kRows + 3;
  std::mt19937 rng(22);
  std::vector<float> w_values, x_values;
  const std::vector<uint16_t> w_bits = random_halves(size_t(kRows * kCols), 0.05f, rng, w_values);
  const auto w_device = on_device(w_bits);
  const DeviceMatrix w{const_cast<uint16_t*>(w_device.data()), nullptr, DType::kF16, BlockQuant::kNone, kRows, kCols};
  auto gemm = take(WeightGemm::create(0));
  auto products = take(ItemProducts::create(kCols, kRows));
  // Items as a server's steps lay them out: decode rows, a chunk past a padded group (65, 100), a group
  // filled exactly (64), groups cut where the next item does not fit (30 + 40).
  for (const std::vector<int>& items : {std::vector<int>{1, 1, 1}, std::vector<int>{30, 100, 1, 64, 65, 5},
                                        std::vector<int>{1, 30, 40, 1, 1}, std::vector<int>{200}, std::vector<int>{0, 3, 0, 70, 0}}) {
    const int n = std::accumulate(items.begin(), items.end(), 0);
    const std::vector<uint16_t> x_bits = random_halves(size_t(n) * kCols, 1.0f, rng, x_values);
    for (const auto& [accumulate, plain] : {std::pair{false, PlainItems::kPaddedGroups}, std::pair{true, PlainItems::kPaddedGroups},
                                           std::pair{false, PlainItems::kAlone}, std::pair{true, PlainItems::kAlone}}) {
      SCOPED_TRACE(testing::Message() << items.size() << " items of " << n << " rows, accumulate " << accumulate
                                      << (plain == PlainItems::kAlone ? ", each alone" : ", padded groups"));
      std::vector<float> y0(size_t(n) * kStride);
      std::uniform_real_distribution<float> before(-4.0f, 4.0f);
      for (float& v : y0) v = before(rng);
      const auto x_device = on_device(x_bits);
      auto y_device = on_device(y0);
      SLIMKV_ASSERT_OK(products->multiply(*gemm, x_device.data(), items, DType::kF16, w, y_device.data(), accumulate, kStride, plain));
      const std::vector<float> y = on_host(y_device);
      int first = 0;
      for (const int rows : items) {
        if (rows == 0) continue;
        // The item alone: its rows, its part of y0.
        const std::vector<uint16_t> x_alone(x_bits.begin() + ptrdiff_t(first) * kCols, x_bits.begin() + ptrdiff_t(first + rows) * kCols);
        const std::vector<float> y0_alone(y0.begin() + ptrdiff_t(first) * kStride, y0.begin() + ptrdiff_t(first + rows) * kStride);
        const auto x_alone_device = on_device(x_alone);
        auto y_alone_device = on_device(y0_alone);
        SLIMKV_ASSERT_OK(products->multiply(*gemm, x_alone_device.data(), std::vector<int>{rows}, DType::kF16, w,
                                            y_alone_device.data(), accumulate, kStride, plain));
        const std::vector<float> y_alone = on_host(y_alone_device);
        for (int r = 0; r < rows; ++r) {
          for (int64_t o = 0; o < kStride; ++o) {
            const size_t at = size_t(first + r) * kStride + size_t(o);
            ASSERT_EQ(y[at], y_alone[size_t(r) * kStride + size_t(o)]) << "row " << first + r << ", column " << o;
            if (o >= kRows) {
              ASSERT_EQ(y[at], y0[at]) << "column " << o << " past the product's " << kRows << " was written";
              continue;
            }
            double sum = 0, magnitude = 0;
            for (int64_t c = 0; c < kCols; ++c) {
              const double product = double(x_values[size_t(first + r) * kCols + size_t(c)]) * double(w_values[size_t(o * kCols + c)]);
              sum += product;
              magnitude += std::fabs(product);
            }
            const double base = accumulate ? double(y0[at]) : 0.0, u = 1.0 / (1 << 24);
            const double bound = double(kCols + 1) * u / (1 - double(kCols + 1) * u) * (magnitude + std::fabs(base));
            ASSERT_LE(std::fabs(double(y[at]) - (base + sum)), bound) << "row " << first + r << ", column " << o;
          }
        }
        first += rows;
      }
    }
  }
}

// A matrix wider than the scratch made for the padded groups is refused naming both sizes, y untouched;
// items each alone need no scratch.
TEST_F(ItemProductsTest, AMatrixPastTheScratchIsRefusedByName) {
  constexpr int64_t kRows = 40, kCols = 64;
  std::mt19937 rng(23);
  std::vector<float> values;
  const auto w_device = on_device(random_halves(size_t(kRows * kCols), 0.05f, rng, values));
  const DeviceMatrix w{const_cast<uint16_t*>(w_device.data()), nullptr, DType::kF16, BlockQuant::kNone, kRows, kCols};
  auto gemm = take(WeightGemm::create(0));
  auto products = take(ItemProducts::create(/*max_cols=*/32, /*max_rows=*/kRows));
  const auto x = on_device(random_halves(size_t(2 * kCols), 1.0f, rng, values));
  const std::vector<float> y0(size_t(2 * kRows), 7.0f);
  auto y = on_device(y0);
  const Status refused = products->multiply(*gemm, x.data(), std::vector<int>{1, 1}, DType::kF16, w, y.data());
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.message().find("[40 x 64] matrix"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("32 inputs"), std::string::npos) << refused.message();
  EXPECT_EQ(on_host(y), y0);
  SLIMKV_ASSERT_OK(products->multiply(*gemm, x.data(), std::vector<int>{1, 1}, DType::kF16, w, y.data(), false, 0, PlainItems::kAlone));
}

}  // namespace
}  // namespace slimkv::cuda
