// GGUF blocks on the GPU (backend/cuda/quantized_gemm.h) against the plain reference: the CPU's
// dequantize_reference (tensor/ggml_type.h) and an FP64 product. Every block type × FP16 and BF16
// inputs × 1, 3, 8 (the matrix-vector kernel), 17 and 300 inputs (dequantized tiles + cuBLAS, tiles
// cut short and whole) × 1, 37 and 300 rows, and rows 4096 and 14336 wide (Llama-3-8B's); overwriting
// and accumulating, into outputs wider than the matrix. The bounds are derived from each path's
// arithmetic (below), so a wrong nibble, scale or row fails them by orders of magnitude.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/quantized_gemm.h"
#include "cuda_test_util.h"
#include "weight_blocks_util.h"
#include "tensor/ggml_type.h"
#include "util/half.h"

namespace slimkv::cuda {
namespace {

constexpr BlockQuant kTypes[] = {BlockQuant::kQ8_0, BlockQuant::kQ4_0, BlockQuant::kQ4_K, BlockQuant::kQ6_K};
constexpr double kFp32Unit = 1.0 / (1 << 24);  // FP32's unit roundoff

// The plain reference: W's rows by dequantize_reference, y[i, o] = Σ_c x[i, c] · W[o, c] in FP64; with
// each product's magnitude Σ|x·w| and Σ|x| for the error bounds.
struct Reference {
  std::vector<double> y, magnitude, input_sum;
};
Reference reference_product(const std::vector<float>& x, int64_t n, BlockQuant quant, const std::vector<uint8_t>& blocks,
                            int64_t rows, int64_t cols) {
  Reference ref;
  ref.y.assign(size_t(n * rows), 0.0);
  ref.magnitude.assign(size_t(n * rows), 0.0);
  ref.input_sum.assign(size_t(n), 0.0);
  std::vector<float> w(static_cast<size_t>(cols));
  const size_t row_bytes = size_t(cols / block_elements(quant)) * block_bytes(quant);
  for (int64_t o = 0; o < rows; ++o) {
    dequantize_reference(quant, blocks.data() + size_t(o) * row_bytes, w.data(), cols);
    for (int64_t i = 0; i < n; ++i) {
      double sum = 0, magnitude = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double product = double(x[size_t(i * cols + c)]) * double(w[size_t(c)]);
        sum += product;
        magnitude += std::fabs(product);
      }
      ref.y[size_t(i * rows + o)] = sum;
      ref.magnitude[size_t(i * rows + o)] = magnitude;
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < cols; ++c) ref.input_sum[size_t(i)] += std::fabs(double(x[size_t(i * cols + c)]));
  }
  return ref;
}

// One product: W [rows, cols] of `quant` times n inputs in dtype, into y [n, rows + 3] that held y0.
struct Case {
  BlockQuant quant;
  DType dtype;
  int64_t n, rows, cols;
  bool accumulate;
  size_t scratch_bytes;  // the tiles' scratch (inputs past kQuantizedGemvMaxInputs)
  std::string name() const {
    return str_cat(block_quant_name(quant), " x ", dtype_name(dtype), " n=", n, " rows=", rows, " cols=", cols,
                   accumulate ? " accumulate" : " overwrite", " scratch=", scratch_bytes);
  }
};

// Error bounds (|δ| ≤ u per rounding, γ_k = k·u / (1 - k·u) for a chain of k roundings):
//  - the matrix-vector kernel decodes each weight to the same FP32 value as dequantize_reference (the
//    same products in the same order, each exact or rounded once alike), multiplies by the exact inputs
//    and sums in chains of 32 · ⌈cols / 1024⌉ FMAs per lane, then 5 sums across the warp (and one add to
//    y0): |Δ| ≤ γ_k (Σ|x·w| + |y0|);
//  - the tiles round each weight to the inputs' dtype (relative u_w: 2⁻¹¹ FP16, 2⁻⁸ BF16; FP16's
//    subnormals absolutely 2⁻²⁵), then cuBLAS sums the exact products in FP32 in some order of at most
//    cols additions: |Δ| ≤ u_w Σ|x·w| + 2⁻²⁵ Σ|x| + γ_cols (1 + u_w) (Σ|x·w| + |y0|).
double error_bound(const Case& c, double magnitude, double input_sum, double y0) {
  const auto gamma = [](double k) { return k * kFp32Unit / (1 - k * kFp32Unit); };
  if (c.n <= kQuantizedGemvMaxInputs) {
    const double chain = 32.0 * double((c.cols + 1023) / 1024) + 5 + 1;
    return gamma(chain) * (magnitude + std::fabs(y0));
  }
  const double weight_rounding = c.dtype == DType::kBF16 ? 1.0 / 256 : 1.0 / 2048;
  const double subnormal = c.dtype == DType::kBF16 ? 0.0 : 1.0 / (1 << 25);
  return weight_rounding * magnitude + subnormal * input_sum +
         gamma(double(c.cols) + 1) * (1 + weight_rounding) * (magnitude + std::fabs(y0));
}

void check_case(const Case& c, std::mt19937& rng) {
  SCOPED_TRACE(c.name());
  const std::vector<uint8_t> blocks = random_blocks(c.quant, c.rows, c.cols, rng);
  std::vector<float> x;
  const std::vector<uint16_t> x_bits = random_inputs(size_t(c.n * c.cols), c.dtype, rng, x);
  const Reference ref = reference_product(x, c.n, c.quant, blocks, c.rows, c.cols);

  auto matrix_memory = take(DeviceArray<uint8_t>::allocate(quantized_matrix_bytes(c.quant, c.rows, c.cols), "test"));
  ASSERT_EQ(matrix_memory.bytes(), blocks.size()) << "the device layout takes the file's bytes";
  const DeviceMatrix w = quantized_matrix_at(matrix_memory.data(), c.quant, c.rows, c.cols);
  SLIMKV_ASSERT_OK(upload_quantized(blocks.data(), w));
  // y is wider than the product (stride rows + 3): the columns past rows must be left as they were.
  const int64_t stride = c.rows + 3;
  std::vector<float> y0(size_t(c.n * stride));
  std::uniform_real_distribution<float> before(-4.0f, 4.0f);
  for (float& v : y0) v = before(rng);
  auto x_device = on_device(x_bits);
  auto y_device = on_device(y0);
  auto gemm = take(WeightGemm::create(c.scratch_bytes));
  SLIMKV_ASSERT_OK(gemm->multiply(x_device.data(), c.n, c.dtype, w, y_device.data(), c.accumulate, stride));
  const std::vector<float> y = on_host(y_device);

  for (int64_t i = 0; i < c.n; ++i) {
    for (int64_t o = 0; o < stride; ++o) {
      const size_t at = size_t(i * stride + o);
      if (o >= c.rows) {
        ASSERT_EQ(y[at], y0[at]) << "column " << o << " past the product's " << c.rows << " was written";
        continue;
      }
      const size_t r = size_t(i * c.rows + o);
      const double base = c.accumulate ? double(y0[at]) : 0.0;
      const double bound = error_bound(c, ref.magnitude[r], ref.input_sum[size_t(i)], base);
      const double err = std::fabs(double(y[at]) - (base + ref.y[r]));
      ASSERT_LE(err, bound) << "input " << i << ", row " << o << ": GPU " << y[at] << ", reference " << base + ref.y[r];
    }
  }
}

using QuantizedGemm = CudaTest;

// The matrix-vector kernel (decode): 1, 3 and 8 inputs.
TEST_F(QuantizedGemm, DecodeKernelMatchesTheReference) {
  std::mt19937 rng(29);
  for (BlockQuant quant : kTypes) {
    for (DType dtype : {DType::kF16, DType::kBF16}) {
      for (int64_t n : {1, 3, 8}) {
        for (int64_t rows : {1, 37, 300}) {
          check_case({quant, dtype, n, rows, 256, /*accumulate=*/rows == 37, 0}, rng);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// Dequantized tiles + cuBLAS (prefill): 17 and 300 inputs; a scratch of 16 rows (tiles cut short at 37
// and 300 rows) and one that holds the whole matrix.
TEST_F(QuantizedGemm, PrefillTilesMatchTheReference) {
  std::mt19937 rng(30);
  for (BlockQuant quant : kTypes) {
    for (DType dtype : {DType::kF16, DType::kBF16}) {
      for (int64_t n : {17, 300}) {
        for (int64_t rows : {1, 37, 300}) {
          for (size_t scratch : {size_t(16 * 256 * 2), size_t(64) << 20}) {
            check_case({quant, dtype, n, rows, 256, /*accumulate=*/rows != 300, scratch}, rng);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// Llama-3-8B's rows: 4096 (hidden) and 14336 (intermediate) values, both paths.
TEST_F(QuantizedGemm, WideRowsMatchTheReference) {
  std::mt19937 rng(31);
  for (BlockQuant quant : kTypes) {
    for (DType dtype : {DType::kF16, DType::kBF16}) {
      for (int64_t cols : {4096, 14336}) {
        for (int64_t n : {1, 8, 17}) {
          check_case({quant, dtype, n, 37, cols, /*accumulate=*/n == 8, size_t(16) * size_t(cols) * 2}, rng);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// The row lookup (a quantized embedding): the rows asked for, in FP32 exactly the reference's values
// (each a product of exact values rounded once, on both sides), times the scale; in FP16 those rounded.
TEST_F(QuantizedGemm, DequantizedRowsEqualTheReference) {
  std::mt19937 rng(32);
  const int64_t rows = 50, cols = 512;
  const std::vector<int32_t> ids = {7, 0, 49, 7, 23};
  for (BlockQuant quant : kTypes) {
    SCOPED_TRACE(std::string(block_quant_name(quant)));
    const std::vector<uint8_t> blocks = random_blocks(quant, rows, cols, rng);
    auto memory = take(DeviceArray<uint8_t>::allocate(quantized_matrix_bytes(quant, rows, cols), "test"));
    const DeviceMatrix w = quantized_matrix_at(memory.data(), quant, rows, cols);
    SLIMKV_ASSERT_OK(upload_quantized(blocks.data(), w));
    auto ids_device = on_device(ids);
    auto out = take(DeviceArray<float>::allocate(ids.size() * cols, "test"));
    SLIMKV_ASSERT_OK(dequantize_rows(w, ids_device.data(), 0, int64_t(ids.size()), 2.0f, out.data(), DType::kF32));
    auto out_half = take(DeviceArray<uint16_t>::allocate(size_t(3 * cols), "test"));
    SLIMKV_ASSERT_OK(dequantize_rows(w, nullptr, 40, 3, 1.0f, out_half.data(), DType::kF16));
    const std::vector<float> got = on_host(out);
    const std::vector<uint16_t> got_half = on_host(out_half);
    const size_t row_bytes = size_t(cols / block_elements(quant)) * block_bytes(quant);
    std::vector<float> expected(static_cast<size_t>(cols));
    for (size_t r = 0; r < ids.size(); ++r) {
      dequantize_reference(quant, blocks.data() + size_t(ids[r]) * row_bytes, expected.data(), cols);
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(got[r * size_t(cols) + size_t(c)], 2.0f * expected[size_t(c)]) << r << ", " << c;
      }
    }
    for (int64_t r = 0; r < 3; ++r) {
      dequantize_reference(quant, blocks.data() + size_t(40 + r) * row_bytes, expected.data(), cols);
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(got_half[size_t(r * cols + c)], float_to_fp16(expected[size_t(c)])) << r << ", " << c;
      }
    }
  }
}

// Random blocks (random-weight models) are finite and spread as fill_random_quantized says: |w| ≤ the
// amplitude, and not all small.
TEST_F(QuantizedGemm, RandomBlocksStayWithinTheirAmplitude) {
  const int64_t rows = 8, cols = 1024;
  const float amplitude = 0.05f;
  for (BlockQuant quant : kTypes) {
    SCOPED_TRACE(std::string(block_quant_name(quant)));
    auto memory = take(DeviceArray<uint8_t>::allocate(quantized_matrix_bytes(quant, rows, cols), "test"));
    const DeviceMatrix w = quantized_matrix_at(memory.data(), quant, rows, cols);
    SLIMKV_ASSERT_OK(fill_random_quantized(w, 7, amplitude));
    auto out = take(DeviceArray<float>::allocate(size_t(rows * cols), "test"));
    SLIMKV_ASSERT_OK(dequantize_rows(w, nullptr, 0, rows, 1.0f, out.data(), DType::kF32));
    double square_sum = 0;
    for (float v : on_host(out)) {
      ASSERT_TRUE(std::isfinite(v));
      // The scales of small amplitudes are FP16 subnormals, rounded by up to 0.5%.
      ASSERT_LE(std::fabs(v), amplitude * 1.01f);
      square_sum += double(v) * v;
    }
    const double rms = std::sqrt(square_sum / double(rows * cols));
    EXPECT_GT(rms, amplitude / 8) << "random blocks far narrower than their amplitude";
  }
}

// Shapes the blocks cannot hold are refused, naming the tensor, its type and the multiple expected.
TEST_F(QuantizedGemm, RowsOfPartialBlocksAreRefused) {
  const Status refused = check_quantized_shape("blk.3.ffn_down.weight", BlockQuant::kQ4_K, 64, 1000);
  ASSERT_FALSE(refused.is_ok());
  for (const char* part : {"blk.3.ffn_down.weight", "Q4_K", "multiple of 256"}) {
    EXPECT_NE(refused.message().find(part), std::string::npos) << refused.message();
  }
  EXPECT_TRUE(check_quantized_shape("blk.0.attn_q.weight", BlockQuant::kQ8_0, 64, 96).is_ok());
  // The product refuses them too, before reading anything.
  DeviceMatrix bad;
  bad.quant = BlockQuant::kQ6_K;
  bad.rows = 4;
  bad.cols = 100;
  auto gemm = take(WeightGemm::create(0));
  float* nowhere = nullptr;
  for (int64_t n : {1, 17}) {
    const Status status = gemm->multiply(nullptr, n, DType::kF16, bad, nowhere);
    ASSERT_FALSE(status.is_ok());
    EXPECT_NE(status.message().find("multiple of 256"), std::string::npos) << status.message();
  }
}

}  // namespace
}  // namespace slimkv::cuda
