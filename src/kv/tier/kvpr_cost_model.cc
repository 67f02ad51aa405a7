#include "kv/tier/kvpr_cost_model.h"

#include <algorithm>
#include <cmath>

namespace slimkv {

double KvprCostModel::layer_seconds(long l, long s) const {
  const double x = double(l) * x_bytes_per_token / link_bytes_per_s;
  const double recompute = double(l) * recompute_flops_per_token / gemm_flops_per_s;
  const double kv = double(s - l) * kv_bytes_per_token / link_bytes_per_s;
  switch (overlap) {
    case Overlap::kXFirst: return x + std::max(recompute, kv);
    case Overlap::kXResident: return std::max(recompute, kv);
    case Overlap::kPipelined: return std::max(recompute, x + kv);
  }
  return 0;
}

long KvprCostModel::best_split(long s) const {
  if (s <= 0) return 0;
  // Per token, in seconds: moving X (where it is paid), recomputing, moving KV.
  const double x = overlap == Overlap::kXResident ? 0.0 : x_bytes_per_token / link_bytes_per_s;
  const double recompute = recompute_flops_per_token / gemm_flops_per_s;
  const double kv = kv_bytes_per_token / link_bytes_per_s;
  // Below the crossing the link's side falls with l (slope x − kv) only when X is cheaper than KV.
  if (x >= kv) return 0;
  // The GPU's side (slope r, or x + r for kXFirst) meets the link's: kXFirst and kXResident at
  // l·r = (s − l)·kv, kPipelined at l·r = l·x + (s − l)·kv.
  const double crossing = overlap == Overlap::kPipelined ? double(s) * kv / (kv - x + recompute)
                                                         : double(s) * kv / (kv + recompute);
  const long below = std::clamp(long(std::floor(crossing)), 0L, s), above = std::min(below + 1, s);
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
