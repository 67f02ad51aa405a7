// A mixture-of-experts MLP's steps around its GEMMs, on the GPU (Qwen3-MoE; model/llama_cuda.h runs
// them): the router's softmax and top k per row, each expert's rows gathered back to back for its
// products, and the experts' outputs summed back into each row, weighted. Each is held to a plain
// reference by tests/cuda/expert_routing_test.cc (the routing to the CPU's, model/expert_routing.h).
#pragma once

#include <cstdint>

#include "slimkv/status.h"

namespace slimkv::cuda {

// The most experts a row may have (the routing kernel holds a row's probabilities in shared memory).
inline constexpr int kMaxRoutedExperts = 2048;

// expert_of, expert_weight [n, k] from router_logits [n, experts] FP32 (left as they are), as the CPU's
// route_to_experts computes them: softmax, the k most probable experts in order (the lower expert first
// among equals), their probabilities rescaled to sum to 1 when normalize_top_k. Device arrays.
Status route_to_experts(const float* router_logits, int n, int experts, int k, bool normalize_top_k, int32_t* expert_of,
                        float* expert_weight);

// grouped[p, :] = x[rows[p], :] for p < count: rows of `dim` 16-bit values (FP16 or BF16, copied as they
// are); rows on the device.
Status gather_rows(const uint16_t* x, int dim, const int32_t* rows, int count, uint16_t* grouped);

// y[t, :] = Σ_j weight[t·k + j] · expert_out[position[t·k + j], :] for t < n, the j in order (FP32), or
// y += that when accumulate: each row's k expert outputs (rows of expert_out [*, dim]) summed back into
// its row of y. position and weight on the device.
Status add_weighted_rows(const float* expert_out, const int32_t* position, const float* weight, int n, int k, int dim,
                         float* y, bool accumulate);

}  // namespace slimkv::cuda
