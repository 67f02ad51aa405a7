// ZACK in the forward pass (ZACK §5.1): per (layer, KV head), a Q–K basis and a V–W_O basis from the
// calibration, truncated to the head's ranks.
//   - V–W_O: folded into the weights once, at load: W_V's rows of head g become B_g[:r] · W_V,g (and the
//     bias likewise), and o_proj's columns of every query head h in g become W_O,h · B_g[:r]ᵀ. Values then
//     come out of the projection already reduced, attention averages them in the reduced space, and
//     o_proj reads that space directly: no decompression anywhere (Lemma 2).
//   - Q–K: RoPE rotates q and k by position after the projection, so the basis cannot be folded into
//     W_Q / W_K ("Rotary embedding", §5.1); q and k are rotated and truncated after RoPE instead.
// Folded matrices are FP32 and owned here (the checkpoint's are memory-mapped and stay untouched).
#pragma once

#include <memory>
#include <vector>

#include "slimkv/zack_calibration.h"
#include "slimkv/zack_ranks.h"
#include "model/llama_weights.h"
#include "model/model_config.h"

namespace slimkv {

class ZackProjection {
 public:
  // Folds the V–W_O bases into `weights` (its wv, bv and wo then point into the returned object, which
  // must outlive them). The calibration and ranks must match the config's layers, KV heads and head_dim.
  static std::unique_ptr<ZackProjection> fold(const ZackCalibration& calibration, const ZackRanks& ranks,
                                              const ModelConfig& config, LlamaWeights& weights);

  // In place, after RoPE: q [n, num_heads, head_dim] → [n, Σ_h k_rank(layer, h's KV head)] and
  // k [n, num_kv_heads, head_dim] → [n, Σ_g k_rank(layer, g)], each head's vector B_g[:r] x.
  void project_qk(int layer, float* q, float* k, int n) const;

  const ZackRanks& ranks() const { return ranks_; }
  // Each KV head g's B_g[:k_rank] [k_rank, head_dim] of the layer, back to back (what project_qk applies).
  const std::vector<float>& qk_bases(int layer) const { return layers_[size_t(layer)].qk_bases; }

  // The folded W_V, b_V and W_O at the model's full width, for a backend whose GEMMs keep the model's
  // shapes (CUDA): head g's rows of W_V [num_kv_heads · head_dim, hidden] are its v_rank folded rows then
  // zeros, and query head h's columns of W_O [hidden, num_heads · head_dim] its v_rank folded columns then
  // zeros; values come out reduced, padded with zeros, and o_proj reads only the reduced dims.
  std::vector<float> full_width_wv(int layer) const;
  std::vector<float> full_width_bv(int layer, const std::vector<float>& folded_bv) const;
  std::vector<float> full_width_wo(int layer) const;

  // For measuring ZACK against full-width attention (eval's fidelity task), outside the forward pass:
  // v [n, num_kv_heads, head_dim] → [n, Σ_g v_rank(layer, g)] in place (what the folded W_V gives), and
  // an attention output in the reduced V space [n, Σ_h v_rank] lifted back to [n, num_heads, head_dim]
  // (what the folded W_O reads, before o_proj).
  void project_v(int layer, float* v, int n) const;
  void lift_output(int layer, const float* reduced, int n, float* out) const;

 private:
  struct Layer {
    std::vector<float> qk_bases;  // per KV head g, B_g[:k_rank] [k_rank, head_dim], back to back
    std::vector<float> vw_bases;  // per KV head g, the V–W_O basis B_g[:v_rank] [v_rank, head_dim], likewise
    std::vector<float> wv;        // [Σ_g v_rank, hidden]
    std::vector<float> wo;        // [hidden, Σ_h v_rank]
  };
  ZackProjection(const ZackRanks& ranks, int num_heads, int head_dim) : ranks_(ranks), num_heads_(num_heads), head_dim_(head_dim) {}
  // rows [n, heads · head_dim] → [n, Σ_h rank], head h reading KV head h / heads_per_basis's basis (of
  // `bases`, ranks `k_ranks` or the V ranks).
  void project_rows(const std::vector<float>& bases, bool k_ranks, int layer_index, float* rows, int n, int heads,
                    int heads_per_basis) const;

  ZackRanks ranks_;
  int num_heads_, head_dim_;
  int hidden_ = 0;
  std::vector<Layer> layers_;
};

}  // namespace slimkv
