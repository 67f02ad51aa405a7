// A mixture-of-experts MLP's steps around its GEMMs, on the GPU (Qwen3-MoE; model/llama_cuda.h runs
// them): the router's softmax and top k per row, the plan that groups the rows by expert (on the
// device: the products need no copy back to the host, issue 29), each expert's rows gathered back to
// back for its products, and the experts' outputs summed back into each row, weighted. Each is held to a plain
// reference by tests/cuda/expert_routing_test.cc (the routing to the CPU's, model/expert_routing.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "slimkv/status.h"

namespace slimkv::cuda {

// The most experts a row may have (the routing kernel holds a row's probabilities in shared memory).
inline constexpr int kMaxRoutedExperts = 2048;

// Where each of a step's n·k choices (row t's j-th expert is choice t·k + j) goes when the experts'
// rows are multiplied grouped by expert: places 0 .. n·k - 1 hold the choices expert by expert,
// ascending, each expert's rows ascending (as the CPU runs them, and whatever rows run beside: a row's
// place among its expert's changes nothing of its product). Device arrays, back to back in one
// allocation of expert_plan_values (expert_plan_at), zeroed when it is made; written by route_to_experts.
struct ExpertRowsPlan {
  uint32_t* finished_ctas = nullptr;   // the routing's CTAs done so far: 0 between launches
  int32_t* row_of_place = nullptr;     // [n·k] the row of the choice at each place
  int32_t* place_of_choice = nullptr;  // [n·k] each choice's place; -1 for a choice of no expert (a NaN in its row's logits)
  int32_t* first_place = nullptr;      // [experts + 1] expert e's places are first_place[e] .. first_place[e + 1] - 1
  int32_t* active_experts = nullptr;   // [expert_slots] the experts with rows, ascending, then -1
};

// Experts a step of `choices` can have with rows: a bound the host knows without waiting for the routing.
inline int expert_slots(int choices, int experts) { return std::min(choices, experts); }

// int32 values of a plan for up to `choices` choices over `experts` experts, and the plan laid out in
// them (finished_ctas first, where a plan of fewer choices finds it too).
size_t expert_plan_values(int choices, int experts);
ExpertRowsPlan expert_plan_at(int32_t* values, int choices, int experts);

// expert_of, expert_weight [n, k] from router_logits [n, experts] FP32 (left as they are), as the CPU's
// route_to_experts computes them: softmax, the k most probable experts in order (the lower expert first
// among equals), their probabilities rescaled to sum to 1 when normalize_top_k; and their plan. A row of
// NaN logits gets expert `experts` (no expert) k times, which the plan gives no place. One launch: a
// warp per row, and the last CTA to finish plans every row's choices (a counting sort, no atomics where
// order counts), so nothing waits on the host. Device arrays.
Status route_to_experts(const float* router_logits, int n, int experts, int k, bool normalize_top_k, int32_t* expert_of,
                        float* expert_weight, const ExpertRowsPlan& plan);

// grouped[p, :] = x[rows[p], :] for p < count: rows of `dim` 16-bit values (FP16 or BF16, copied as they
// are); rows on the device.
Status gather_rows(const uint16_t* x, int dim, const int32_t* rows, int count, uint16_t* grouped);

// y[t, :] = Σ_j weight[t·k + j] · expert_out[position[t·k + j], :] for t < n, the j in order (FP32), or
// y += that when accumulate: each row's k expert outputs (rows of expert_out [*, dim]) summed back into
// its row of y. position and weight on the device; a position of -1 (a choice of no expert) adds NaN.
Status add_weighted_rows(const float* expert_out, const int32_t* position, const float* weight, int n, int k, int dim,
                         float* y, bool accumulate);

}  // namespace slimkv::cuda
