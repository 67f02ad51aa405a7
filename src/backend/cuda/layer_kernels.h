// The forward pass's steps between the matrix products, on the GPU (ARCHITECTURE.md "The forward
// pass"): embedding, RMSNorm, RoPE, SwiGLU, residual adds, and greedy sampling. The residual stream
// and projections are FP32; what feeds a matrix product is written in the weights' dtype (F16/BF16).
// Each mirrors a CPU step of model/llama.cc and is tested against a scalar reference.
#pragma once

#include <cstddef>
#include <cstdint>

#include "slimkv/status.h"
#include "tensor/dtype.h"

namespace slimkv::cuda {

// x[t, :] = table[tokens[t], :] widened to FP32. table [vocab, hidden] in dtype; tokens on the device.
Status embed(const int32_t* tokens, int n, const void* table, DType dtype, int hidden, float* x);

// out[t, :] = x[t, :] / rms(x[t, :]) · weight, written in out_dtype (transformers' LlamaRMSNorm).
Status rmsnorm(const float* x, const float* weight, float eps, int n, int dim, void* out, DType out_dtype);

// Rotates x [n, num_heads, head_dim] in place, "rotate half" layout, with the angles of model/rope.h:
// cos, sin [n, head_dim / 2] (default and llama3 scaling differ only in those).
Status rope(float* x, int n, int num_heads, int head_dim, const float* cos, const float* sin);

// out = silu(gate) · up, elementwise, written in out_dtype (SwiGLU).
Status swiglu(const float* gate, const float* up, size_t size, void* out, DType out_dtype);

// x += delta (residual adds; biases with n rows).
Status add(float* x, const float* delta, size_t size);

// out = x in out_dtype (queries and K/V for the FP16 attention; an attention output for o_proj).
Status convert(const float* x, size_t size, void* out, DType out_dtype);
Status widen(const void* x, DType dtype, size_t size, float* out);

// out[t] = the index of the largest of logits[t, :] (the first of equals, as the CPU sampler).
Status argmax_rows(const float* logits, int n, int vocab, int32_t* out);

}  // namespace slimkv::cuda
