// The GPU's forward-pass steps (backend/cuda/layer_kernels.h, backend/cuda/gemm.h) against scalar
// references: the CPU's matmul_reference for the cuBLAS product, plain loops in double for the rest.
// Inputs are rounded to the dtype the GPU reads, so only the GPU's arithmetic is compared.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
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
  // Gemma's scale first (an FP32 product per value), then 1 (exact), which the rest reads.
  const float scale = std::sqrt(384.0f);
  ASSERT_TRUE(embed(tokens_device.data(), n, table_device.data(), dtype, hidden, scale, x_device.data()).is_ok());
  const std::vector<float> scaled = on_host(x_device);
  ASSERT_TRUE(embed(tokens_device.data(), n, table_device.data(), dtype, hidden, 1.0f, x_device.data()).is_ok());
  const std::vector<float> x = on_host(x_device);
  for (int t = 0; t < n; ++t) {
    for (int c = 0; c < hidden; ++c) {
      const float value = bf16_to_float(table[size_t(tokens[size_t(t)]) * hidden + c]);
      ASSERT_EQ(x[size_t(t) * hidden + c], value);
      ASSERT_EQ(scaled[size_t(t) * hidden + c], value * scale);
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

// RMSNorm's rows from one value to the widest it takes (each thread holds up to 16 values: 16384 is
// 1024 threads' worth), odd widths too, against the FP64 loop; wider rows are refused by name.
TEST_F(CudaLayerTest, RmsnormOfEveryWidthMatchesLoop) {
  std::mt19937 rng(11);
  for (int dim : {1, 37, 4096, 5000, 16384}) {
    SCOPED_TRACE(dim);
    const int n = 3;
    const auto x = normal_floats(size_t(n) * dim, rng), weight = normal_floats(size_t(dim), rng);
    auto x_device = on_device(x), weight_device = on_device(weight);
    auto out_device = on_device(std::vector<uint16_t>(size_t(n) * dim, 0xffff));
    SLIMKV_ASSERT_OK(rmsnorm(x_device.data(), weight_device.data(), 1e-5f, n, dim, out_device.data(), DType::kF16));
    auto added_device = on_device(x);
    SLIMKV_ASSERT_OK(add_rmsnorm(x_device.data(), weight_device.data(), 1e-5f, n, dim, added_device.data()));
    const auto out = on_host(out_device);
    const auto added = on_host(added_device);
    std::vector<float> got(out.size());
    std::vector<double> want(out.size()), want_added(out.size());
    for (int t = 0; t < n; ++t) {
      double square_sum = 0;
      for (int c = 0; c < dim; ++c) square_sum += double(x[size_t(t) * dim + c]) * x[size_t(t) * dim + c];
      const double inv_rms = 1.0 / std::sqrt(square_sum / dim + 1e-5);
      for (int c = 0; c < dim; ++c) {
        const size_t i = size_t(t) * dim + c;
        want[i] = weight[size_t(c)] * x[i] * inv_rms;
        want_added[i] = x[i] + want[i];
        got[i] = fp16_to_float(out[i]);
      }
    }
    EXPECT_LT(relative_error(got, want), 1e-3);
    EXPECT_LT(relative_error(added, want_added), 1e-6);
  }
  auto one = on_device(std::vector<float>(16385, 1.0f));
  auto out = on_device(std::vector<uint16_t>(16385));
  const Status refused = rmsnorm(one.data(), one.data(), 1e-5f, 1, 16385, out.data(), DType::kF16);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.message().find("16385"), std::string::npos) << refused.message();
}

// Gemma 3's sandwich norms: x += rmsnorm(y) · w, in FP32.
TEST_F(CudaLayerTest, AddRmsnormMatchesLoop) {
  std::mt19937 rng(23);
  const int n = 4, dim = 200;
  const auto y = normal_floats(size_t(n) * dim, rng), x = normal_floats(size_t(n) * dim, rng);
  const auto weight = normal_floats(size_t(dim), rng);
  auto y_device = on_device(y), x_device = on_device(x), weight_device = on_device(weight);
  SLIMKV_ASSERT_OK(add_rmsnorm(y_device.data(), weight_device.data(), 1e-6f, n, dim, x_device.data()));
  const auto got = on_host(x_device);
  std::vector<double> want(got.size());
  for (int t = 0; t < n; ++t) {
    double square_sum = 0;
    for (int c = 0; c < dim; ++c) square_sum += double(y[size_t(t) * dim + c]) * y[size_t(t) * dim + c];
    const double inv_rms = 1.0 / std::sqrt(square_sum / dim + 1e-6);
    for (int c = 0; c < dim; ++c) {
      const size_t i = size_t(t) * dim + c;
      want[i] = x[i] + double(weight[size_t(c)]) * y[i] * inv_rms;
    }
  }
  EXPECT_LT(relative_error(got, want), 1e-6);
}

// SwiGLU and GeGLU (GELU's tanh approximation, PyTorch's gelu(approximate="tanh")) of the fused gate/up.
TEST_F(CudaLayerTest, GatedActivationsOfFusedGateUpMatchLoop) {
  std::mt19937 rng(5);
  const int n = 3, intermediate = 333;
  auto gate_up = normal_floats(size_t(n) * 2 * intermediate, rng);
  for (float& g : gate_up) g *= 3.0f;  // GELU's tails: large negative and positive gates
  auto gate_up_device = on_device(gate_up);
  for (GateActivation activation : {GateActivation::kSilu, GateActivation::kGeluTanh}) {
    for (DType dtype : {DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(str_cat(activation == GateActivation::kSilu ? "silu " : "gelu_tanh ", dtype_name(dtype)));
      auto out_device = on_device(std::vector<uint16_t>(size_t(n) * intermediate, 0xffff));
      SLIMKV_ASSERT_OK(gated_activation(gate_up_device.data(), n, intermediate, activation, out_device.data(), dtype));
      const auto out = on_host(out_device);
      std::vector<float> got(out.size());
      std::vector<double> want(out.size());
      for (int t = 0; t < n; ++t) {
        for (int i = 0; i < intermediate; ++i) {
          const double g = gate_up[size_t(t) * 2 * intermediate + i], u = gate_up[size_t(t) * 2 * intermediate + intermediate + i];
          const double act = activation == GateActivation::kSilu
                                 ? g / (1.0 + std::exp(-g))
                                 : 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)));
          want[size_t(t) * intermediate + i] = act * u;
          got[size_t(t) * intermediate + i] = from_half(out[size_t(t) * intermediate + i], dtype);
        }
      }
      EXPECT_LT(relative_error(got, want), dtype == DType::kBF16 ? 5e-3 : 1e-3);
    }
  }
}

