#include "backend/cuda/expert_routing.h"

#include <cmath>

#include "backend/cuda/cuda_check.h"

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

__global__ void route_kernel(const float* logits, int n, int experts, int k, bool normalize_top_k, int32_t* expert_of,
                             float* expert_weight) {
  extern __shared__ float probabilities[];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int row = int(blockIdx.x) * kRoutingWarps + warp;
  if (row >= n) return;  // the whole warp: nothing below waits on other warps
  float* p = probabilities + size_t(warp) * experts;
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
    // No expert at all only where the logits hold a NaN: `experts` is written, which the caller refuses.
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
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    const size_t choice = t * size_t(k) + size_t(j);
    sum += weight[choice] * expert_out[size_t(position[choice]) * dim + c];
  }
  y[i] = accumulate ? y[i] + sum : sum;
}

}  // namespace

Status route_to_experts(const float* router_logits, int n, int experts, int k, bool normalize_top_k, int32_t* expert_of,
                        float* expert_weight) {
  if (experts < 1 || experts > kMaxRoutedExperts || k < 1 || k > experts) {
    return error("expert routing: ", k, " of ", experts, " experts a row (expected 1 <= k <= experts <= ", kMaxRoutedExperts,
                 ")");
  }
  if (n == 0) return Status::ok();
  const unsigned blocks = unsigned((n + kRoutingWarps - 1) / kRoutingWarps);
  route_kernel<<<blocks, kRoutingWarps * 32, size_t(kRoutingWarps) * size_t(experts) * sizeof(float)>>>(
      router_logits, n, experts, k, normalize_top_k, expert_of, expert_weight);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
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
