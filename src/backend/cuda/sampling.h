// Choosing the next token on the GPU from each row of logits, so that a decode step brings back token
// ids, not [batch, vocab] logits: greedy (argmax), and sampling at a temperature from the top-k
// logits and the top-p probability mass, as engine/sampler.h does on the CPU (the same distribution;
// the draws differ, as the two walk the kept tokens in different orders).
#pragma once

#include <cstdint>

#include "slimkv/status.h"

namespace slimkv::cuda {

// How one row is sampled. temperature <= 0: greedy. top_k 0: no limit (ties at the k-th largest
// logit are all kept); top_p 1: no limit. The draw is counter_uniform(seed, counter) (util/random.h):
// reproducible, e.g. counter = the sequence's position.
struct RowSampling {
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  uint64_t counter = 0;
};

// out[t] = the index of the largest of logits[t, :] (the first of equals, as the CPU sampler).
Status argmax_rows(const float* logits, int n, int vocab, int32_t* out);

// out[t] = a token drawn for row t of logits [n, vocab] as rows[t] (a device array) says.
Status sample_rows(const float* logits, int n, int vocab, const RowSampling* rows, int32_t* out);

}  // namespace slimkv::cuda
