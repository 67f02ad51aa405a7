// The online-softmax rule every CUDA attention kernel and merge shares (attention/partial.h's on the
// CPU; FlashInfer's attention/state.cuh): scores are kept in base 2 (exp2f is one instruction), a
// partial is (running max m, sum of exp2(s − m), Σ exp2(s − m)·v), and moving a partial to a new max
// rescales it by exp2(m_old − m_new).
//
// The one rule for −∞: a max of −∞ means nothing was seen (an empty partial, or every score masked),
// and it is rescaled against 0 instead, so that exp2(−∞ − 0) gives 0 where −∞ − (−∞) would give NaN.
// Two empty partials merge into an empty one (max −∞, sum 0, weighted V 0), and an empty partial adds
// nothing to another.
#pragma once

#include <cmath>

namespace slimkv::cuda {

// The max that exp2 arguments are taken against: max itself, or 0 when it is −∞ (see above).
__device__ __forceinline__ float softmax_reference(float max) { return max == -INFINITY ? 0.0f : max; }

}  // namespace slimkv::cuda
