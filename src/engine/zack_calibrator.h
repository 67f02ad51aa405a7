// Gathers a ZACK calibration (slimkv/zack_calibration.h) from a model run over calibration text.
//
// Memory is bounded by streaming: instead of stacking every q/k/v vector (Fig. 9), it accumulates, per
// layer and KV head, the Gram matrices of the stacks, in FP64:
//   G_qk = Σ_t k_t k_tᵀ + Σ_t Σ_{h in group} q_{t,h} q_{t,h}ᵀ      G_vw = Σ_t v_t v_tᵀ + Σ_{h in group} W_hᵀ W_h
// (W_h: the o_proj columns of query head h, [hidden, head_dim], added once). The right singular vectors
// of a stack are the eigenvectors of its Gram matrix and its singular values the square roots of the
// eigenvalues, so the SVD needs only these head_dim² numbers per head, however many tokens were run.
// Deterministic: sums in a fixed order, eigenvectors signed so their largest component is positive.
// It observes the model's forward pass (a ForwardObserver), so it lives in engine/ beside the run that
// drives it (slimkv/zack_calibration_run.h); what the calibration is and how it is stored: the public slimkv/zack_calibration.h.
#pragma once

#include <string>
#include <vector>

#include "slimkv/zack_calibration.h"
#include "model/forward_observer.h"

namespace slimkv {

class ZackCalibrator final : public ForwardObserver {
 public:
  ZackCalibrator(int num_layers, int num_heads, int num_kv_heads, int head_dim);

  // q [n, num_heads, head_dim], k and v [n, num_kv_heads, head_dim], after RoPE (ForwardObserver).
  void on_qkv(int layer, const float* q, const float* k, const float* v, int n) override;

  // Adds W_O's part to the V–W_O stacks: o_proj [hidden, num_heads · head_dim] of `layer`, FP32.
  void add_output_projection(int layer, const float* o_proj, int hidden);

  int64_t tokens_seen() const { return tokens_seen_; }

  // The eigendecomposition of every Gram matrix (LAPACK dsyevd); fails only if LAPACK does.
  Expected<ZackCalibration> finish(const std::string& model_identity, const std::string& source) const;

 private:
  double* qk_gram(int layer, int head) { return qk_gram_.data() + gram_offset(layer, head); }
  double* vw_gram(int layer, int head) { return vw_gram_.data() + gram_offset(layer, head); }
  size_t gram_offset(int layer, int head) const {
    return (size_t(layer) * num_kv_heads_ + size_t(head)) * size_t(head_dim_) * size_t(head_dim_);
  }

  int num_layers_, num_heads_, num_kv_heads_, head_dim_;
  std::vector<double> qk_gram_, vw_gram_;  // [layers, kv heads, head_dim, head_dim], upper triangle filled
  std::vector<double> widened_;            // scratch: one call's q, k or v in FP64
  int64_t tokens_seen_ = 0;                // counted at layer 0
};

}  // namespace slimkv
