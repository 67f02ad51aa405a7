// The forward pass's steps between the matrix products, on the GPU (ARCHITECTURE.md "The forward
// pass"): embedding, RMSNorm, bias + q/k norms + RoPE into the attention's FP16 inputs, the gated
// activation (SwiGLU, GeGLU), Gemma's normed residual adds and logit soft-capping (the plain residual
// adds ride on the GEMMs: backend/cuda/gemm.h; choosing tokens is backend/cuda/sampling.h). The residual stream and the
// projections are FP32; what feeds a matrix product is written in the weights' dtype (F16/BF16).
// Each mirrors a CPU step of model/llama.cc and is tested against a scalar reference.
#pragma once

#include <cstddef>
#include <cstdint>

#include "slimkv/status.h"
#include "tensor/dtype.h"

namespace slimkv::cuda {

// x[t, :] = table[tokens[t], :] widened to FP32, times `scale` (Gemma's √hidden; 1 elsewhere: exact).
// table [vocab, hidden] in dtype; tokens on the device.
Status embed(const int32_t* tokens, int n, const void* table, DType dtype, int hidden, float scale, float* x);

// out[r, :] = x[i, :] / rms(x[i, :]) · weight for r < n, i = rows[r] (rows: device, nullptr = r), written
// in out_dtype (transformers' LlamaRMSNorm). `rows` picks the tokens whose logits are wanted.
Status rmsnorm(const float* x, const float* weight, float eps, int n, int dim, void* out, DType out_dtype,
               const int32_t* rows = nullptr);

// x[r, :] += y[r, :] / rms(y[r, :]) · weight, FP32 [n, dim] (Gemma 3's post-attention and post-MLP
// norms: the sublayer's output is normed before the residual add).
Status add_rmsnorm(const float* y, const float* weight, float eps, int n, int dim, float* x);

// The attention's inputs from the fused q/k/v projection (ARCHITECTURE.md: project, rope, append):
// qkv [n, (num_heads + 2·num_kv_heads) · head_dim] FP32 holds each token's query heads, then key heads,
// then value heads. Adds the bias (nullptr: none), norms each q and k head over head_dim with its own
// RMSNorm weight (`norm`: Qwen3's and Gemma 3's q/k norms, as model/llama.cc), rotates q and k by RoPE at each token's position
// with the angles of model/rope.h (FP32 position · inverse frequency, cos/sin in double, so the GPU
// and CPU rotate alike; default and llama3 scaling differ only in inv_freq [head_dim / 2]), with
// `rotate` turns every head by the Walsh–Hadamard H of kv/rotation.h (rot=hadamard: q, k, v in the
// rotated basis, as the CPU store keeps them), and writes q [n, num_heads, stored_dim], k and v
// [n, num_kv_heads, stored_dim] in FP16 for attention and the KV cache: each head's head_dim values, then
// zeros up to stored_dim (a head_dim the attention kernels lack, e.g. 48, runs at the next size they
// have: zeros add nothing to q·k, and V's zero dims give zero outputs that W_o's zero columns ignore).
struct AttentionHeads {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;    // of the projections
  int stored_dim = 0;  // of each head as written, >= head_dim (rotate: over stored_dim); 0: head_dim
  int stored() const { return stored_dim > 0 ? stored_dim : head_dim; }
};
struct QkNorm {
  const float* q_weight = nullptr;  // [head_dim] FP32; nullptr: no q/k norms
  const float* k_weight = nullptr;  // [head_dim] FP32
  float eps = 0;
};
Status attention_inputs(const float* qkv, int n, const AttentionHeads& heads, const float* bias, const QkNorm& norm,
                        const int32_t* positions, const float* inv_freq, bool rotate, uint16_t* q, uint16_t* k,
                        uint16_t* v);

// x ← H x for each of `rows` FP16 head vectors of head_dim (a power of two): turns the attention output
// of rotated q, k, v back (H is its own inverse).
Status rotate_heads(uint16_t* x, size_t rows, int head_dim);
// out ← H x over the first dims[h / heads_per_dims] values (1..head_dim; H of kv/rotation.h, chunked where
// that is not a power of two) of each head h of x [rows, heads, head_dim] (FP16; dims: device), the rest
// copied; out may be x: heads kept at their own dims (ZACK's ranks) under rot=hadamard.
Status rotate_head_prefixes(const uint16_t* x, int rows, int heads, int head_dim, const int* dims, int heads_per_dims,
                            uint16_t* out);

// out[t, i] = act(gate[t, i]) · up[t, i] from the fused gate/up projection gate_up [n, 2·intermediate]
// (each row its gate, then its up), written [n, intermediate] in out_dtype: silu (SwiGLU), or GELU's
// tanh approximation (GeGLU, Gemma: PyTorch's gelu(approximate="tanh")).
enum class GateActivation { kSilu, kGeluTanh };
Status gated_activation(const float* gate_up, int n, int intermediate, GateActivation activation, void* out,
                        DType out_dtype);

// logits ← cap · tanh(logits / cap), FP32 [size] (Gemma's final_logit_softcapping).
Status soft_cap(float* logits, size_t size, float cap);

// out = x converted between the half dtypes (the FP16 attention output into a BF16 model's o_proj).
Status convert_half(const void* x, DType dtype, size_t size, void* out, DType out_dtype);

}  // namespace slimkv::cuda
