// ZACK's per-head ranks (§5.2): how many leading singular directions each (layer, KV head) keeps, for
// Q–K (the stored key dims) and V–W_O (the stored value dims).
#pragma once

#include <string>
#include <vector>

#include "slimkv/zack_calibration.h"

namespace slimkv {

// The `zack` stage of a KV spec: zack:r=0.05 | zack:rate=0.5, with vr=R, align=N and calib=FILE.
struct ZackOptions {
  double removal_rate = 0.05;       // r of Eq. 6, shared by every head
  // vr: V–W_O's own removal rate; < 0: r (the paper's one r for both). The V–W_O truncation is where
  // most of the quality goes on small models (issue 7's note), so keys can be cut deeper than values.
  double v_removal_rate = -1.0;
  double target_compression = 0.0;  // rate: overall KV compression wanted, mapped to r by F_p; 0 = use r
  int align = 1;                    // ranks rounded up to a multiple (kernel friendliness), at most head_dim
  std::string calibration_path;     // empty: <model dir>/zack.safetensors
  std::string describe() const;     // "zack:r=0.05,align=1,calib=..." (canonical)
};

// Eq. 6: the fewest leading dims k such that the removed singular values s_k..s_{d-1} sum to at most
// r of the total; then rounded up to a multiple of `align` (at most head_dim). r = 0 keeps every dim
// (the rotation alone is exact, Lemma 2); at least one dim is always kept.
// singular_values: [head_dim], descending.
int zack_rank(const float* singular_values, int head_dim, double removal_rate, int align);

struct ZackRanks {
  int num_layers = 0, num_kv_heads = 0, head_dim = 0;
  double removal_rate = 0.0;              // the r they follow from (Q–K)
  double v_removal_rate = 0.0;            // and V–W_O's
  std::vector<int> k_ranks, v_ranks;      // [num_layers * num_kv_heads]: Q–K and V–W_O ranks
  int k_rank(int layer, int head) const { return k_ranks[size_t(layer) * num_kv_heads + size_t(head)]; }
  int v_rank(int layer, int head) const { return v_ranks[size_t(layer) * num_kv_heads + size_t(head)]; }
  // 1 − stored dims / full dims: the KV compression these ranks give (before any quantization).
  double kv_compression() const;
};

// Every head's ranks (Eq. 6): Q–K dims for removal_rate, V–W_O dims for v_removal_rate.
ZackRanks select_zack_ranks(const ZackCalibration& calibration, double removal_rate, double v_removal_rate, int align);

// F_p (§5.2): the ranks of the smallest r whose overall compression reaches `target_compression`
// (bisection: compression only grows with r). Fails when even one dim per head falls short.
Expected<ZackRanks> ranks_for_compression(const ZackCalibration& calibration, double target_compression, int align);

// The ranks the options ask for: by r (and vr), or by target compression.
Expected<ZackRanks> select_zack_ranks(const ZackCalibration& calibration, const ZackOptions& options);

}  // namespace slimkv
