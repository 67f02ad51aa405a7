#include "backend/cuda/layer_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_check.h"

namespace slimkv::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(size_t size) { return unsigned((size + kThreads - 1) / kThreads); }

// Values in and out of the two half-precision dtypes.
__device__ inline float load_half(const void* data, bool bf16, size_t i) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(data)[i])
              : __half2float(static_cast<const __half*>(data)[i]);
}
__device__ inline void store_half(void* data, bool bf16, size_t i, float value) {
  if (bf16) {
    static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16(value);
  } else {
    static_cast<__half*>(data)[i] = __float2half(value);
  }
}

Status check_half(DType dtype, const char* what) {
  if (dtype == DType::kF16 || dtype == DType::kBF16) return Status::ok();
  return error(what, ": dtype ", dtype_name(dtype), " (expected F16 or BF16)");
}

// A block-wide sum (blockDim.x a multiple of 32, at most 1024).
__device__ float block_sum(float value) {
  __shared__ float warp_sums[32];
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = value;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < int(blockDim.x / 32); ++w) total += warp_sums[w];
  __syncthreads();  // warp_sums may be reused by the next call
  return total;
}

__global__ void embed_kernel(const int32_t* tokens, int n, const void* table, bool bf16, int hidden, float* x) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(n) * hidden) return;
  const size_t t = i / hidden, c = i % hidden;
  x[i] = load_half(table, bf16, size_t(tokens[t]) * hidden + c);
}

// One block per row: the mean square in FP32, as the CPU's rmsnorm.
__global__ void rmsnorm_kernel(const float* x, const float* weight, float eps, int dim, void* out, bool bf16) {
  const float* row = x + size_t(blockIdx.x) * dim;
  float square_sum = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) square_sum += row[i] * row[i];
  const float inv_rms = rsqrtf(block_sum(square_sum) / float(dim) + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    store_half(out, bf16, size_t(blockIdx.x) * dim + i, weight[i] * (row[i] * inv_rms));
  }
}

__global__ void rope_kernel(float* x, int n, int num_heads, int head_dim, const float* cos, const float* sin) {
  const int half = head_dim / 2;
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(n) * num_heads * half) return;
  const int pair = int(i % half);
  const size_t head_row = i / half;  // t · num_heads + h
  const size_t t = head_row / num_heads;
  float* v = x + head_row * head_dim;
  const float c = cos[t * half + pair], s = sin[t * half + pair];
  const float a = v[pair], b = v[pair + half];
  v[pair] = a * c - b * s;
  v[pair + half] = b * c + a * s;
}

__global__ void swiglu_kernel(const float* gate, const float* up, size_t size, void* out, bool bf16) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size) return;
  const float g = gate[i];
  store_half(out, bf16, i, g / (1.0f + expf(-g)) * up[i]);
}

__global__ void add_kernel(float* x, const float* delta, size_t size) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < size) x[i] += delta[i];
}

__global__ void convert_kernel(const float* x, size_t size, void* out, bool bf16) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < size) store_half(out, bf16, i, x[i]);
}

__global__ void widen_kernel(const void* x, bool bf16, size_t size, float* out) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < size) out[i] = load_half(x, bf16, i);
}

// One block per row: each thread's best (value, first index), then a block-wide reduction.
__global__ void argmax_kernel(const float* logits, int vocab, int32_t* out) {
  const float* row = logits + size_t(blockIdx.x) * vocab;
  float best = -INFINITY;
  int best_index = vocab;  // beaten by any index of a value >= -inf, so NaN-free rows always pick one
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    if (row[i] > best || (best_index == vocab)) best = row[i], best_index = i;
  }
  __shared__ float values[kThreads];
  __shared__ int indices[kThreads];
  values[threadIdx.x] = best;
  indices[threadIdx.x] = best_index;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const float v = values[threadIdx.x + stride];
      const int j = indices[threadIdx.x + stride];
      if (v > values[threadIdx.x] || (v == values[threadIdx.x] && j < indices[threadIdx.x])) {
        values[threadIdx.x] = v;
        indices[threadIdx.x] = j;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = indices[0];
}

}  // namespace

Status embed(const int32_t* tokens, int n, const void* table, DType dtype, int hidden, float* x) {
  SLIMKV_RETURN_IF_ERROR(check_half(dtype, "embedding table"));
  if (n == 0) return Status::ok();
  embed_kernel<<<blocks_for(size_t(n) * hidden), kThreads>>>(tokens, n, table, dtype == DType::kBF16, hidden, x);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status rmsnorm(const float* x, const float* weight, float eps, int n, int dim, void* out, DType out_dtype) {
  SLIMKV_RETURN_IF_ERROR(check_half(out_dtype, "RMSNorm output"));
  if (n == 0) return Status::ok();
  rmsnorm_kernel<<<unsigned(n), kThreads>>>(x, weight, eps, dim, out, out_dtype == DType::kBF16);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status rope(float* x, int n, int num_heads, int head_dim, const float* cos, const float* sin) {
  const size_t pairs = size_t(n) * num_heads * (head_dim / 2);
  if (pairs == 0) return Status::ok();
  rope_kernel<<<blocks_for(pairs), kThreads>>>(x, n, num_heads, head_dim, cos, sin);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status swiglu(const float* gate, const float* up, size_t size, void* out, DType out_dtype) {
  SLIMKV_RETURN_IF_ERROR(check_half(out_dtype, "SwiGLU output"));
  if (size == 0) return Status::ok();
  swiglu_kernel<<<blocks_for(size), kThreads>>>(gate, up, size, out, out_dtype == DType::kBF16);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status add(float* x, const float* delta, size_t size) {
  if (size == 0) return Status::ok();
  add_kernel<<<blocks_for(size), kThreads>>>(x, delta, size);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status convert(const float* x, size_t size, void* out, DType out_dtype) {
  SLIMKV_RETURN_IF_ERROR(check_half(out_dtype, "conversion"));
  if (size == 0) return Status::ok();
  convert_kernel<<<blocks_for(size), kThreads>>>(x, size, out, out_dtype == DType::kBF16);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status widen(const void* x, DType dtype, size_t size, float* out) {
  SLIMKV_RETURN_IF_ERROR(check_half(dtype, "widening"));
  if (size == 0) return Status::ok();
  widen_kernel<<<blocks_for(size), kThreads>>>(x, dtype == DType::kBF16, size, out);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status argmax_rows(const float* logits, int n, int vocab, int32_t* out) {
  if (n == 0) return Status::ok();
  if (vocab <= 0) return error("argmax over ", vocab, " logits");
  argmax_kernel<<<unsigned(n), kThreads>>>(logits, vocab, out);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

}  // namespace slimkv::cuda
