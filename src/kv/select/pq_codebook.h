// A product quantizer (Jégou et al. 2011; PQCache §3.1 step 2): a `dim`-vector is split into m
// sub-vectors of dim/m, each replaced by the index of its nearest of 2^b centroids (one byte per
// sub-space, b <= 8). Inner products with a query come from a table of q·centroid per sub-space
// (asymmetric distance computation, ADC): q·k ≈ Σ_s table[s][code_s].
//
// The centroids are kept in FP16, laid out [m, dim/m, 2^b] (sub-space, dim, centroid): a table is then
// dim/m broadcasts of a query element times rows of 2^b centroids, with no horizontal sums, reading half
// the bytes of FP32. Tables are most of a long context's scoring (pq keeps one codebook per 256-token
// segment: computing their tables reads 2^b·dim centroid values per segment, an eighth of the keys' bytes
// in FP32); FP16's rounding (2^-11 relative) is far below PQ's own error.
#pragma once

#include <cstdint>
#include <vector>

namespace slimkv {

class PqCodebook {
 public:
  PqCodebook(int dim, int m, int bits) : dim_(dim), m_(m), bits_(bits) {}

  int dim() const { return dim_; }
  int m() const { return m_; }
  int centroids_per_space() const { return 1 << bits_; }
  int sub_dim() const { return dim_ / m_; }
  bool trained() const { return !centroids_.empty(); }
  // FP16 bits [m, dim/m, 2^b], as kept (the GPU's tables read them in this layout).
  const std::vector<uint16_t>& centroids() const { return centroids_; }

  // K-means per sub-space on vectors [n, dim] (n >= 2^b); sub-space s is seeded by hash(seed, s).
  void train(const float* vectors, int n, int max_iters, uint64_t seed);
  // codes [n, m]: each sub-vector's nearest centroid (as kept, in FP16).
  void encode(const float* vectors, int n, uint8_t* codes) const;
  // table [m, 2^b] of q·centroid (SIMD, FP32 accumulation).
  void score_table(const float* q, float* table) const;
  // The same table, one centroid at a time with FP64 accumulation: what score_table is held to.
  void score_table_reference(const float* q, float* table) const;
  // scores[i] = Σ_s table[s][codes[i, s]] for n codes
  void score_codes(const float* table, const uint8_t* codes, int n, float* scores) const;
  // The vector a code stands for: centroids concatenated. out [dim]
  void reconstruct(const uint8_t* code, float* out) const;

 private:
  // Centroid c of sub-space s, as FP32 [dim/m].
  void centroid(int s, int c, float* out) const;

  int dim_, m_, bits_;
  std::vector<uint16_t> centroids_;  // FP16 bits [m, dim/m, 2^b]
};

}  // namespace slimkv
