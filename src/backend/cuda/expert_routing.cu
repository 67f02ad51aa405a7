#include "backend/cuda/expert_routing.h"

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/weighted_choices.cuh"

namespace slimkv::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(size_t size) { return unsigned((size + kThreads - 1) / kThreads); }

// Routing: one warp per row, its probabilities in shared memory (kRoutingWarps rows a CTA). A row's k
// choices are k rounds of a warp-wide argmax, each chosen expert then marked -1 (below any probability).
constexpr int kRoutingWarps = 4;
// kMaxRoutedExperts: a CTA's rows' probabilities take 4 · kRoutingWarps · experts bytes of shared memory, 32 KB at most.
static_assert(kRoutingWarps * kMaxRoutedExperts * sizeof(float) <= 32 * 1024);

__device__ float warp_max(float value) {
  for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

__device__ float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// Row `row`'s k choices and weights, by the warp (p: its experts' probabilities in shared memory).
__device__ void route_row(const float* logits, int row, int experts, int k, bool normalize_top_k, float* p,
                          int32_t* expert_of, float* expert_weight) {
  const int lane = int(threadIdx.x) % 32;
  const float* l = logits + size_t(row) * experts;
  float max = -INFINITY;
  for (int e = lane; e < experts; e += 32) {
    p[e] = l[e];
    max = fmaxf(max, p[e]);
  }
  max = warp_max(max);
  float sum = 0.0f;
  for (int e = lane; e < experts; e += 32) {
    p[e] = expf(p[e] - max);
    sum += p[e];
  }
  sum = warp_sum(sum);
  for (int e = lane; e < experts; e += 32) p[e] /= sum;
  __syncwarp();
  int32_t* chosen = expert_of + size_t(row) * k;
  float* weight = expert_weight + size_t(row) * k;
  float top = 0.0f;  // the chosen probabilities' sum, added in the CPU's order
  for (int j = 0; j < k; ++j) {
    // Each lane's best of its experts (ascending, so a strict > keeps the lower of equals), then the
    // warp's: the larger probability, the lower expert among equals. Every lane ends with the same.
    float best = -INFINITY;
    int best_expert = experts;
    for (int e = lane; e < experts; e += 32) {
      if (p[e] > best) {
        best = p[e];
        best_expert = e;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, best, offset);
      const int other_expert = __shfl_xor_sync(0xffffffffu, best_expert, offset);
      if (other > best || (other == best && other_expert < best_expert)) {
        best = other;
        best_expert = other_expert;
      }
    }
    // No expert at all only where the logits hold a NaN: `experts` is written, which the plan leaves
    // without a place (the row's output NaN).
    if (lane == 0) {
      chosen[j] = best_expert;
      weight[j] = best;
    }
    top += best;
    if (best_expert < experts && best_expert % 32 == lane) p[best_expert] = -1.0f;  // the lane that owns it
    __syncwarp();
  }
  if (normalize_top_k && lane == 0) {
    for (int j = 0; j < k; ++j) weight[j] /= top;
  }
}

// The sum of `value` over the lanes before this one.
__device__ int warp_exclusive_prefix(int value) {
  const int lane = int(threadIdx.x) % 32;
  int inclusive = value;
  for (int offset = 1; offset < 32; offset *= 2) {
    const int before = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += before;
  }
  return inclusive - value;
}

// The plan of the choices, by one CTA (the whole CTA calls it): its threads count each expert's rows;
// then warp 0: each lane scans a run of experts, the lanes' totals summed across the warp (an exclusive
// prefix); then the choices 32 at a time in order, each lane's place its expert's next place plus the
// lanes before it with the same expert (a warp-wide match). expert_of was written by other CTAs: read
// past L1 (__ldcg), which is not kept coherent with them. next_place: shared memory of `experts` values.
__device__ void plan_choices(const int32_t* expert_of, int choices, int k, int experts, int slots,
                             const ExpertRowsPlan& plan, int32_t* next_place) {
  for (int e = int(threadIdx.x); e < experts; e += int(blockDim.x)) next_place[e] = 0;
  __syncthreads();
  for (int i = int(threadIdx.x); i < choices; i += int(blockDim.x)) {
    const int e = __ldcg(expert_of + i);
    if (e >= 0 && e < experts) atomicAdd(&next_place[e], 1);  // counts: the same in any order
  }
  __syncthreads();
  if (threadIdx.x >= 32) return;
  const int lane = int(threadIdx.x);
  const int per_lane = (experts + 31) / 32, begin = min(experts, lane * per_lane), end = min(experts, begin + per_lane);
  int rows = 0, active = 0;
  for (int e = begin; e < end; ++e) {
    rows += next_place[e];
    active += next_place[e] > 0 ? 1 : 0;
  }
  int place = warp_exclusive_prefix(rows), slot = warp_exclusive_prefix(active);
  for (int e = begin; e < end; ++e) {
    const int count = next_place[e];
    plan.first_place[e] = place;
    if (count > 0) plan.active_experts[slot++] = e;
    next_place[e] = place;
    place += count;
  }
  if (lane == 31) plan.first_place[experts] = place;
  const int active_total = __shfl_sync(0xffffffffu, slot, 31);
  for (int s = active_total + lane; s < slots; s += 32) plan.active_experts[s] = -1;
  __syncwarp();
  for (int base = 0; base < choices; base += 32) {
    const int i = base + lane;
    const int e = i < choices ? __ldcg(expert_of + i) : -1;
    const bool routed = e >= 0 && e < experts;
    const unsigned same = __match_any_sync(0xffffffffu, routed ? e : -1);
    const int rank = __popc(same & ((1u << lane) - 1u));
    if (routed) {
      const int p = next_place[e] + rank;
      plan.row_of_place[p] = i / k;
      plan.place_of_choice[i] = p;
    } else if (i < choices) {
      plan.place_of_choice[i] = -1;
    }
    __syncwarp();
    if (routed && rank == 0) next_place[e] += __popc(same);
    __syncwarp();
  }
}

// A warp per row (kRoutingWarps rows a CTA); then the last CTA to finish (each CTA's choices made
// visible device-wide before it counts itself done, as CUDA's threadFenceReduction sample) plans them
// all and sets the count back to 0 for the next launch.
__global__ void route_kernel(const float* logits, int n, int experts, int k, bool normalize_top_k, int32_t* expert_of,
                             float* expert_weight, ExpertRowsPlan plan, int slots) {
  extern __shared__ float probabilities[];  // [kRoutingWarps, experts]; then the plan's [experts] counts
  const int warp = int(threadIdx.x) / 32;
  const int row = int(blockIdx.x) * kRoutingWarps + warp;
  if (row < n) {
    route_row(logits, row, experts, k, normalize_top_k, probabilities + size_t(warp) * experts, expert_of,
              expert_weight);
  }
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(plan.finished_ctas, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (threadIdx.x == 0) *plan.finished_ctas = 0;
  plan_choices(expert_of, n * k, k, experts, slots, plan, reinterpret_cast<int32_t*>(probabilities));
}

__global__ void gather_rows_kernel(const uint16_t* x, int dim, const int32_t* rows, int count, uint16_t* grouped) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(count) * dim) return;
  const size_t p = i / dim, c = i % dim;
  grouped[i] = x[size_t(rows[p]) * dim + c];
}

