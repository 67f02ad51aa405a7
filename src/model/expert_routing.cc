#include "model/expert_routing.h"

#include <algorithm>
#include <cmath>

namespace slimkv {

void route_to_experts(const MoeConfig& moe, int n, float* router, int* expert_of, float* expert_weight) {
  const int experts = int(moe.num_experts), k = int(moe.experts_per_token);
  for (int t = 0; t < n; ++t) {
    float* p = router + size_t(t) * experts;
    const float max = *std::max_element(p, p + experts);
    float sum = 0;
    for (int e = 0; e < experts; ++e) sum += p[e] = std::exp(p[e] - max);
    for (int e = 0; e < experts; ++e) p[e] /= sum;
    int* chosen = expert_of + size_t(t) * k;
    float* weight = expert_weight + size_t(t) * k;
    for (int j = 0; j < k; ++j) {  // the k largest, the lower index first among equals (as torch.topk)
      int best = -1;
      for (int e = 0; e < experts; ++e) {
        if (std::find(chosen, chosen + j, e) == chosen + j && (best < 0 || p[e] > p[best])) best = e;
      }
      chosen[j] = best;
      weight[j] = p[best];
    }
    if (moe.normalize_top_k) {
      float top = 0;
      for (int j = 0; j < k; ++j) top += weight[j];
      for (int j = 0; j < k; ++j) weight[j] /= top;
    }
  }
}

}  // namespace slimkv
