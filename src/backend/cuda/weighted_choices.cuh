// Σ_j weight_j · expert_out[place_j, c] over a row's k choices, the j in order: the mixture's weighted
// sum as one device function for the kernels that make it (expert_routing.cu add_weighted_rows, and the
// experts' grouped W_down product that sums as it finishes, expert_gemv.cu), each product and sum
// rounded as written (the _rn intrinsics: no contraction the compiler might choose in one kernel and not
// the other), so the two give the same bits. expert_out is read past L1 (__ldcg): the grouped product's
// rows come from other CTAs of the same launch.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace slimkv::cuda {

// position: each choice's place (-1: no expert, which makes the sum NaN); choices t·k .. t·k + k - 1.
__device__ inline float weighted_choices_sum(const float* expert_out, const int32_t* position, const float* weight,
                                             size_t t, int k, size_t c, size_t dim) {
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    const size_t choice = t * size_t(k) + size_t(j);
    const int32_t place = position[choice];
    sum = __fadd_rn(sum, place < 0 ? NAN : __fmul_rn(weight[choice], __ldcg(expert_out + size_t(place) * dim + c)));
  }
  return sum;
}

}  // namespace slimkv::cuda
