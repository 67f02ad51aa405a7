#include "backend/cuda/quantized_gemm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/weight_rows.cuh"
#include "util/random.h"

namespace slimkv::cuda {
namespace {

constexpr bool splits_scale(BlockQuant quant) { return quant != BlockQuant::kQ4_K; }
// Where the file's block keeps the scale d that the device layout moves out, and its body.
constexpr size_t file_scale_offset(BlockQuant quant) { return quant == BlockQuant::kQ6_K ? 208 : 0; }
constexpr size_t file_body_offset(BlockQuant quant) { return quant == BlockQuant::kQ6_K ? 0 : 2; }

// 16 bytes of Out values converted from x[0 .. 16 / sizeof(Out)), in order, as one register quadruple.
__device__ inline unsigned bits16(__half x) { return __half_as_ushort(x); }
__device__ inline unsigned bits16(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
template <typename Out>
__device__ inline uint4 pack16(const float* x) {
  if constexpr (std::is_same_v<Out, float>) {
    return make_uint4(__float_as_uint(x[0]), __float_as_uint(x[1]), __float_as_uint(x[2]), __float_as_uint(x[3]));
  } else {
    unsigned words[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) words[k] = bits16(from_float<Out>(x[2 * k])) | bits16(from_float<Out>(x[2 * k + 1])) << 16;
    return make_uint4(words[0], words[1], words[2], words[3]);
  }
}

constexpr int kGemvThreads = 256;
constexpr int kGemvInputs = kWarpRowsMaxInputs;  // inputs one launch multiplies

// y[i, row] (+)= Σ_c x[i, c] · W[row, c] for i < n ≤ kGemvInputs: one warp per kRows consecutive rows
// (weight_rows.cuh).
template <BlockQuant Q, typename In, int kRows>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(const In* x, int n, const uint8_t* body,
                                                            const uint16_t* scales, int64_t rows, int64_t cols,
                                                            float* y, int64_t y_stride, bool accumulate) {
  const int64_t first_row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32 * kRows;
  if (first_row >= rows) return;  // the whole warp
  multiply_warp_rows<Q, In, kRows>(x, nullptr, 0, n, body, scales, rows, cols, first_row, y, y_stride, accumulate);
}

// out[r, :] = row (rows ? rows[r] : first + r) of W dequantized, times scale: one thread per unit.
template <BlockQuant Q, typename Out>
__global__ void dequantize_kernel(const uint8_t* body, const uint16_t* scales, int64_t cols, const int32_t* rows,
                                  int64_t first, int64_t count, float scale, Out* out) {
  const int64_t units = cols / kUnit;
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= count * units) return;
  const int64_t r = i / units, u = i % units;
  const int64_t row = rows != nullptr ? int64_t(rows[r]) : first + r;
  float w[kUnit];
  decode_unit<Q>(body, scales, row * units + u, w);
  // A thread's 32 values leave as whole 16-byte stores: stored one value at a time, every store
  // instruction of a warp touched 32 sectors for 2 bytes each (a prefill's per-step dequantization of
  // the whole model ran at a tenth of the memory's speed).
  constexpr int kPerStore = 16 / int(sizeof(Out));
  auto* to = reinterpret_cast<uint4*>(out + r * cols + u * kUnit);
  if (scale != 1.0f) {
#pragma unroll
    for (int l = 0; l < kUnit; ++l) w[l] *= scale;
  }
#pragma unroll
  for (int k = 0; k < kUnit / kPerStore; ++k) to[k] = pack16<Out>(w + k * kPerStore);
}

// Random bodies (a hash per 8 bytes), then each block's scales set as fill_random_quantized says.
template <BlockQuant Q>
__global__ void fill_random_kernel(uint8_t* body, uint16_t* scales, int64_t blocks, uint64_t seed, float amplitude) {
  constexpr size_t kWords = body_bytes(Q) / 8;
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < blocks; b += int64_t(gridDim.x) * blockDim.x) {
    auto* words = reinterpret_cast<uint64_t*>(body + b * body_bytes(Q));
    for (size_t k = 0; k < kWords; ++k) words[k] = splitmix64(seed ^ splitmix64(uint64_t(b) * kWords + k));
    if constexpr (Q == BlockQuant::kQ8_0) {  // |q| ≤ 128
      scales[b] = __half_as_ushort(__float2half_rn(amplitude / 128.0f));
    } else if constexpr (Q == BlockQuant::kQ4_0) {  // |q - 8| ≤ 8
      scales[b] = __half_as_ushort(__float2half_rn(amplitude / 8.0f));
    } else if constexpr (Q == BlockQuant::kQ4_K) {  // d·sc·q in [0, a], dmin·m in [0, a/2]: x in [-a/2, a]
      auto* d = reinterpret_cast<uint16_t*>(body + b * body_bytes(Q));
      d[0] = __half_as_ushort(__float2half_rn(amplitude / (63.0f * 15.0f)));
      d[1] = __half_as_ushort(__float2half_rn(amplitude / (2.0f * 63.0f)));
    } else {  // Q6_K: |scale · q| ≤ 128 · 32
      scales[b] = __half_as_ushort(__float2half_rn(amplitude / 4096.0f));
    }
  }
}

// Calls f with std::integral_constant<BlockQuant, quant> (the kernels' template argument).
template <typename F>
Status with_quant(BlockQuant quant, F&& f) {
  switch (quant) {
    case BlockQuant::kQ8_0: return f(std::integral_constant<BlockQuant, BlockQuant::kQ8_0>());
    case BlockQuant::kQ4_0: return f(std::integral_constant<BlockQuant, BlockQuant::kQ4_0>());
    case BlockQuant::kQ4_K: return f(std::integral_constant<BlockQuant, BlockQuant::kQ4_K>());
    case BlockQuant::kQ6_K: return f(std::integral_constant<BlockQuant, BlockQuant::kQ6_K>());
    case BlockQuant::kNone: break;
  }
  return error("quantized GEMM: the matrix is not block-quantized");
}

Status check_input_dtype(DType dtype) {
  if (dtype == DType::kF16 || dtype == DType::kBF16) return Status::ok();
  return error("quantized GEMM: inputs in ", dtype_name(dtype), " (expected F16 or BF16)");
}

unsigned grid_for(int64_t threads, int block) { return unsigned((threads + block - 1) / block); }

}  // namespace

