#include "backend/cuda/layer_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gated_value.cuh"

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

__global__ void embed_kernel(const int32_t* tokens, int n, const void* table, bool bf16, int hidden, float scale,
                             float* x) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(n) * hidden) return;
  const size_t t = i / hidden, c = i % hidden;
  x[i] = load_half(table, bf16, size_t(tokens[t]) * hidden + c) * scale;
}

// RMSNorm: one CTA per row, each thread holding the values i = threadIdx.x + j·blockDim.x (j <
// kNormValues) of the row in registers, all loads issued before the first is used, and the weight's
// likewise after the sum: a decode step's norms are one row each, and a loop of dependent loads per
// thread paid the memory's latency over and over (10.9 us a norm of Llama-3-8B's 4096 values on an
// H100, 65 norms a step).
constexpr int kNormValues = 16;
constexpr int kNormMaxThreads = 1024;
constexpr int kNormMaxDim = kNormValues * kNormMaxThreads;

struct NormedRow {
  float value[kNormValues];
  float inv_rms;  // 1 / rms(row), the mean square in FP32 as the CPU's rmsnorm
};

__device__ void load_normed_row(const float* row, float eps, int dim, NormedRow& r) {
#pragma unroll
  for (int j = 0; j < kNormValues; ++j) {
    const int i = threadIdx.x + j * int(blockDim.x);
    r.value[j] = i < dim ? row[i] : 0.0f;
  }
  float square_sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kNormValues; ++j) square_sum += r.value[j] * r.value[j];
  r.inv_rms = rsqrtf(block_sum(square_sum) / float(dim) + eps);
}

// The thread's normed values times the weight, handed to put(i, value) for each of its indices i.
template <typename Put>
__device__ void put_normed_row(const NormedRow& r, const float* weight, int dim, Put put) {
  float w[kNormValues];
#pragma unroll
  for (int j = 0; j < kNormValues; ++j) {
    const int i = threadIdx.x + j * int(blockDim.x);
    w[j] = i < dim ? weight[i] : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kNormValues; ++j) {
    const int i = threadIdx.x + j * int(blockDim.x);
    if (i < dim) put(i, w[j] * (r.value[j] * r.inv_rms));
  }
}

// out[r] = the row (rows ? rows[r] : r) of x normed, times the weight, in FP16/BF16.
__global__ __launch_bounds__(kNormMaxThreads) void rmsnorm_kernel(const float* x, const int32_t* rows,
                                                                  const float* weight, float eps, int dim, void* out,
                                                                  bool bf16) {
  NormedRow r;
  load_normed_row(x + size_t(rows != nullptr ? rows[blockIdx.x] : blockIdx.x) * dim, eps, dim, r);
  put_normed_row(r, weight, dim, [&](int i, float v) { store_half(out, bf16, size_t(blockIdx.x) * dim + i, v); });
}

// x += the row of y normed (Gemma 3's sandwich norms).
__global__ __launch_bounds__(kNormMaxThreads) void add_rmsnorm_kernel(const float* y, const float* weight, float eps,
                                                                      int dim, float* x) {
  NormedRow r;
  load_normed_row(y + size_t(blockIdx.x) * dim, eps, dim, r);
  put_normed_row(r, weight, dim, [&](int i, float v) { x[size_t(blockIdx.x) * dim + i] += v; });
}

// Threads for a norm of dim values: about four values a thread, whole warps (block_sum), at most 1024.
unsigned norm_threads(int dim) { return unsigned(std::clamp((dim / 4 + 31) / 32 * 32, 32, kNormMaxThreads)); }

Status check_norm_dim(int dim) {
  if (dim >= 1 && dim <= kNormMaxDim) return Status::ok();
  return error("RMSNorm of rows of ", dim, " values (expected 1 to ", kNormMaxDim, ")");
}

// rot=hadamard (kv/rotation.h): x ← H x over n values in shared memory, one thread per value, the same
// butterflies and scale as the CPU's hadamard_rotate: n a power of two, or consecutive power-of-two
// chunks, largest first (100 = 64 + 32 + 4), each turned by its own H. Every thread of the CTA calls it.
__device__ void walsh_hadamard_in_shared(float* x, int n) {
  const int i = threadIdx.x;
  // The size of value i's chunk: chunks start at multiples of their sizes, so a butterfly's partner
  // (i ^ half) lies in i's chunk while half is below its size.
  int chunk = 0;
  for (int size = n > 0 ? 1 << (31 - __clz(n)) : 0, start = 0; size > 0; size /= 2) {
    if ((n & size) == 0) continue;
    if (i >= start && i < start + size) chunk = size;
    start += size;
  }
  for (int half = 1; half < n; half *= 2) {
    __syncthreads();
    float value = 0.0f;
    if (i < n) value = half >= chunk ? x[i] : (i & half) ? x[i - half] - x[i] : x[i] + x[i + half];
    __syncthreads();
    if (i < n) x[i] = value;
  }
  __syncthreads();
  if (i < n) x[i] *= 1.0f / sqrtf(float(chunk));
  __syncthreads();
}

