// The GPU's forward-pass steps (backend/cuda/layer_kernels.h, backend/cuda/gemm.h) against scalar
// references: the CPU's matmul_reference for the cuBLAS product, plain loops in double for the rest.
// Inputs are rounded to the dtype the GPU reads, so only the GPU's arithmetic is compared.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/layer_kernels.h"
#include "util/half.h"

namespace slimkv::cuda {
namespace {

class CudaLayerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const Status usable = device_usable();
    if (!usable) GTEST_SKIP() << "CUDA tests skipped: " << usable.message();
  }
};

uint16_t to_half(float x, DType dtype) { return dtype == DType::kBF16 ? float_to_bf16(x) : float_to_fp16(x); }
float from_half(uint16_t h, DType dtype) { return dtype == DType::kBF16 ? bf16_to_float(h) : fp16_to_float(h); }

std::vector<float> normal_floats(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

std::vector<uint16_t> halves(const std::vector<float>& x, DType dtype) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = to_half(x[i], dtype);
  return h;
}

template <typename T>
DeviceArray<T> on_device(const std::vector<T>& host) {
  auto array = DeviceArray<T>::allocate(host.size(), "test");
  EXPECT_TRUE(array.has_value());
  EXPECT_TRUE(array->upload(host.data(), host.size()).is_ok());
  return array.take();
}

template <typename T>
std::vector<T> on_host(const DeviceArray<T>& device) {
  std::vector<T> host(device.size());
  EXPECT_TRUE(device_synchronize("test kernels").is_ok());
  EXPECT_TRUE(device.download(host.data(), host.size()).is_ok());
  return host;
}

// ‖got − want‖ / ‖want‖, with NaN failing.
double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double error = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    error += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(error / norm);
}

TEST_F(CudaLayerTest, GemmMatchesMatmulReference) {
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (int n : {1, 7, 64}) {
      SCOPED_TRACE(str_cat("gemm(dtype=", dtype_name(dtype), ",n=", n, ",rows=96,cols=136)"));
      std::mt19937 rng(unsigned(n) * 7u + unsigned(dtype));
      const int rows = 96, cols = 136;
      auto x = halves(normal_floats(size_t(n) * cols, rng), dtype);
      auto w = halves(normal_floats(size_t(rows) * cols, rng), dtype);
      std::vector<float> x_float(x.size()), want(size_t(n) * rows);
      for (size_t i = 0; i < x.size(); ++i) x_float[i] = from_half(x[i], dtype);
      matmul_reference(x_float.data(), n, WeightMatrix{w.data(), dtype, rows, cols}, want.data());
      auto gemm = CublasGemm::create();
      ASSERT_TRUE(gemm.has_value()) << gemm.status().message();
      auto x_device = on_device(x), w_device = on_device(w);
      auto y_device = on_device(std::vector<float>(size_t(n) * rows, NAN));
      ASSERT_TRUE((*gemm)->multiply(x_device.data(), n, w_device.data(), dtype, rows, cols, y_device.data()).is_ok());
      EXPECT_LT(relative_error(on_host(y_device), std::vector<double>(want.begin(), want.end())), 1e-5);
    }
  }
}