DeviceMatrix DeviceMatrix::row_range(int64_t first, int64_t count) const {
  DeviceMatrix part = *this;
  part.rows = count;
  if (!quantized()) {
    part.data = static_cast<uint8_t*>(data) + size_t(first) * size_t(cols) * dtype_size_bytes(dtype);
    return part;
  }
  const size_t blocks_before = size_t(first) * size_t(cols / block_elements(quant));
  part.data = static_cast<uint8_t*>(data) + blocks_before * body_bytes(quant);
  if (scales != nullptr) part.scales = scales + blocks_before;
  return part;
}

Status check_quantized_shape(std::string_view tensor, BlockQuant quant, int64_t rows, int64_t cols) {
  if (quant == BlockQuant::kNone) return Status::ok();
  if (rows > 0 && cols > 0 && cols % block_elements(quant) == 0) return Status::ok();
  return error(tensor, ": [", rows, ", ", cols, "] in ", block_quant_name(quant), " on device cuda: each row must be ",
               "a positive multiple of ", block_elements(quant), " values (whole ", block_quant_name(quant), " blocks)");
}

size_t quantized_matrix_bytes(BlockQuant quant, int64_t rows, int64_t cols) {
  return size_t(rows) * size_t(cols / block_elements(quant)) * block_bytes(quant);
}

DeviceMatrix quantized_matrix_at(void* device, BlockQuant quant, int64_t rows, int64_t cols) {
  DeviceMatrix m;
  m.data = device;
  m.quant = quant;
  m.rows = rows;
  m.cols = cols;
  if (splits_scale(quant)) {
    const size_t blocks = size_t(rows) * size_t(cols / block_elements(quant));
    m.scales = reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(device) + blocks * body_bytes(quant));
  }
  return m;
}

