// KVPR's split (../shared/papers/004, §3.2, Eqs. 6–11): of a layer's s tokens of KV that live in host
// memory, the first l are recomputed on the GPU from their attention inputs X (K = X·W_K, V = X·W_V)
// while the KV of the other s − l streams in over the host link. Per token: x and kv seconds to move X
// and the KV over the link, r seconds to recompute (2 · hidden · 2·kv_dim FLOPs, Eq. 8 with GQA).
// How X's transfer overlaps decides the time of one layer:
//
//   kXFirst      t(l) = l·x + max(l·r, (s − l)·kv)     Eq. 10: X crosses before recomputing starts
//   kXResident   t(l) = max(l·r, (s − l)·kv)           Eq. 10 without its first term (X on the GPU)
//   kPipelined   t(l) = max(l·r, l·x + (s − l)·kv)     X and KV share the link, and X arrives while
//                                                      the unit before computes (our tiers' pipeline)
//
// Each is a linear program in one variable whose optimum is where the GPU's and the link's sides
// cross, or an end. Recomputation pays only when moving X is cheaper than moving the KV it replaces
// (x < kv, unless X is resident): GQA models' X is larger than their KV (Llama-3-8B: 8 KB vs 4 KB a
// token and layer), so there l = 0, plain offload; multi-head ones' is half (Llama-2-7B).
#pragma once

namespace slimkv {

struct KvprCostModel {
  enum class Overlap { kXFirst, kXResident, kPipelined };

  // Measured on the machine (the profiler): host-to-device bytes/s (v_com) and GEMM FLOP/s (v_gpu).
  double link_bytes_per_s = 0;
  double gemm_flops_per_s = 0;
  // Per token of the batch (b folded in): X's bytes, the stored KV's bytes (what the codec keeps),
  // and the FLOPs that recompute its K and V.
  double x_bytes_per_token = 0;
  double kv_bytes_per_token = 0;
  double recompute_flops_per_token = 0;
  Overlap overlap = Overlap::kPipelined;

  // t(l) for split l of s tokens, in seconds.
  double layer_seconds(long l, long s) const;
  // The l in [0, s] minimizing t, from the closed form (the crossing of the two sides, or an end).
  long best_split(long s) const;
  // The same by trying every l (the check of the closed form).
  long best_split_by_sweep(long s) const;
};

}  // namespace slimkv
