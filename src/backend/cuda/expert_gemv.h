// The experts of a mixture-of-experts layer multiplied in one launch (issue 29): every routed row by its
// expert's matrix, all experts at once, with the plan of expert_routing.h read on the device. Decode
// of Qwen3-MoE ran one launch per active expert and matrix after a copy of the routing to the host
// (1396 kernels a step on an H100, 0.13 of the memory roofline); this is one launch per matrix.
//
// The products are the quantized GEMV's (weight_rows.cuh: the weights decoded in registers, FP32 sums
// in a fixed order per row), so a row's output is the same as quantized_gemv gives it alone, whatever
// other rows its expert or the step holds. Plain FP16/BF16 experts go through the same loop, widened.
// Held to the plain reference (FP64 products of dequantize_reference's rows) by
// tests/cuda/expert_gemv_test.cc.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cuda/expert_routing.h"
#include "backend/cuda/layer_kernels.h"
#include "backend/cuda/quantized_gemm.h"
#include "slimkv/status.h"
#include "tensor/dtype.h"

namespace slimkv::cuda {

// One matrix of every expert of a layer, all of one kind and shape: expert e's is expert 0's moved on
// by e · stride_bytes (its bodies and its split-out scales alike: a model's weight arena lays each
// expert out as the one before).
struct ExpertMatrices {
  DeviceMatrix first;  // expert 0's
  size_t stride_bytes = 0;
  int count = 0;

  DeviceMatrix expert(int e) const;
};

// Ok when the grouped product can multiply w: blocks of whole rows, or plain rows of a multiple of 8
// values (16-byte loads); else an error naming what it cannot hold.
Status check_grouped_expert_shape(const ExpertMatrices& w);

// The products of a grouped W_down summed back into each row of the step, weighted (add_weighted_rows'
// sum, the same bits) by the last CTA to finish each block of output columns: no launch of its own.
struct WeightedRowSum {
  float* out = nullptr;               // [n, rows of W] FP32: out = the sum, or out += it when accumulate
  bool accumulate = false;
  const float* weight = nullptr;      // [n·k] each choice's weight (route_to_experts' expert_weight)
  int n = 0, k = 0;
  uint32_t* finished_ctas = nullptr;  // [grouped_sum_counters(rows of W)] 0 when made, 0 after each launch
};
int64_t grouped_sum_counters(int64_t rows);

// y[p, 0 .. w.first.rows) = x[input row of p, :] · W_eᵀ for every place p of the plan, e the expert whose
// places hold p (plan.first_place), the input row x_rows[p], or p without x_rows. x [*, w.first.cols] in
// x_dtype (kF16/kBF16; a plain W must be of the same dtype), y FP32 with row stride y_stride. `slots`
// bounds the experts with rows (expert_slots of the step): one group of CTAs per slot, those past the
// plan's active experts idle. With sum.out, every row's k products are then summed into sum.out.
Status grouped_expert_gemv(const void* x, const int32_t* x_rows, DType x_dtype, const ExpertMatrices& w,
                           const ExpertRowsPlan& plan, int slots, float* y, int64_t y_stride,
                           const WeightedRowSum& sum = {});

// out[p, o] = act(g) · u for every place p and o < intermediate, where g, u are row o and row
// intermediate + o of grouped_expert_gemv's product by w_gate_up (W_gate|W_up stacked in one matrix
// [2·intermediate, cols] of one kind): the products and the activation in one launch, each warp taking
// a gate row and its up row (so each input value read serves both). out [*, intermediate] in x_dtype,
// the same bits as grouped_expert_gemv then gated_activation give.
Status grouped_expert_gated_gemv(const void* x, const int32_t* x_rows, DType x_dtype, const ExpertMatrices& w_gate_up,
                                 GateActivation activation, const ExpertRowsPlan& plan, int slots, void* out);

}  // namespace slimkv::cuda
