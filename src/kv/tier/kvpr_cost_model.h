// KVPR's split (../shared/papers/004, §3.2, Eqs. 6–11): of a layer's s tokens of KV that live in host
// memory, the first l are recomputed on the GPU from their attention inputs X (K = X·W_K, V = X·W_V)
// while the KV of the other s − l streams in over the host link. The time of one layer is
//
//   t(l) = [M_X(l) / v_com] + max(N_KV(l) / v_gpu, M_KV(s − l) / v_com)                   (Eq. 10)
//
// where the bracketed term (X itself crossing the link before the recomputation can start) is paid in
// the column-by-column schedule and not in the row-by-row one. The best l is where the recomputation
// and the transfer take equally long, when moving X is cheaper than moving the KV it replaces; else
// l = 0 (plain offload). Note for GQA models: X holds hidden_size values per token, K and V together
// 2·kv_dim; Llama-3-8B's X is twice its KV, so there KVPR only pays in the row-by-row schedule.
#pragma once

namespace slimkv {

struct KvprCostModel {
  // Measured on the machine (the profiler): host-to-device bytes/s (v_com) and GEMM FLOP/s (v_gpu).
  double link_bytes_per_s = 0;
  double gemm_flops_per_s = 0;
  // Per token of the batch (b folded in): X's bytes, the stored KV's bytes (what the codec keeps),
  // and the FLOPs that recompute its K and V (2 · hidden · 2·kv_dim, Eq. 8 with GQA).
  double x_bytes_per_token = 0;
  double kv_bytes_per_token = 0;
  double recompute_flops_per_token = 0;
  bool x_crosses_link = true;  // column-by-column: X[0:l] is transferred first (Eq. 10's first term)

  // Eq. 10 for split l of s tokens, in seconds.
  double layer_seconds(long l, long s) const;
  // The l in [0, s] minimizing Eq. 10, from the closed form (the two sides of the max cross at
  // l* = s · kv / (kv + recompute): t falls before it when X is cheaper to move than KV, rises after).
  long best_split(long s) const;
  // The same by trying every l (the check of the closed form).
  long best_split_by_sweep(long s) const;
};

}  // namespace slimkv