TEST_F(CudaLayerTest, SoftCapMatchesLoop) {
  std::mt19937 rng(29);
  auto logits = normal_floats(1000, rng);
  for (float& x : logits) x *= 40.0f;
  auto device = on_device(logits);
  SLIMKV_ASSERT_OK(soft_cap(device.data(), logits.size(), 30.0f));
  const auto got = on_host(device);
  std::vector<double> want(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) want[i] = 30.0 * std::tanh(double(logits[i]) / 30.0);
  EXPECT_LT(relative_error(got, want), 1e-6);
  EXPECT_FALSE(soft_cap(device.data(), 1, 0.0f).is_ok());
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
    ASSERT_TRUE(attention_inputs(qkv_device.data(), n, heads, bias_device.data(), {}, positions_device.data(),
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

// Qwen3's and Gemma 3's q/k norms (per head, over head_dim, before RoPE) and a head_dim the attention
// kernels lack (48) stored zero-padded to 64, with and without rot=hadamard over the stored dims:
// against a loop in double for the norm and the CPU's Rope and hadamard_rotate.
TEST_F(CudaLayerTest, AttentionInputsNormQkAndPadHeads) {
  for (const bool rotate : {false, true}) {
    for (const bool norm : {true, false}) {
      SCOPED_TRACE(str_cat(norm ? "q/k norms" : "no norms", rotate ? ", rot=hadamard" : ""));
      ModelConfig config;
      config.head_dim = 48;
      config.rope.theta = 1000000.0;
      const Rope rope(config.rope, 48);
      const AttentionHeads heads{4, 2, 48, 64};
      const int n = 3, d = 48, stored = 64, row_heads = 4 + 2 * 2, width = row_heads * d;
      const std::vector<int32_t> positions = {0, 5, 4000};
      std::mt19937 rng(31);
      const auto qkv = normal_floats(size_t(n) * width, rng), bias = normal_floats(size_t(width), rng);
      auto q_weight = normal_floats(size_t(d), rng), k_weight = normal_floats(size_t(d), rng);
      auto qkv_device = on_device(qkv), bias_device = on_device(bias);
      auto positions_device = on_device(positions);
      auto inv_freq_device = on_device(rope.inverse_frequencies());
      auto q_weight_device = on_device(q_weight), k_weight_device = on_device(k_weight);
      auto q_device = on_device(std::vector<uint16_t>(size_t(n) * 4 * stored, 0xffff));
      auto k_device = on_device(std::vector<uint16_t>(size_t(n) * 2 * stored, 0xffff));
      auto v_device = on_device(std::vector<uint16_t>(size_t(n) * 2 * stored, 0xffff));
      const QkNorm qk_norm = norm ? QkNorm{q_weight_device.data(), k_weight_device.data(), 1e-6f} : QkNorm{};
      SLIMKV_ASSERT_OK(attention_inputs(qkv_device.data(), n, heads, bias_device.data(), qk_norm, positions_device.data(),
                                        inv_freq_device.data(), rotate, q_device.data(), k_device.data(), v_device.data()));
      const auto q = on_host(q_device), k = on_host(k_device), v = on_host(v_device);
      for (int t = 0; t < n; ++t) {
        std::vector<float> row(qkv.begin() + ptrdiff_t(t) * width, qkv.begin() + ptrdiff_t(t + 1) * width);
        for (int i = 0; i < width; ++i) row[size_t(i)] += bias[size_t(i)];
        if (norm) {
          for (int h = 0; h < 6; ++h) {  // the 4 query heads, then the 2 key heads
            float* x = row.data() + h * d;
            double square_sum = 0;
            for (int i = 0; i < d; ++i) square_sum += double(x[i]) * x[i];
            const double inv_rms = 1.0 / std::sqrt(square_sum / d + 1e-6);
            const std::vector<float>& w = h < 4 ? q_weight : k_weight;
            for (int i = 0; i < d; ++i) x[i] = float(double(w[size_t(i)]) * x[i] * inv_rms);
          }
        }
        std::vector<float> cos, sin;
        rope.angles(positions[size_t(t)], 1, cos, sin);
        rope.rotate(row.data(), 1, 6, cos, sin);
        std::vector<float> padded(size_t(row_heads) * stored, 0.0f);  // each head's 48 values, then zeros
        for (int h = 0; h < row_heads; ++h) {
          std::copy_n(row.begin() + h * d, d, padded.begin() + h * stored);
          if (rotate) hadamard_rotate(padded.data() + h * stored, stored);
        }
        const auto expect_half = [](uint16_t got, float want, const char* what, int i) {
          ASSERT_NEAR(fp16_to_float(got), want, std::fabs(want) * 2e-3 + 2e-5) << what << " " << i;
        };
        for (int i = 0; i < 4 * stored; ++i) expect_half(q[size_t(t) * 4 * stored + i], padded[size_t(i)], "q", i);
        for (int i = 0; i < 2 * stored; ++i) {
          expect_half(k[size_t(t) * 2 * stored + i], padded[size_t(4 * stored + i)], "k", i);
          expect_half(v[size_t(t) * 2 * stored + i], padded[size_t(6 * stored + i)], "v", i);
        }
        if (!rotate) {  // the padding is exact zeros
          for (int h = 0; h < 4; ++h) {
            for (int i = d; i < stored; ++i) ASSERT_EQ(q[(size_t(t) * 4 + h) * stored + i], 0) << "q pad " << i;
          }
        }
      }
    }
  }
  // A stored width under head_dim, or one not a power of two to rotate, is refused.
  EXPECT_FALSE(attention_inputs(nullptr, 1, {1, 1, 48, 32}, nullptr, {}, nullptr, nullptr, false, nullptr, nullptr, nullptr).is_ok());
  EXPECT_FALSE(attention_inputs(nullptr, 1, {1, 1, 48, 96}, nullptr, {}, nullptr, nullptr, true, nullptr, nullptr, nullptr).is_ok());
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

// Each head at its own dims (ZACK's ranks under rot=hadamard): the first dims[h / heads_per_dims] values of
// head h turned as the CPU's hadamard_rotate turns them (power-of-two chunks where the dims are none),
// bit for bit in FP16, the rest copied; out of place and in place.
TEST_F(CudaLayerTest, RotateHeadPrefixesMatchesTheCpuRotation) {
  std::mt19937 rng(23);
  const int head_dim = 128, rows = 3;
  for (const auto& [dims, heads_per_dims] : std::vector<std::pair<std::vector<int>, int>>{
           {{4, 128, 36, 100}, 1}, {{100, 12}, 2}, {{1, 64, 127}, 3}}) {
    const int heads = int(dims.size()) * heads_per_dims;
    SCOPED_TRACE(str_cat(heads, " heads, ", heads_per_dims, " per dims entry, first dims ", dims[0]));
    const auto x = halves(normal_floats(size_t(rows) * heads * head_dim, rng), DType::kF16);
    auto x_device = on_device(x), out_device = on_device(std::vector<uint16_t>(x.size(), 0));
    auto dims_device = on_device(dims);
    SLIMKV_ASSERT_OK(rotate_head_prefixes(x_device.data(), rows, heads, head_dim, dims_device.data(), heads_per_dims,
                                          out_device.data()));
    SLIMKV_ASSERT_OK(rotate_head_prefixes(x_device.data(), rows, heads, head_dim, dims_device.data(), heads_per_dims,
                                          x_device.data()));
    const auto apart = on_host(out_device), in_place = on_host(x_device);
    for (int r = 0; r < rows; ++r) {
      for (int h = 0; h < heads; ++h) {
        const int n = dims[size_t(h / heads_per_dims)];
        const size_t first = (size_t(r) * heads + size_t(h)) * head_dim;
        std::vector<float> want(static_cast<size_t>(head_dim));
        for (int i = 0; i < head_dim; ++i) want[size_t(i)] = fp16_to_float(x[first + size_t(i)]);
        hadamard_rotate(want.data(), n);
        for (int i = 0; i < head_dim; ++i) {
          const uint16_t expected = i < n ? float_to_fp16(want[size_t(i)]) : x[first + size_t(i)];
          ASSERT_EQ(apart[first + size_t(i)], expected) << "row " << r << " head " << h << " dim " << i;
          ASSERT_EQ(in_place[first + size_t(i)], expected) << "row " << r << " head " << h << " dim " << i;
        }
      }
    }
  }
  EXPECT_FALSE(rotate_head_prefixes(nullptr, 1, 3, 128, nullptr, 2, nullptr).is_ok());  // heads not a multiple of 2
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