Status upload_quantized(const void* file_blocks, const DeviceMatrix& to) {
  SLIMKV_RETURN_IF_ERROR(check_quantized_shape("quantized upload", to.quant, to.rows, to.cols));
  const BlockQuant quant = to.quant;
  const size_t per_row = size_t(to.cols / block_elements(quant)), body = body_bytes(quant), stored = block_bytes(quant);
  const auto* from = static_cast<const uint8_t*>(file_blocks);
  auto* bodies_at = static_cast<uint8_t*>(to.data);
  if (!splits_scale(quant)) return copy_to_device(bodies_at, from, size_t(to.rows) * per_row * stored);
  const int64_t slice_rows = std::max<int64_t>(1, int64_t((size_t(1) << 22) / (per_row * stored)));
  std::vector<uint8_t> bodies, scales;
  for (int64_t row = 0; row < to.rows; row += slice_rows) {
    const size_t blocks = size_t(std::min(slice_rows, to.rows - row)) * per_row, first = size_t(row) * per_row;
    bodies.resize(blocks * body);
    scales.resize(blocks * 2);
    for (size_t b = 0; b < blocks; ++b) {
      const uint8_t* block = from + (first + b) * stored;
      std::memcpy(bodies.data() + b * body, block + file_body_offset(quant), body);
      std::memcpy(scales.data() + b * 2, block + file_scale_offset(quant), 2);
    }
    SLIMKV_RETURN_IF_ERROR(copy_to_device(bodies_at + first * body, bodies.data(), bodies.size()));
    SLIMKV_RETURN_IF_ERROR(copy_to_device(to.scales + first, scales.data(), scales.size()));
  }
  return Status::ok();
}

Status fill_random_quantized(const DeviceMatrix& to, uint64_t seed, float amplitude) {
  SLIMKV_RETURN_IF_ERROR(check_quantized_shape("random weights", to.quant, to.rows, to.cols));
  const int64_t blocks = to.rows * (to.cols / block_elements(to.quant));
  return with_quant(to.quant, [&](auto q) {
    fill_random_kernel<decltype(q)::value>
        <<<1024, 256>>>(static_cast<uint8_t*>(to.data), to.scales, blocks, seed, amplitude);
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
    return Status::ok();
  });
}

Status dequantize_rows(const DeviceMatrix& w, const int32_t* rows, int64_t first, int64_t count, float scale, void* out,
                       DType out_dtype) {
  if (out_dtype != DType::kF32 && out_dtype != DType::kF16 && out_dtype != DType::kBF16) {
    return error("dequantize_rows: output in ", dtype_name(out_dtype), " (expected F32, F16 or BF16)");
  }
  if (rows == nullptr && (first < 0 || first + count > w.rows)) {
    return error("dequantize_rows: rows [", first, ", ", first + count, ") of a matrix of ", w.rows);
  }
  SLIMKV_RETURN_IF_ERROR(check_quantized_shape("dequantize_rows", w.quant, w.rows, w.cols));
  if (reinterpret_cast<uintptr_t>(out) % 16 != 0) {
    return error("dequantize_rows: the output is not 16-byte aligned (its rows are written in 16-byte pieces)");
  }
  if (count == 0) return Status::ok();
  const auto* body = static_cast<const uint8_t*>(w.data);
  const unsigned grid = grid_for(count * (w.cols / kUnit), 256);
  return with_quant(w.quant, [&](auto q) {
    constexpr BlockQuant Q = decltype(q)::value;
    if (out_dtype == DType::kF32) {
      dequantize_kernel<Q><<<grid, 256>>>(body, w.scales, w.cols, rows, first, count, scale, static_cast<float*>(out));
    } else if (out_dtype == DType::kF16) {
      dequantize_kernel<Q><<<grid, 256>>>(body, w.scales, w.cols, rows, first, count, scale, static_cast<__half*>(out));
    } else {
      dequantize_kernel<Q><<<grid, 256>>>(body, w.scales, w.cols, rows, first, count, scale,
                                          static_cast<__nv_bfloat16*>(out));
    }
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
    return Status::ok();
  });
}