// One CTA per (token, head of the qkv row), a thread per stored dim (rounded up to whole warps, for
// block_sum): bias, the q/k norm, then RoPE on query and key heads (thread i < head_dim / 2 turns the
// pair (i, i + head_dim / 2)), then rot=hadamard over the stored dims, then FP16 (zeros past head_dim).
__global__ void attention_inputs_kernel(const float* qkv, AttentionHeads heads, const float* bias, QkNorm norm,
                                        const int32_t* positions, const float* inv_freq, bool rotate, __half* q,
                                        __half* k, __half* v) {
  extern __shared__ float head_values[];  // [stored]
  const int d = heads.head_dim, half = d / 2, stored = heads.stored_dim, i = threadIdx.x;  // stored_dim set by the launch
  const int row_heads = heads.num_heads + 2 * heads.num_kv_heads;
  const int head = int(blockIdx.x % row_heads);
  const size_t t = blockIdx.x / row_heads;
  const bool is_query = head < heads.num_heads, is_key = !is_query && head < heads.num_heads + heads.num_kv_heads;
  float value = 0.0f;
  if (i < d) {
    const size_t column = size_t(head) * d + i;
    value = qkv[t * row_heads * d + column] + (bias != nullptr ? bias[column] : 0.0f);
  }
  // The weight is the same for the whole CTA, so every thread takes (or skips) block_sum together.
  const float* norm_weight = is_query ? norm.q_weight : is_key ? norm.k_weight : nullptr;
  if (norm_weight != nullptr) {
    const float inv_rms = rsqrtf(block_sum(value * value) / float(d) + norm.eps);
    if (i < d) value = norm_weight[i] * (value * inv_rms);
  }
  if (i < stored) head_values[i] = value;
  __syncthreads();
  if ((is_query || is_key) && i < half) {
    const float angle = float(positions[t]) * inv_freq[i];  // an FP32 product, as model/rope.cc
    const float c = float(cos(double(angle))), s = float(sin(double(angle)));
    const float a = head_values[i], b = head_values[i + half];
    head_values[i] = a * c - b * s;
    head_values[i + half] = b * c + a * s;
  }
  if (rotate) walsh_hadamard_in_shared(head_values, stored);
  __syncthreads();
  __half* out;
  if (is_query) {
    out = q + (t * heads.num_heads + head) * stored;
  } else if (is_key) {
    out = k + (t * heads.num_kv_heads + head - heads.num_heads) * stored;
  } else {
    out = v + (t * heads.num_kv_heads + head - heads.num_heads - heads.num_kv_heads) * stored;
  }
  if (i < stored) out[i] = __float2half(head_values[i]);
}

// One CTA per head row of x (FP16, in place), a thread per dim.
__global__ void rotate_heads_kernel(__half* x, int head_dim) {
  extern __shared__ float head_values[];
  __half* row = x + size_t(blockIdx.x) * head_dim;
  head_values[threadIdx.x] = __half2float(row[threadIdx.x]);
  walsh_hadamard_in_shared(head_values, head_dim);
  row[threadIdx.x] = __float2half(head_values[threadIdx.x]);
}

// One CTA per (row, head) of x [rows, heads, head_dim] (FP16; out likewise, or x itself), a thread per
// dim: H over the head's first dims[h / heads_per_dims] values, the others copied.
__global__ void rotate_head_prefixes_kernel(const __half* x, int heads, int head_dim, const int* dims, int heads_per_dims,
                                            __half* out) {
  extern __shared__ float head_values[];
  const int h = int(blockIdx.x) % heads, n = dims[h / heads_per_dims], i = threadIdx.x;
  const size_t at = size_t(blockIdx.x) * head_dim + i;
  const __half value = x[at];
  if (i < n) head_values[i] = __half2float(value);
  walsh_hadamard_in_shared(head_values, n);
  out[at] = i < n ? __float2half(head_values[i]) : value;
}

__global__ void gated_activation_kernel(const float* gate_up, int n, int intermediate, GateActivation activation,
                                        void* out, bool bf16) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(n) * intermediate) return;
  const size_t t = i / intermediate, c = i % intermediate;
  const float g = gate_up[t * 2 * intermediate + c], u = gate_up[t * 2 * intermediate + intermediate + c];
  store_half(out, bf16, i, gated_value(g, u, activation));
}

__global__ void soft_cap_kernel(float* logits, size_t size, float cap) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < size) logits[i] = cap * tanhf(logits[i] / cap);
}

__global__ void convert_half_kernel(const void* x, bool bf16, size_t size, void* out, bool out_bf16) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < size) store_half(out, out_bf16, i, load_half(x, bf16, i));
}

}  // namespace