TEST_F(CudaLayerTest, EmbedRmsnormSwigluMatchLoops) {
  std::mt19937 rng(7);
  const int n = 5, hidden = 384, vocab = 50;
  const DType dtype = DType::kBF16;
  auto table = halves(normal_floats(size_t(vocab) * hidden, rng), dtype);
  const std::vector<int32_t> tokens = {3, 0, 49, 3, 17};
  auto x_device = on_device(std::vector<float>(size_t(n) * hidden, NAN));
  auto tokens_device = on_device(tokens);
  auto table_device = on_device(table);
  ASSERT_TRUE(embed(tokens_device.data(), n, table_device.data(), dtype, hidden, x_device.data()).is_ok());
  const std::vector<float> x = on_host(x_device);
  for (int t = 0; t < n; ++t) {
    for (int c = 0; c < hidden; ++c) {
      ASSERT_EQ(x[size_t(t) * hidden + c], bf16_to_float(table[size_t(tokens[size_t(t)]) * hidden + c]));
    }
  }

  // RMSNorm, into each half dtype.
  const std::vector<float> weight = normal_floats(hidden, rng);
  auto weight_device = on_device(weight);
  for (DType out_dtype : {DType::kF16, DType::kBF16}) {
    auto out_device = on_device(std::vector<uint16_t>(size_t(n) * hidden, 0xffff));
    ASSERT_TRUE(rmsnorm(x_device.data(), weight_device.data(), 1e-5f, n, hidden, out_device.data(), out_dtype).is_ok());
    const auto out = on_host(out_device);
    std::vector<float> got(out.size());
    std::vector<double> want(out.size());
    for (int t = 0; t < n; ++t) {
      double square_sum = 0;
      for (int c = 0; c < hidden; ++c) square_sum += double(x[size_t(t) * hidden + c]) * x[size_t(t) * hidden + c];
      const double inv_rms = 1.0 / std::sqrt(square_sum / hidden + 1e-5);
      for (int c = 0; c < hidden; ++c) {
        const size_t i = size_t(t) * hidden + c;
        want[i] = weight[size_t(c)] * x[i] * inv_rms;
        got[i] = from_half(out[i], out_dtype);
      }
    }
    EXPECT_LT(relative_error(got, want), out_dtype == DType::kBF16 ? 5e-3 : 1e-3) << dtype_name(out_dtype);
  }

  // SwiGLU and the residual add.
  const size_t size = 1000;
  const auto gate = normal_floats(size, rng), up = normal_floats(size, rng);
  auto gate_device = on_device(gate), up_device = on_device(up);
  auto swiglu_device = on_device(std::vector<uint16_t>(size, 0xffff));
  ASSERT_TRUE(swiglu(gate_device.data(), up_device.data(), size, swiglu_device.data(), DType::kF16).is_ok());
  ASSERT_TRUE(add(gate_device.data(), up_device.data(), size).is_ok());
  const auto swiglu_out = on_host(swiglu_device);
  const auto sums = on_host(gate_device);
  std::vector<float> got(size);
  std::vector<double> want(size);
  for (size_t i = 0; i < size; ++i) {
    got[i] = fp16_to_float(swiglu_out[i]);
    want[i] = gate[i] / (1.0 + std::exp(-double(gate[i]))) * up[i];
    ASSERT_EQ(sums[i], gate[i] + up[i]);
  }
  EXPECT_LT(relative_error(got, want), 1e-3);
}

TEST_F(CudaLayerTest, RopeMatchesRotateHalf) {
  std::mt19937 rng(11);
  const int n = 3, heads = 4, head_dim = 128, half = head_dim / 2;
  const auto x = normal_floats(size_t(n) * heads * head_dim, rng);
  std::vector<float> cos(size_t(n) * half), sin(cos.size());
  std::uniform_real_distribution<float> angle(-3.14f, 3.14f);
  for (size_t i = 0; i < cos.size(); ++i) {
    const float a = angle(rng);
    cos[i] = std::cos(a);
    sin[i] = std::sin(a);
  }
  auto x_device = on_device(x), cos_device = on_device(cos), sin_device = on_device(sin);
  ASSERT_TRUE(rope(x_device.data(), n, heads, head_dim, cos_device.data(), sin_device.data()).is_ok());
  const auto got = on_host(x_device);
  std::vector<double> want(x.size());
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < heads; ++h) {
      const size_t row = (size_t(t) * heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const double c = cos[size_t(t) * half + i], s = sin[size_t(t) * half + i];
        want[row + i] = x[row + i] * c - x[row + i + half] * s;
        want[row + i + half] = x[row + i + half] * c + x[row + i] * s;
      }
    }
  }
  EXPECT_LT(relative_error(got, want), 1e-6);
}

TEST_F(CudaLayerTest, ArgmaxPicksTheFirstOfEqualMaxima) {
  std::mt19937 rng(13);
  const int vocab = 5000;
  std::vector<float> logits = normal_floats(size_t(2) * vocab, rng);
  logits[5] = logits[700] = 100.0f;               // row 0: a tie, the first wins (as std::max_element)
  logits[size_t(vocab) + vocab - 1] = 50.0f;      // row 1: the last entry
  auto logits_device = on_device(logits);
  auto out_device = on_device(std::vector<int32_t>(2, -1));
  ASSERT_TRUE(argmax_rows(logits_device.data(), 2, vocab, out_device.data()).is_ok());
  const auto out = on_host(out_device);
  EXPECT_EQ(out[0], 5);
  EXPECT_EQ(out[1], vocab - 1);
}

TEST_F(CudaLayerTest, ConvertRoundTrips) {
  std::mt19937 rng(17);
  const auto x = normal_floats(777, rng);
  auto x_device = on_device(x);
  auto half_device = on_device(std::vector<uint16_t>(x.size(), 0));
  auto back_device = on_device(std::vector<float>(x.size(), NAN));
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    ASSERT_TRUE(convert(x_device.data(), x.size(), half_device.data(), dtype).is_ok());
    ASSERT_TRUE(widen(half_device.data(), dtype, x.size(), back_device.data()).is_ok());
    const auto back = on_host(back_device);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(back[i], from_half(to_half(x[i], dtype), dtype)) << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace slimkv::cuda
