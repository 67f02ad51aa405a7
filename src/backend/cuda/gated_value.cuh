// act(gate) · up, the gated MLP's activation, as one device function for the kernels that apply it: the
// activation kernel over FP32 products (layer_kernels.cu gated_activation) and the experts' grouped
// gate/up product that applies it as it writes (expert_gemv.cu). Each step rounds as written (the _rn
// intrinsics: no contraction into FMAs that the compiler might choose in one kernel and not the other),
// so the two give the same bits.
#pragma once

#include "backend/cuda/layer_kernels.h"

namespace slimkv::cuda {

// silu(g) · u (SwiGLU), or GELU's tanh approximation of g times u (GeGLU: model/llama.cc's gated_activation).
__device__ inline float gated_value(float g, float u, GateActivation activation) {
  if (activation == GateActivation::kSilu) return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
  const float sqrt_2_over_pi = 0.7978845608028654f;
  const float cube = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g);
  const float inner = __fmul_rn(sqrt_2_over_pi, __fadd_rn(g, cube));
  return __fmul_rn(__fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, tanhf(inner))), u);
}

}  // namespace slimkv::cuda