__global__ void add_weighted_rows_kernel(const float* expert_out, const int32_t* position, const float* weight, int n,
                                         int k, int dim, float* y, bool accumulate) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= size_t(n) * dim) return;
  const size_t t = i / dim, c = i % dim;
  const float sum = weighted_choices_sum(expert_out, position, weight, t, k, c, size_t(dim));
  y[i] = accumulate ? y[i] + sum : sum;
}

}  // namespace

Status route_to_experts(const float* router_logits, int n, int experts, int k, bool normalize_top_k, int32_t* expert_of,
                        float* expert_weight, const ExpertRowsPlan& plan) {
  if (experts < 1 || experts > kMaxRoutedExperts || k < 1 || k > experts) {
    return error("expert routing: ", k, " of ", experts, " experts a row (expected 1 <= k <= experts <= ", kMaxRoutedExperts,
                 ")");
  }
  // At least one CTA: no rows still make a plan (of no places).
  const unsigned blocks = unsigned(std::max(1, (n + kRoutingWarps - 1) / kRoutingWarps));
  route_kernel<<<blocks, kRoutingWarps * 32, size_t(kRoutingWarps) * size_t(experts) * sizeof(float)>>>(
      router_logits, n, experts, k, normalize_top_k, expert_of, expert_weight, plan, expert_slots(n * k, experts));
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

size_t expert_plan_values(int choices, int experts) {
  return 1 + 2 * size_t(choices) + size_t(experts) + 1 + size_t(expert_slots(choices, experts));
}

ExpertRowsPlan expert_plan_at(int32_t* values, int choices, int experts) {
  ExpertRowsPlan plan;
  plan.finished_ctas = reinterpret_cast<uint32_t*>(values);
  plan.row_of_place = values + 1;
  plan.place_of_choice = plan.row_of_place + choices;
  plan.first_place = plan.place_of_choice + choices;
  plan.active_experts = plan.first_place + experts + 1;
  return plan;
}

Status gather_rows(const uint16_t* x, int dim, const int32_t* rows, int count, uint16_t* grouped) {
  if (size_t(count) * dim == 0) return Status::ok();
  gather_rows_kernel<<<blocks_for(size_t(count) * dim), kThreads>>>(x, dim, rows, count, grouped);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status add_weighted_rows(const float* expert_out, const int32_t* position, const float* weight, int n, int k, int dim,
                         float* y, bool accumulate) {
  if (size_t(n) * dim == 0) return Status::ok();
  add_weighted_rows_kernel<<<blocks_for(size_t(n) * dim), kThreads>>>(expert_out, position, weight, n, k, dim, y,
                                                                       accumulate);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

}  // namespace slimkv::cuda
