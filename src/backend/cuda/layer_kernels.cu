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
__global__ void rmsnorm_kernel(const float* x, const int32_t* rows, const float* weight, float eps, int dim, void* out,
                               bool bf16) {
  const float* row = x + size_t(rows != nullptr ? rows[blockIdx.x] : blockIdx.x) * dim;
  float square_sum = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) square_sum += row[i] * row[i];
  const float inv_rms = rsqrtf(block_sum(square_sum) / float(dim) + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    store_half(out, bf16, size_t(blockIdx.x) * dim + i, weight[i] * (row[i] * inv_rms));
  }
}

// One thread per (token, head, i < head_dim / 2): the pair (i, i + head_dim / 2) of a query or key
// head is rotated ("rotate half"); value heads are copied.
__global__ void attention_inputs_kernel(const float* qkv, int n, AttentionHeads heads, const float* bias,
                                        const int32_t* positions, const float* inv_freq, __half* q, __half* k,
                                        __half* v) {
  const int half = heads.head_dim / 2;
  const int row_heads = heads.num_heads + 2 * heads.num_kv_heads;
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(n) * row_heads * half) return;
  const int pair = int(i % half);
  const int head = int(i / half % row_heads);
  const size_t t = i / half / row_heads;
  const size_t column = size_t(head) * heads.head_dim + pair;
  const float* row = qkv + t * row_heads * heads.head_dim;
  float a = row[column], b = row[column + half];
  if (bias != nullptr) a += bias[column], b += bias[column + half];
  __half* out;
  if (head < heads.num_heads) {
    out = q + (t * heads.num_heads + head) * heads.head_dim;
  } else if (head < heads.num_heads + heads.num_kv_heads) {
    out = k + (t * heads.num_kv_heads + head - heads.num_heads) * heads.head_dim;
  } else {
    out = v + (t * heads.num_kv_heads + head - heads.num_heads - heads.num_kv_heads) * heads.head_dim;
  }
  if (head < heads.num_heads + heads.num_kv_heads) {
    const float angle = float(positions[t]) * inv_freq[pair];  // an FP32 product, as model/rope.cc
    const float c = float(cos(double(angle))), s = float(sin(double(angle)));
    const float rotated_a = a * c - b * s, rotated_b = b * c + a * s;
    a = rotated_a, b = rotated_b;
  }
  out[pair] = __float2half(a);
  out[pair + half] = __float2half(b);
}

__global__ void swiglu_kernel(const float* gate_up, int n, int intermediate, void* out, bool bf16) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(n) * intermediate) return;
  const size_t t = i / intermediate, c = i % intermediate;
  const float g = gate_up[t * 2 * intermediate + c], u = gate_up[t * 2 * intermediate + intermediate + c];
  store_half(out, bf16, i, g / (1.0f + expf(-g)) * u);
}

__global__ void convert_half_kernel(const void* x, bool bf16, size_t size, void* out, bool out_bf16) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < size) store_half(out, out_bf16, i, load_half(x, bf16, i));
}

}  // namespace

Status embed(const int32_t* tokens, int n, const void* table, DType dtype, int hidden, float* x) {
  SLIMKV_RETURN_IF_ERROR(check_half(dtype, "embedding table"));
  if (n == 0) return Status::ok();
  embed_kernel<<<blocks_for(size_t(n) * hidden), kThreads>>>(tokens, n, table, dtype == DType::kBF16, hidden, x);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status rmsnorm(const float* x, const float* weight, float eps, int n, int dim, void* out, DType out_dtype,
               const int32_t* rows) {
  SLIMKV_RETURN_IF_ERROR(check_half(out_dtype, "RMSNorm output"));
  if (n == 0) return Status::ok();
  rmsnorm_kernel<<<unsigned(n), kThreads>>>(x, rows, weight, eps, dim, out, out_dtype == DType::kBF16);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status attention_inputs(const float* qkv, int n, const AttentionHeads& heads, const float* bias,
                        const int32_t* positions, const float* inv_freq, uint16_t* q, uint16_t* k, uint16_t* v) {
  if (heads.head_dim % 2 != 0) return error("RoPE over an odd head_dim ", heads.head_dim);
  const size_t pairs = size_t(n) * (heads.num_heads + 2 * heads.num_kv_heads) * (heads.head_dim / 2);
  if (pairs == 0) return Status::ok();
  attention_inputs_kernel<<<blocks_for(pairs), kThreads>>>(qkv, n, heads, bias, positions, inv_freq,
                                                           reinterpret_cast<__half*>(q), reinterpret_cast<__half*>(k),
                                                           reinterpret_cast<__half*>(v));
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status swiglu(const float* gate_up, int n, int intermediate, void* out, DType out_dtype) {
  SLIMKV_RETURN_IF_ERROR(check_half(out_dtype, "SwiGLU output"));
  const size_t size = size_t(n) * intermediate;
  if (size == 0) return Status::ok();
  swiglu_kernel<<<blocks_for(size), kThreads>>>(gate_up, n, intermediate, out, out_dtype == DType::kBF16);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status convert_half(const void* x, DType dtype, size_t size, void* out, DType out_dtype) {
  SLIMKV_RETURN_IF_ERROR(check_half(dtype, "conversion input"));
  SLIMKV_RETURN_IF_ERROR(check_half(out_dtype, "conversion output"));
  if (size == 0) return Status::ok();
  convert_half_kernel<<<blocks_for(size), kThreads>>>(x, dtype == DType::kBF16, size, out, out_dtype == DType::kBF16);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

}  // namespace slimkv::cuda
