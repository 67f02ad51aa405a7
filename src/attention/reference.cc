#include "attention/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace slimkv {

void attention_reference(const float* q, int n_queries, const int* q_positions, const float* k, const float* v,
                         int n_keys, int num_heads, int num_kv_heads, int k_dim, int v_dim, float scale,
                         float* out, int window_tokens) {
  const int group = num_heads / num_kv_heads;
  std::vector<double> scores(size_t(std::max(n_keys, 1)));
  for (int i = 0; i < n_queries; ++i) {
    const int seen = std::min(n_keys, q_positions[i] + 1);
    const int first = window_tokens > 0 ? std::max(0, q_positions[i] - window_tokens + 1) : 0;
    for (int h = 0; h < num_heads; ++h) {
      const int g = h / group;
      const float* qi = q + (size_t(i) * num_heads + h) * k_dim;
      double max_score = -std::numeric_limits<double>::infinity();
      for (int j = first; j < seen; ++j) {
        const float* kj = k + (size_t(j) * num_kv_heads + g) * k_dim;
        double dot = 0;
        for (int c = 0; c < k_dim; ++c) dot += double(qi[c]) * double(kj[c]);
        scores[size_t(j)] = dot * scale;
        max_score = std::max(max_score, scores[size_t(j)]);
      }
      double total = 0;
      for (int j = first; j < seen; ++j) total += (scores[size_t(j)] = std::exp(scores[size_t(j)] - max_score));
      float* o = out + (size_t(i) * num_heads + h) * v_dim;
      for (int c = 0; c < v_dim; ++c) {
        double acc = 0;
        for (int j = first; j < seen; ++j) acc += scores[size_t(j)] * double(v[(size_t(j) * num_kv_heads + g) * v_dim + c]);
        o[c] = seen > first ? float(acc / total) : 0.0f;
      }
    }
  }
}

}  // namespace slimkv
