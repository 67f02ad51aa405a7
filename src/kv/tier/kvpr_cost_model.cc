#include "kv/tier/kvpr_cost_model.h"

#include <algorithm>
#include <cmath>

namespace slimkv {

double KvprCostModel::layer_seconds(long l, long s) const {
  const double x_transfer = x_crosses_link ? double(l) * x_bytes_per_token / link_bytes_per_s : 0.0;
  const double recompute = double(l) * recompute_flops_per_token / gemm_flops_per_s;
  const double kv_transfer = double(s - l) * kv_bytes_per_token / link_bytes_per_s;
  return x_transfer + std::max(recompute, kv_transfer);
}

long KvprCostModel::best_split(long s) const {
  // Per token, in seconds: moving X, recomputing, moving KV.
  const double x = x_crosses_link ? x_bytes_per_token / link_bytes_per_s : 0.0;
  const double recompute = recompute_flops_per_token / gemm_flops_per_s;
  const double kv = kv_bytes_per_token / link_bytes_per_s;
  // Below the crossing t(l) = x·l + kv·(s − l) has slope x − kv; above it (x + recompute)·l rises.
  if (x >= kv || s <= 0) return 0;
  const double crossing = double(s) * kv / (kv + recompute);
  const long below = std::clamp(long(std::floor(crossing)), 0L, s), above = std::clamp(below + 1, 0L, s);
  return layer_seconds(above, s) < layer_seconds(below, s) ? above : below;
}

long KvprCostModel::best_split_by_sweep(long s) const {
  long best = 0;
  for (long l = 1; l <= s; ++l) {
    if (layer_seconds(l, s) < layer_seconds(best, s)) best = l;
  }
  return best;
}

}  // namespace slimkv
