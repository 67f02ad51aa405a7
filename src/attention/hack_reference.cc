#include "attention/hack_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/hack_operands.h"

namespace slimkv {

void attend_hack_block_reference(const QuantizedBlockLayout& layout, const uint8_t* block, const QueryTile& tile,
                                 AttentionPartials& partials, int first_partial) {
  const int tokens = layout.shape.block_tokens, k_dim = layout.shape.k_dim, v_dim = layout.shape.v_dim;
  std::vector<float> k(size_t(tokens) * k_dim), v(size_t(tokens) * v_dim);
  dequantize_block(layout, block, k.data(), v.data());
  std::vector<uint8_t> codes(size_t(std::max(k_dim, tokens)));
  std::vector<float> q(static_cast<size_t>(k_dim)), p(static_cast<size_t>(tokens));
  for (int i = 0; i < tile.n_queries; ++i) {
    const int visible = tile.visible[i];
    if (visible <= 0) continue;
    const float* query = tile.q + size_t(i) * k_dim;
    for (int part = 0; part < layout.k_partitions; ++part) {  // Q' per K partition, dequantized
      const int first = part * layout.k_partition, dims = layout.k_partition_dims(part);
      const Operand8 op = quantize_operand8(query + first, dims, codes.data());
      for (int d = 0; d < dims; ++d) q[size_t(first + d)] = op.min + op.scale * float(codes[size_t(d)]);
    }
    std::vector<double> scores(static_cast<size_t>(visible));
    double block_max = -std::numeric_limits<double>::infinity();
    for (int t = 0; t < visible; ++t) {
      double dot = 0;
      for (int d = 0; d < k_dim; ++d) dot += double(q[size_t(d)]) * double(k[size_t(t) * k_dim + d]);
      scores[size_t(t)] = dot;
      block_max = std::max(block_max, dot);
    }
    const int index = first_partial + i;
    partials.rescale(index, std::max(partials.max(index), float(block_max)));
    const float running_max = partials.max(index);
    std::fill(p.begin(), p.end(), 0.0f);  // tokens the query may not see weigh 0
    for (int t = 0; t < visible; ++t) p[size_t(t)] = float(std::exp(scores[size_t(t)] - double(running_max)));
    const Operand8 op = quantize_operand8(p.data(), tokens, codes.data());  // P' per block, dequantized
    double sum = 0;
    std::vector<double> acc(size_t(v_dim), 0.0);
    for (int t = 0; t < tokens; ++t) {
      const double weight = double(op.min) + double(op.scale) * double(codes[size_t(t)]);
      sum += weight;
      for (int c = 0; c < v_dim; ++c) acc[size_t(c)] += weight * double(v[size_t(t) * v_dim + c]);
    }
    partials.sum(index) += float(sum);
    float* out = partials.acc(index);
    for (int c = 0; c < v_dim; ++c) out[c] += float(acc[size_t(c)]);
  }
}

}  // namespace slimkv
