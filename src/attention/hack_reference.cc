#include "attention/hack_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/hack_operands.h"
#include "util/half.h"

namespace slimkv {
namespace {

// Min and scale of a sealed value, from the block's meta sections.
struct Affine {
  double min, scale;
};
Affine k_affine(const QuantizedBlockLayout& layout, const uint8_t* block, int t, int d) {
  const size_t slot = layout.k_meta_slot(t, d);
  return {fp16_to_float(reinterpret_cast<const uint16_t*>(block + layout.k_mins)[slot]),
          fp16_to_float(reinterpret_cast<const uint16_t*>(block + layout.k_scales)[slot])};
}
Affine v_affine(const QuantizedBlockLayout& layout, const uint8_t* block, int t, int c) {
  const size_t slot = layout.v_meta_slot(t, c);
  return {fp16_to_float(reinterpret_cast<const uint16_t*>(block + layout.v_mins)[slot]),
          fp16_to_float(reinterpret_cast<const uint16_t*>(block + layout.v_scales)[slot])};
}

// x quantized to 8 bits per run of `run` values (quantize_operand8), dequantized.
std::vector<float> through_operand8(const std::vector<float>& x, int run) {
  std::vector<float> out(x.size());
  std::vector<uint8_t> codes(x.size());
  for (size_t first = 0; first < x.size(); first += size_t(run)) {
    const int n = int(std::min(x.size() - first, size_t(run)));
    const Operand8 op = quantize_operand8(x.data() + first, n, codes.data() + first);
    for (int i = 0; i < n; ++i) out[first + size_t(i)] = op.min + op.scale * float(codes[first + size_t(i)]);
  }
  return out;
}

}  // namespace

// Scores. K per token (HACK): q · k with Q' per K partition and k = min + scale · k'. K per channel:
//   q · k_t = Σ_d q_d (s_d k'_td + m_d) = Σ_d (q_d s_d) k'_td + Σ_d q_d m_d
// with u = q ∘ s quantized to signed 8-bit codes per K partition and token group (the scales are the
// group's) in the range its factors bound, |u_d| ≤ max|q| · max s: u'_d = lrint(q̂_d ŝ_d),
// q̂ = q · 127 / max|q|, ŝ = s / max s, u ≈ (max|q| max s / 127) u' (hack_operands.h); the constant
// Σ_d q_d m_d exact.
// Output. V per channel (HACK): P' per block times v = min + scale · v'. V per token:
//   Σ_t p_t (s_t v'_tc + m_t) = Σ_t (p_t s_t) v'_tc + Σ_t p_t m_t
// with w = p ∘ s ≥ 0 quantized to 8 bits over the block's tokens (per column group: the scales are the
// group's) in [0, max w]: w'_t = lrint(w_t · 255 / max w); the constant Σ_t p_t m_t and the
// denominator Σ_t p_t exact.
void attend_hack_block_reference(const QuantizedBlockLayout& layout, const uint8_t* block, const QueryTile& tile,
                                 AttentionPartials& partials, int first_partial) {
  const QuantizationConfig& config = layout.config;
  const int tokens = layout.shape.block_tokens, k_dim = layout.shape.k_dim, v_dim = layout.shape.v_dim;
  std::vector<float> k(size_t(tokens) * k_dim), v(size_t(tokens) * v_dim);
  dequantize_block(layout, block, k.data(), v.data());
  std::vector<uint8_t> k_codes(size_t(tokens) * k_dim), v_codes(size_t(tokens) * v_dim);
  unpack_block_codes(layout, block, k_codes.data(), v_codes.data());
  for (int i = 0; i < tile.n_queries; ++i) {
    const int visible = tile.visible[i];
    if (visible <= 0) continue;
    const std::vector<float> query(tile.q + size_t(i) * k_dim, tile.q + size_t(i + 1) * k_dim);
    std::vector<double> scores(static_cast<size_t>(visible));
    const std::vector<float> q = through_operand8(query, layout.k_partition);  // K per token: Q' once
    for (int t = 0; t < visible; ++t) {
      double dot = 0;
      if (config.k_per_channel) {
        for (int p = 0; p < layout.k_partitions; ++p) {
          const int dim0 = p * layout.k_partition, dim1 = dim0 + layout.k_partition_dims(p);
          float q_max = 0, s_max = 0;
          for (int d = dim0; d < dim1; ++d) {
            q_max = std::max(q_max, std::fabs(query[size_t(d)]));
            s_max = std::max(s_max, float(k_affine(layout, block, t, d).scale));
          }
          const float q_factor = operand_factor(q_max, kULevels), s_factor = operand_factor(s_max, 1.0f);
          const double step = product_step(q_max, s_max, kULevels);
          for (int d = dim0; d < dim1; ++d) {
            const Affine a = k_affine(layout, block, t, d);
            const int u = product_code(query[size_t(d)] * q_factor, float(a.scale) * s_factor);
            dot += step * double(u) * double(k_codes[size_t(t) * k_dim + d]) + double(query[size_t(d)]) * a.min;
          }
        }
      } else {
        for (int d = 0; d < k_dim; ++d) dot += double(q[size_t(d)]) * double(k[size_t(t) * k_dim + d]);
      }
      scores[size_t(t)] = dot;
    }
    const int index = first_partial + i;
    partials.rescale(index, std::max(partials.max(index), float(*std::max_element(scores.begin(), scores.end()))));
    const float running_max = partials.max(index);
    std::vector<float> p(static_cast<size_t>(tokens), 0.0f);  // tokens the query may not see weigh 0
    for (int t = 0; t < visible; ++t) p[size_t(t)] = float(std::exp(scores[size_t(t)] - double(running_max)));
    double sum = 0;
    std::vector<double> acc(size_t(v_dim), 0.0);
    if (config.v_per_token) {
      for (int t = 0; t < tokens; ++t) sum += double(p[size_t(t)]);
      for (int g = 0; g < layout.v_groups; ++g) {
        const int c0 = g * layout.v_group_dims;
        std::vector<float> w(static_cast<size_t>(tokens));
        for (int t = 0; t < tokens; ++t) w[size_t(t)] = p[size_t(t)] * float(v_affine(layout, block, t, c0).scale);
        const float w_max = *std::max_element(w.begin(), w.end()), factor = operand_factor(w_max, kWLevels);
        for (int t = 0; t < tokens; ++t) {
          const double weight = double(w_max / kWLevels) * product_code(w[size_t(t)], factor);
          const double constant = double(p[size_t(t)]) * v_affine(layout, block, t, c0).min;
          for (int c = c0; c < c0 + layout.v_group_dims; ++c) {
            acc[size_t(c)] += weight * double(v_codes[size_t(t) * v_dim + c]) + constant;
          }
        }
      }
    } else {
      const std::vector<float> weights = through_operand8(p, tokens);  // P' per block
      for (int t = 0; t < tokens; ++t) {
        sum += double(weights[size_t(t)]);
        for (int c = 0; c < v_dim; ++c) acc[size_t(c)] += double(weights[size_t(t)]) * double(v[size_t(t) * v_dim + c]);
      }
    }
    partials.sum(index) += float(sum);
    float* out = partials.acc(index);
    for (int c = 0; c < v_dim; ++c) out[c] += float(acc[size_t(c)]);
  }
}

}  // namespace slimkv