Status quantized_gemv(const void* x, int64_t n, DType x_dtype, const DeviceMatrix& w, float* y, bool accumulate,
                      int64_t y_stride) {
  SLIMKV_RETURN_IF_ERROR(check_input_dtype(x_dtype));
  SLIMKV_RETURN_IF_ERROR(check_quantized_shape("quantized GEMV", w.quant, w.rows, w.cols));
  if (y_stride == 0) y_stride = w.rows;
  if (y_stride < w.rows) return error("quantized GEMV: output row stride ", y_stride, " under its ", w.rows, " columns");
  const auto* body = static_cast<const uint8_t*>(w.data);
  // Two rows a warp once there are inputs enough to share (one input: twice the warps instead).
  return with_quant(w.quant, [&](auto q) {
    constexpr BlockQuant Q = decltype(q)::value;
    for (int64_t i0 = 0; i0 < n; i0 += kGemvInputs) {
      const int inputs = int(std::min<int64_t>(kGemvInputs, n - i0));
      float* y_part = y + i0 * y_stride;
      const auto launch = [&](auto in_type, auto rows_per_warp) {
        using In = decltype(in_type);
        constexpr int kRows = decltype(rows_per_warp)::value;
        const unsigned grid = grid_for((w.rows + kRows - 1) / kRows * 32, kGemvThreads);
        const In* x_part = static_cast<const In*>(x) + i0 * w.cols;
        gemv_kernel<Q, In, kRows><<<grid, kGemvThreads>>>(x_part, inputs, body, w.scales, w.rows, w.cols, y_part,
                                                          y_stride, accumulate);
      };
      const bool bf16 = x_dtype == DType::kBF16;
      if (inputs >= 2) {
        bf16 ? launch(__nv_bfloat16(), std::integral_constant<int, 2>()) : launch(__half(), std::integral_constant<int, 2>());
      } else {
        bf16 ? launch(__nv_bfloat16(), std::integral_constant<int, 1>()) : launch(__half(), std::integral_constant<int, 1>());
      }
      SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
    }
    return Status::ok();
  });
}

Expected<std::unique_ptr<WeightGemm>> WeightGemm::create(size_t scratch_bytes) {
  std::unique_ptr<WeightGemm> gemm(new WeightGemm());
  SLIMKV_ASSIGN_OR_RETURN(gemm->cublas_, CublasGemm::create());
  SLIMKV_ASSIGN_OR_RETURN(gemm->scratch_, DeviceArray<uint16_t>::allocate(scratch_bytes / 2, "dequantized weight tiles"));
  return Expected<std::unique_ptr<WeightGemm>>(std::move(gemm));
}

Status WeightGemm::multiply(const void* x, int64_t n, DType x_dtype, const DeviceMatrix& w, float* y, bool accumulate,
                            int64_t y_stride) {
  if (!w.quantized()) {
    if (w.dtype != x_dtype) {
      return error("GEMM: inputs in ", dtype_name(x_dtype), " with weights in ", dtype_name(w.dtype), " (expected the same)");
    }
    return cublas_->multiply(x, n, w.data, x_dtype, w.rows, w.cols, y, accumulate, y_stride);
  }
  if (n <= kQuantizedGemvMaxInputs) return quantized_gemv(x, n, x_dtype, w, y, accumulate, y_stride);
  SLIMKV_RETURN_IF_ERROR(check_input_dtype(x_dtype));
  SLIMKV_RETURN_IF_ERROR(check_quantized_shape("quantized GEMM", w.quant, w.rows, w.cols));
  const int64_t tile_rows = std::min<int64_t>(w.rows, int64_t(scratch_.size()) / w.cols);
  if (tile_rows == 0) {
    return error("quantized GEMM of ", n, " inputs: a row of ", w.cols, " values does not fit the tiles' scratch of ",
                 scratch_.bytes(), " bytes");
  }
  if (y_stride == 0) y_stride = w.rows;
  for (int64_t first = 0; first < w.rows; first += tile_rows) {
    const int64_t count = std::min(tile_rows, w.rows - first);
    SLIMKV_RETURN_IF_ERROR(dequantize_rows(w, nullptr, first, count, 1.0f, scratch_.data(), x_dtype));
    SLIMKV_RETURN_IF_ERROR(
        cublas_->multiply(x, n, scratch_.data(), x_dtype, count, w.cols, y + first, accumulate, y_stride));
  }
  return Status::ok();
}

}  // namespace slimkv::cuda