Status embed(const int32_t* tokens, int n, const void* table, DType dtype, int hidden, float scale, float* x) {
  SLIMKV_RETURN_IF_ERROR(check_half(dtype, "embedding table"));
  if (n == 0) return Status::ok();
  embed_kernel<<<blocks_for(size_t(n) * hidden), kThreads>>>(tokens, n, table, dtype == DType::kBF16, hidden, scale, x);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status rmsnorm(const float* x, const float* weight, float eps, int n, int dim, void* out, DType out_dtype,
               const int32_t* rows) {
  SLIMKV_RETURN_IF_ERROR(check_half(out_dtype, "RMSNorm output"));
  SLIMKV_RETURN_IF_ERROR(check_norm_dim(dim));
  if (n == 0) return Status::ok();
  rmsnorm_kernel<<<unsigned(n), norm_threads(dim)>>>(x, rows, weight, eps, dim, out, out_dtype == DType::kBF16);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status add_rmsnorm(const float* y, const float* weight, float eps, int n, int dim, float* x) {
  SLIMKV_RETURN_IF_ERROR(check_norm_dim(dim));
  if (n == 0) return Status::ok();
  add_rmsnorm_kernel<<<unsigned(n), norm_threads(dim)>>>(y, weight, eps, dim, x);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status attention_inputs(const float* qkv, int n, const AttentionHeads& heads, const float* bias, const QkNorm& norm,
                        const int32_t* positions, const float* inv_freq, bool rotate, uint16_t* q, uint16_t* k,
                        uint16_t* v) {
  const int d = heads.head_dim, stored = heads.stored();
  if (d < 2 || d % 2 != 0 || stored < d || stored > 1024 || (rotate && (stored & (stored - 1)) != 0)) {
    return error("attention inputs: head_dim ", d, " stored in ", stored,
                 " dims (expected head_dim even, stored >= head_dim, at most 1024; a power of two to rotate)");
  }
  const size_t rows = size_t(n) * (heads.num_heads + 2 * heads.num_kv_heads);
  if (rows == 0) return Status::ok();
  const unsigned threads = unsigned((stored + 31) / 32 * 32);
  AttentionHeads launched = heads;
  launched.stored_dim = stored;
  attention_inputs_kernel<<<unsigned(rows), threads, size_t(stored) * sizeof(float)>>>(
      qkv, launched, bias, norm, positions, inv_freq, rotate, reinterpret_cast<__half*>(q), reinterpret_cast<__half*>(k),
      reinterpret_cast<__half*>(v));
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status rotate_heads(uint16_t* x, size_t rows, int head_dim) {
  if (head_dim < 1 || head_dim > 1024 || (head_dim & (head_dim - 1)) != 0) {
    return error("rot=hadamard over head_dim ", head_dim, " (expected a power of two, at most 1024)");
  }
  if (rows == 0) return Status::ok();
  rotate_heads_kernel<<<unsigned(rows), unsigned(head_dim), size_t(head_dim) * sizeof(float)>>>(
      reinterpret_cast<__half*>(x), head_dim);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status rotate_head_prefixes(const uint16_t* x, int rows, int heads, int head_dim, const int* dims, int heads_per_dims,
                            uint16_t* out) {
  if (heads < 1 || heads_per_dims < 1 || heads % heads_per_dims != 0 || head_dim < 1 || head_dim > 1024) {
    return error("rot=hadamard over head prefixes: ", heads, " heads, ", heads_per_dims, " per dims entry, head_dim ", head_dim,
                 " (expected heads a multiple of heads_per_dims, head_dim 1 to 1024)");
  }
  if (rows <= 0) return Status::ok();
  rotate_head_prefixes_kernel<<<unsigned(rows) * unsigned(heads), unsigned(head_dim), size_t(head_dim) * sizeof(float)>>>(
      reinterpret_cast<const __half*>(x), heads, head_dim, dims, heads_per_dims, reinterpret_cast<__half*>(out));
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status gated_activation(const float* gate_up, int n, int intermediate, GateActivation activation, void* out,
                        DType out_dtype) {
  SLIMKV_RETURN_IF_ERROR(check_half(out_dtype, "gated activation output"));
  const size_t size = size_t(n) * intermediate;
  if (size == 0) return Status::ok();
  gated_activation_kernel<<<blocks_for(size), kThreads>>>(gate_up, n, intermediate, activation, out,
                                                          out_dtype == DType::kBF16);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status soft_cap(float* logits, size_t size, float cap) {
  if (!(cap > 0.0f)) return error("logit soft-capping: cap ", cap, " (expected positive)");
  if (size == 0) return Status::ok();
  soft_cap_kernel<<<blocks_for(size), kThreads>>>(logits, size, cap);
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
