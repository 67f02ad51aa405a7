#include "kv/select/pq_codebook.h"

#include <cstring>

#include "backend/cpu/vec_ops.h"
#include "kv/select/kmeans.h"

namespace slimkv {

void PqCodebook::train(const float* vectors, int n, int max_iters, uint64_t seed) {
  const int k = centroids_per_space(), d = sub_dim();
  centroids_.resize(size_t(m_) * k * d);
  for (int s = 0; s < m_; ++s) {
    uint64_t space_seed = seed ^ (uint64_t(s + 1) * 0x9e3779b97f4a7c15ull);
    next_uniform(space_seed);  // stir, so seeds s and s+1 do not start from neighbouring states
    const std::vector<float> c = kmeans(vectors + size_t(s) * d, n, d, dim_, k, max_iters, space_seed);
    std::memcpy(centroids_.data() + size_t(s) * k * d, c.data(), c.size() * sizeof(float));
  }
}

void PqCodebook::encode(const float* vectors, int n, uint8_t* codes) const {
  const int k = centroids_per_space(), d = sub_dim();
  thread_local std::vector<int> nearest;
  nearest.resize(size_t(n));
  for (int s = 0; s < m_; ++s) {
    assign_nearest(vectors + size_t(s) * d, n, d, dim_, centroids_.data() + size_t(s) * k * d, k, nearest.data());
    for (int i = 0; i < n; ++i) codes[size_t(i) * m_ + s] = uint8_t(nearest[size_t(i)]);
  }
}

void PqCodebook::score_table(const float* q, float* table) const {
  const int k = centroids_per_space(), d = sub_dim();
  for (int s = 0; s < m_; ++s) {
    for (int c = 0; c < k; ++c) {
      table[size_t(s) * k + c] = dot(q + size_t(s) * d, centroids_.data() + (size_t(s) * k + c) * d, size_t(d));
    }
  }
}

void PqCodebook::score_codes(const float* table, const uint8_t* codes, int n, float* scores) const {
  const int k = centroids_per_space();
  for (int i = 0; i < n; ++i) {
    float sum = 0.0f;
    for (int s = 0; s < m_; ++s) sum += table[size_t(s) * k + codes[size_t(i) * m_ + s]];
    scores[i] = sum;
  }
}

void PqCodebook::reconstruct(const uint8_t* code, float* out) const {
  const int k = centroids_per_space(), d = sub_dim();
  for (int s = 0; s < m_; ++s) {
    std::memcpy(out + size_t(s) * d, centroids_.data() + (size_t(s) * k + code[s]) * d, size_t(d) * sizeof(float));
  }
}

}  // namespace slimkv
