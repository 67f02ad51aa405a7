// A ZACK calibration (ZACK §4.3, Fig. 9): for every layer and KV head group, two orthonormal bases
// found offline by SVD, each with its singular values in descending order:
//   qk: shared by the post-RoPE keys of the head and the post-RoPE queries of every query head that
//       reads it (stacked along the sequence), so q·k is unchanged by the rotation (Lemma 2);
//   vw: shared by the values and the o_proj columns of those query heads, so V's rotation folds into
//       W_V and its transpose into W_O (§4.2, §5.1).
// Keeping the first r rows of a basis keeps the r directions of largest singular value (§5.2).
//
// The file is safetensors (written by kv/zack/calibration.cc, read with tensor/safetensors.h):
//   qk_basis, vw_basis                     F32 [num_layers, num_kv_heads, head_dim, head_dim]
//                                          (row i = the i-th singular direction)
//   qk_singular_values, vw_singular_values F32 [num_layers, num_kv_heads, head_dim]
//   __metadata__: format, model_identity (model/model_identity.h), calibration_tokens, source
// A file made for another model is refused: its model_identity differs from the loading model's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "slimkv/status.h"

namespace slimkv {

inline constexpr const char* kZackCalibrationFormat = "slimkv-zack-calibration-1";

struct ZackCalibration {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  std::string model_identity;     // of the model the statistics came from
  int64_t calibration_tokens = 0; // tokens the statistics were gathered over
  std::string source;             // what text they came from, for people
  std::vector<float> qk_basis, vw_basis;                      // [layers, kv heads, head_dim, head_dim]
  std::vector<float> qk_singular_values, vw_singular_values;  // [layers, kv heads, head_dim], descending

  const float* qk_basis_of(int layer, int head) const { return qk_basis.data() + matrix_offset(layer, head); }
  const float* vw_basis_of(int layer, int head) const { return vw_basis.data() + matrix_offset(layer, head); }
  const float* qk_singular_values_of(int layer, int head) const {
    return qk_singular_values.data() + vector_offset(layer, head);
  }
  const float* vw_singular_values_of(int layer, int head) const {
    return vw_singular_values.data() + vector_offset(layer, head);
  }

  Status write(const std::string& path) const;
  // Reads and checks a calibration; when expected_identity is not empty, a file made for another model
  // is an error naming both models.
  static Expected<ZackCalibration> load(const std::string& path, const std::string& expected_identity = "");

 private:
  size_t vector_offset(int layer, int head) const { return (size_t(layer) * num_kv_heads + head) * size_t(head_dim); }
  size_t matrix_offset(int layer, int head) const { return vector_offset(layer, head) * size_t(head_dim); }
};

// How much two calibrations' rotations differ (ZACK §4.3, Tables 4–5): ε = mean |element| of a's
// bases, δ = mean |a − b| element-wise, averaged over layers and heads; §6.6 asks δ/ε < 0.5%.
// A singular direction is defined up to its sign, so each of b's rows is first given the sign that
// agrees with a's (positive dot product). Where singular values are close (a flat spectrum, as in
// small models) the directions among them are ill-defined and δ is large even when the subspaces
// agree, so the energy measure says what ZACK depends on: of b's stack energy (Σ s²) in b's own
// leading head_dim/2 directions, the fraction that a's leading head_dim/2 directions capture (1 = as good).
struct RotationAgreement {
  double qk_epsilon = 0, qk_delta = 0, qk_energy_captured = 0;
  double vw_epsilon = 0, vw_delta = 0, vw_energy_captured = 0;
};
Expected<RotationAgreement> compare_rotations(const ZackCalibration& a, const ZackCalibration& b);

}  // namespace slimkv
