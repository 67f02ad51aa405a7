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
#include "cuda_test_util.h"
#include "kv/rotation.h"
#include "model/model_config.h"
#include "model/rope.h"
#include "util/half.h"

namespace slimkv::cuda {
namespace {

using CudaLayerTest = CudaTest;

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

TEST_F(CudaLayerTest, EmbedAndRmsnormMatchLoops) {
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

  // RMSNorm of chosen rows (the tokens whose logits are wanted).
  const std::vector<int32_t> rows = {4, 1};
  auto rows_device = on_device(rows);
  auto picked_device = on_device(std::vector<uint16_t>(rows.size() * hidden, 0xffff));
  auto all_device = on_device(std::vector<uint16_t>(size_t(n) * hidden, 0xffff));
  ASSERT_TRUE(rmsnorm(x_device.data(), weight_device.data(), 1e-5f, 2, hidden, picked_device.data(), DType::kF16,
                      rows_device.data()).is_ok());
  ASSERT_TRUE(rmsnorm(x_device.data(), weight_device.data(), 1e-5f, n, hidden, all_device.data(), DType::kF16).is_ok());
  const auto picked = on_host(picked_device), all = on_host(all_device);
  for (size_t r = 0; r < rows.size(); ++r) {
    for (int c = 0; c < hidden; ++c) ASSERT_EQ(picked[r * hidden + c], all[size_t(rows[r]) * hidden + c]);
  }
}

TEST_F(CudaLayerTest, SwigluOfFusedGateUpMatchesLoop) {
  std::mt19937 rng(5);
  const int n = 3, intermediate = 333;
  const auto gate_up = normal_floats(size_t(n) * 2 * intermediate, rng);
  auto gate_up_device = on_device(gate_up);
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    auto out_device = on_device(std::vector<uint16_t>(size_t(n) * intermediate, 0xffff));
    ASSERT_TRUE(swiglu(gate_up_device.data(), n, intermediate, out_device.data(), dtype).is_ok());
    const auto out = on_host(out_device);
    std::vector<float> got(out.size());
    std::vector<double> want(out.size());
    for (int t = 0; t < n; ++t) {
      for (int i = 0; i < intermediate; ++i) {
        const double g = gate_up[size_t(t) * 2 * intermediate + i], u = gate_up[size_t(t) * 2 * intermediate + intermediate + i];
        want[size_t(t) * intermediate + i] = g / (1.0 + std::exp(-g)) * u;
        got[size_t(t) * intermediate + i] = from_half(out[size_t(t) * intermediate + i], dtype);
      }
    }
    EXPECT_LT(relative_error(got, want), dtype == DType::kBF16 ? 5e-3 : 1e-3) << dtype_name(dtype);
  }
}

// Bias, RoPE, rot=hadamard and the FP16 split against the CPU's Rope (default and llama3 inverse
// frequencies) and hadamard_rotate, at positions far apart (the angles' FP32 product and double cos/sin
// must agree with model/rope.cc).
TEST_F(CudaLayerTest, AttentionInputsMatchCpuRopeAndRotation) {
  for (const auto& [rope_type, rotate] : std::vector<std::pair<std::string, bool>>{
           {"default", false}, {"llama3", false}, {"llama3", true}}) {
    SCOPED_TRACE(str_cat(rope_type, rotate ? " rot=hadamard" : ""));
    ModelConfig config;
    config.head_dim = 64;
    config.rope.theta = 500000.0;
    if (rope_type == "llama3") {
      config.rope.type = RopeType::kLlama3;
      config.rope.factor = 8.0;
      config.rope.original_max_position_embeddings = 8192;
    }
    const Rope rope(config.rope, int(config.head_dim));
    const AttentionHeads heads{4, 2, 64};
    const int n = 3, width = (heads.num_heads + 2 * heads.num_kv_heads) * heads.head_dim;
    const std::vector<int32_t> positions = {0, 17, 100000};
    std::mt19937 rng(11);
    const auto qkv = normal_floats(size_t(n) * width, rng), bias = normal_floats(size_t(width), rng);
    auto qkv_device = on_device(qkv), bias_device = on_device(bias);
    auto positions_device = on_device(positions);
    auto inv_freq_device = on_device(rope.inverse_frequencies());
    auto q_device = on_device(std::vector<uint16_t>(size_t(n) * 4 * 64, 0xffff));
    auto k_device = on_device(std::vector<uint16_t>(size_t(n) * 2 * 64, 0xffff));
    auto v_device = on_device(std::vector<uint16_t>(size_t(n) * 2 * 64, 0xffff));
    ASSERT_TRUE(attention_inputs(qkv_device.data(), n, heads, bias_device.data(), positions_device.data(),
                                 inv_freq_device.data(), rotate, q_device.data(), k_device.data(), v_device.data())
                    .is_ok());
    const auto q = on_host(q_device), k = on_host(k_device), v = on_host(v_device);
    for (int t = 0; t < n; ++t) {
      std::vector<float> row(qkv.begin() + ptrdiff_t(t) * width, qkv.begin() + ptrdiff_t(t + 1) * width);
      for (int i = 0; i < width; ++i) row[size_t(i)] += bias[size_t(i)];
      std::vector<float> cos, sin;
      rope.angles(positions[size_t(t)], 1, cos, sin);
      rope.rotate(row.data(), 1, heads.num_heads + heads.num_kv_heads, cos, sin);  // q and k heads are adjacent
      if (rotate) {
        for (int h = 0; h < heads.num_heads + 2 * heads.num_kv_heads; ++h) hadamard_rotate(row.data() + h * 64, 64);
      }
      // The GPU may fuse a·c − b·s into one FMA: the FP16 results agree to a rounding step.
      const auto expect_half = [](uint16_t got, float want, const char* what, int i) {
        ASSERT_NEAR(fp16_to_float(got), want, std::fabs(want) * 1e-3 + 1e-5) << what << " " << i;
      };
      for (int i = 0; i < 4 * 64; ++i) expect_half(q[size_t(t) * 256 + i], row[size_t(i)], "q", i);
      for (int i = 0; i < 2 * 64; ++i) {
        expect_half(k[size_t(t) * 128 + i], row[size_t(256 + i)], "k", i);
        expect_half(v[size_t(t) * 128 + i], row[size_t(384 + i)], "v", i);
      }
    }
  }
}

TEST_F(CudaLayerTest, RotateHeadsMatchesTheCpuRotation) {
  std::mt19937 rng(19);
  for (int head_dim : {16, 64, 128}) {
    const size_t rows = 5;
    const auto x = halves(normal_floats(rows * size_t(head_dim), rng), DType::kF16);
    auto x_device = on_device(x);
    SLIMKV_ASSERT_OK(rotate_heads(x_device.data(), rows, head_dim));
    const auto once = on_host(x_device);
    SLIMKV_ASSERT_OK(rotate_heads(x_device.data(), rows, head_dim));
    const auto twice = on_host(x_device);
    for (size_t r = 0; r < rows; ++r) {
      std::vector<float> want(static_cast<size_t>(head_dim));
      for (int i = 0; i < head_dim; ++i) want[size_t(i)] = fp16_to_float(x[r * size_t(head_dim) + size_t(i)]);
      hadamard_rotate(want.data(), head_dim);
      for (int i = 0; i < head_dim; ++i) {
        const size_t at = r * size_t(head_dim) + size_t(i);
        ASSERT_EQ(once[at], float_to_fp16(want[size_t(i)])) << "d " << head_dim << " row " << r << " dim " << i;
        ASSERT_NEAR(fp16_to_float(twice[at]), fp16_to_float(x[at]), 2e-3 * (1 + std::fabs(fp16_to_float(x[at]))));
      }
    }
  }
  EXPECT_FALSE(rotate_heads(nullptr, 1, 96).is_ok());  // not a power of two
}

TEST_F(CudaLayerTest, ConvertHalfMatchesHostRounding) {
  std::mt19937 rng(17);
  const auto x = halves(normal_floats(777, rng), DType::kF16);
  auto x_device = on_device(x);
  auto out_device = on_device(std::vector<uint16_t>(x.size(), 0));
  ASSERT_TRUE(convert_half(x_device.data(), DType::kF16, x.size(), out_device.data(), DType::kBF16).is_ok());
  const auto out = on_host(out_device);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(out[i], float_to_bf16(fp16_to_float(x[i])));
}

}  // namespace
}  // namespace slimkv::cuda
