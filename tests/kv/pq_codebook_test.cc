// PqCodebook (kv/select/pq_codebook.h): the SIMD q·centroid table against its FP64 reference over every
// b and the sub-space widths pq meets, and codes that point at the nearest centroid as kept (FP16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kv/select/pq_codebook.h"

namespace slimkv {
namespace {

std::vector<float> normal_vector(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  for (float& value : x) value = normal(rng);
  return x;
}

struct CodebookCase {
  int dim, m, bits;
  unsigned seed;
  std::string name() const {
    return "pq(dim=" + std::to_string(dim) + ",m=" + std::to_string(m) + ",b=" + std::to_string(bits) +
           ",seed=" + std::to_string(seed) + ")";
  }
  int points() const { return std::max(1 << bits, 96); }
  PqCodebook trained(const std::vector<float>& vectors) const {
    PqCodebook codebook(dim, m, bits);
    codebook.train(vectors.data(), points(), 3, seed);
    return codebook;
  }
};

TEST(PqCodebook, ScoreTableMatchesTheReference) {
  for (int dim : {64, 80, 128}) {
    for (int m : {1, 2, 4, 8}) {
      for (int bits = 1; bits <= 8; ++bits) {
        const CodebookCase c{dim, m, bits, unsigned(dim * 100 + m * 10 + bits)};
        const std::vector<float> vectors = normal_vector(size_t(c.points()) * dim, c.seed);
        const PqCodebook codebook = c.trained(vectors);
        const std::vector<float> q = normal_vector(size_t(dim), c.seed + 1);
        const size_t table_size = size_t(m) << bits;
        std::vector<float> fast(table_size + 1, -7.0f), reference(table_size + 1, -7.0f);  // one guard element
        codebook.score_table(q.data(), fast.data());
        codebook.score_table_reference(q.data(), reference.data());
        for (size_t i = 0; i < table_size; ++i) {
          ASSERT_TRUE(std::isfinite(fast[i])) << c.name() << " entry " << i;
          ASSERT_NEAR(fast[i], reference[i], 1e-4f * std::sqrt(float(dim / m))) << c.name() << " entry " << i;
        }
        ASSERT_EQ(fast[table_size], -7.0f) << c.name() << ": wrote past the table";
      }
    }
  }
}

TEST(PqCodebook, CodesPointAtTheNearestCentroidAsKept) {
  for (const CodebookCase c : {CodebookCase{128, 2, 6, 5}, CodebookCase{64, 4, 4, 6}, CodebookCase{80, 1, 3, 7}}) {
    const std::vector<float> vectors = normal_vector(size_t(c.points()) * c.dim, c.seed);
    const PqCodebook codebook = c.trained(vectors);
    const int n = 40, d = c.dim / c.m;
    const std::vector<float> x = normal_vector(size_t(n) * c.dim, c.seed + 2);
    std::vector<uint8_t> codes(size_t(n) * c.m);
    codebook.encode(x.data(), n, codes.data());
    std::vector<float> reconstructed(size_t(c.dim));
    for (int i = 0; i < n; ++i) {
      for (int s = 0; s < c.m; ++s) {
        // The sub-space's distance to each centroid, read back through reconstruct().
        std::vector<double> distance(size_t(1) << c.bits);
        std::vector<uint8_t> code(codes.begin() + ptrdiff_t(i * c.m), codes.begin() + ptrdiff_t((i + 1) * c.m));
        for (int centroid = 0; centroid < (1 << c.bits); ++centroid) {
          code[size_t(s)] = uint8_t(centroid);
          codebook.reconstruct(code.data(), reconstructed.data());
          for (int j = 0; j < d; ++j) {
            const double diff = double(x[size_t(i) * c.dim + size_t(s * d + j)]) - reconstructed[size_t(s * d + j)];
            distance[size_t(centroid)] += diff * diff;
          }
        }
        const double best = *std::min_element(distance.begin(), distance.end());
        EXPECT_LE(distance[codes[size_t(i) * c.m + s]], best + 1e-4 * (1.0 + best)) << c.name() << " point " << i;
      }
    }
  }
}

}  // namespace
}  // namespace slimkv
