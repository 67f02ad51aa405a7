#include "kv/select/kmeans.h"

#include <cblas.h>

#include <cassert>
#include <cstring>
#include <algorithm>
#include <limits>
#include <mutex>
#include <numeric>


namespace slimkv {

double next_uniform(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53;
}

namespace {

float squared_distance(const float* a, const float* b, int dim) {
  float sum = 0.0f;
  for (int i = 0; i < dim; ++i) {
    const float d = a[i] - b[i];
    sum += d * d;
  }
  return sum;
}

// k-means++ (Arthur & Vassilvitskii 2007): each next centroid is a point drawn with probability
// proportional to its squared distance from the nearest centroid chosen so far.
void seed_plus_plus(const float* points, int n, int dim, int stride, int k, uint64_t& rng, float* centroids) {
  std::vector<float> nearest(size_t(n), std::numeric_limits<float>::max());
  int chosen = int(next_uniform(rng) * n);
  for (int c = 0; c < k; ++c) {
    std::memcpy(centroids + size_t(c) * dim, points + size_t(chosen) * stride, size_t(dim) * sizeof(float));
    double total = 0.0;
    for (int i = 0; i < n; ++i) {
      const float d = squared_distance(points + size_t(i) * stride, centroids + size_t(c) * dim, dim);
      if (d < nearest[size_t(i)]) nearest[size_t(i)] = d;
      total += nearest[size_t(i)];
    }
    if (total <= 0.0) {  // fewer distinct points than k: repeat one (its cluster stays empty)
      chosen = 0;
      continue;
    }
    double target = next_uniform(rng) * total;
    chosen = n - 1;
    for (int i = 0; i < n; ++i) {
      target -= nearest[size_t(i)];
      if (target < 0.0) {
        chosen = i;
        break;
      }
    }
  }
}

}  // namespace

int nearest_centroid(const float* x, const float* centroids, int k, int dim) {
  // argmin ||x - c||² = argmin (||c||² - 2 x·c); computed directly, the clusters are small (k <= 256).
  int best = 0;
  float best_distance = std::numeric_limits<float>::max();
  for (int c = 0; c < k; ++c) {
    const float d = squared_distance(x, centroids + size_t(c) * dim, dim);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

void use_single_threaded_blas() {
  static std::once_flag single_threaded_blas;  // as in matmul: parallelism is ours, not BLAS's
  std::call_once(single_threaded_blas, [] { openblas_set_num_threads(1); });
}

void assign_nearest(const float* points, int n, int dim, int stride, const float* centroids, int k, int* nearest) {
  constexpr int kChunk = 512;  // points per GEMM: the [chunk, k] products stay in cache
  use_single_threaded_blas();
  thread_local std::vector<float> products, norms;
  products.resize(size_t(kChunk) * k);
  norms.resize(size_t(k));
  for (int c = 0; c < k; ++c) {
    const float* centroid = centroids + size_t(c) * dim;
    norms[size_t(c)] = std::inner_product(centroid, centroid + dim, centroid, 0.0f);
  }
  for (int first = 0; first < n; first += kChunk) {
    const int rows = std::min(kChunk, n - first);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, k, dim, 1.0f, points + size_t(first) * stride, stride,
                centroids, dim, 0.0f, products.data(), k);
    for (int i = 0; i < rows; ++i) {
      const float* dots = products.data() + size_t(i) * k;
      int best = 0;
      float best_distance = std::numeric_limits<float>::max();
      for (int c = 0; c < k; ++c) {
        const float distance = norms[size_t(c)] - 2.0f * dots[c];
        if (distance < best_distance) {
          best_distance = distance;
          best = c;
        }
      }
      nearest[first + i] = best;
    }
  }
}

std::vector<float> kmeans(const float* points, int n, int dim, int stride, int k, int max_iters, uint64_t seed) {
  assert(n >= k && k > 0);
  std::vector<float> centroids(size_t(k) * dim);
  uint64_t rng = seed;
  seed_plus_plus(points, n, dim, stride, k, rng, centroids.data());
  std::vector<int> assignment(size_t(n), -1), nearest(static_cast<size_t>(n));
  std::vector<double> sums(size_t(k) * dim);
  std::vector<int> counts(static_cast<size_t>(k));
  for (int iter = 0; iter < max_iters; ++iter) {
    assign_nearest(points, n, dim, stride, centroids.data(), k, nearest.data());
    if (nearest == assignment) break;  // converged
    assignment.swap(nearest);
    std::fill(sums.begin(), sums.end(), 0.0);
    std::fill(counts.begin(), counts.end(), 0);
    for (int i = 0; i < n; ++i) {
      const int c = assignment[size_t(i)];
      const float* p = points + size_t(i) * stride;
      double* s = sums.data() + size_t(c) * dim;
      for (int j = 0; j < dim; ++j) s[j] += p[j];
      ++counts[size_t(c)];
    }
    for (int c = 0; c < k; ++c) {
      if (counts[size_t(c)] == 0) continue;  // an empty cluster keeps its centroid
      const double* sum = sums.data() + size_t(c) * dim;
      for (int j = 0; j < dim; ++j) centroids[size_t(c) * dim + j] = float(sum[j] / counts[size_t(c)]);
    }
  }
  return centroids;
}

}  // namespace slimkv
