// The attention partial of a query over some of the tokens (the flash-decoding state):
//     max = max_j s_j,   sum = Σ_j exp(s_j - max),   acc[c] = Σ_j exp(s_j - max) · v_j[c]
// where s_j is the (scaled) score of token j. Partials over disjoint token sets merge exactly, which
// is what lets every block be read by its own codec kernel (and lets work split over blocks); the
// attention output is acc / sum.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace slimkv {

// n_queries partials, each with a v_dim accumulator. An empty partial has max = -inf and sum = 0.
class AttentionPartials {
 public:
  AttentionPartials(int n_queries, int v_dim) { reset(n_queries, v_dim); }

  void reset(int n_queries, int v_dim) {
    n_queries_ = n_queries;
    v_dim_ = v_dim;
    max_.assign(size_t(n_queries), -std::numeric_limits<float>::infinity());
    sum_.assign(size_t(n_queries), 0.0f);
    acc_.assign(size_t(n_queries) * size_t(v_dim), 0.0f);
  }

  int n_queries() const { return n_queries_; }
  int v_dim() const { return v_dim_; }
  float& max(int i) { return max_[size_t(i)]; }
  float& sum(int i) { return sum_[size_t(i)]; }
  float* acc(int i) { return acc_.data() + size_t(i) * size_t(v_dim_); }
  float max(int i) const { return max_[size_t(i)]; }
  float sum(int i) const { return sum_[size_t(i)]; }
  const float* acc(int i) const { return acc_.data() + size_t(i) * size_t(v_dim_); }

  // Rescales partial i to a new running max (>= its max) and returns the factor applied to new terms'
  // reference: after this, terms must be added as exp(s - new_max).
  void rescale(int i, float new_max) {
    float& m = max_[size_t(i)];
    if (new_max == m) return;
    const float factor = std::isinf(m) ? 0.0f : std::exp(m - new_max);
    sum_[size_t(i)] *= factor;
    float* a = acc(i);
    for (int c = 0; c < v_dim_; ++c) a[c] *= factor;
    m = new_max;
  }

  // Merges partial `j` of `other` into partial `i` of this (both over disjoint tokens).
  void merge(int i, const AttentionPartials& other, int j) {
    if (other.sum(j) == 0.0f) return;  // nothing seen there
    const float new_max = std::fmax(max(i), other.max(j));
    rescale(i, new_max);
    const float factor = std::exp(other.max(j) - new_max);
    sum_[size_t(i)] += factor * other.sum(j);
    float* a = acc(i);
    const float* b = other.acc(j);
    for (int c = 0; c < v_dim_; ++c) a[c] += factor * b[c];
  }

  // Writes acc / sum of partial i (zeros if it saw no token).
  void write_output(int i, float* out) const {
    const float s = sum(i);
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    const float* a = acc(i);
    for (int c = 0; c < v_dim_; ++c) out[c] = a[c] * inv;
  }

 private:
  int n_queries_ = 0;
  int v_dim_ = 0;
  std::vector<float> max_, sum_, acc_;
};

// A tile of queries that share one KV head (the GQA group, over one or more positions), and how many
// tokens of the block at hand each may see (causality: a query sees tokens at positions <= its own).
struct QueryTile {
  const float* q = nullptr;        // [n_queries, k_dim], already multiplied by the softmax scale
  int n_queries = 0;
  const int* visible = nullptr;    // [n_queries]: query i sees tokens [0, visible[i]) of the block
  const uint8_t* prepared = nullptr;  // what the codec's prepare_queries made of q for this tile
};

}  // namespace slimkv
