// K-means for the PQ index (PQCache §3.1 step 2): k-means++ seeding, then Lloyd iterations until no
// point changes cluster or the iteration cap is reached. Deterministic for a seed (no threads inside:
// the PQ selector runs many of these side by side, one per layer, KV head and sub-space).
#pragma once

#include <cstdint>
#include <vector>

namespace slimkv {

// Points are rows of `dim` floats, `stride` floats apart (a sub-space of key rows). Needs n >= k.
// Returns the centroids [k, dim].
std::vector<float> kmeans(const float* points, int n, int dim, int stride, int k, int max_iters, uint64_t seed);

// The index of the centroid nearest to x (squared L2), ties to the lower index. The plain reference.
int nearest_centroid(const float* x, const float* centroids, int k, int dim);

// nearest[i] = the centroid nearest to point i, for n points (rows `stride` floats apart): as
// argmin_c ||c||² − 2 x·c with the x·c from one BLAS GEMM per chunk of points, which is what made
// FAISS's k-means 5x faster than point-by-point distances (bench_pq). Near-ties may resolve
// differently from nearest_centroid (float rounding); tests/kv/select_test.cc bounds the difference.
void assign_nearest(const float* points, int n, int dim, int stride, const float* centroids, int k, int* nearest);

// BLAS single-threaded (the parallelism is the callers': many clusterings side by side). Set once, before
// any concurrent call: OpenBLAS changing its thread count while another thread runs a GEMM can crash,
// which a caller that starts clustering threads before any other BLAS call (the GPU's pq) would risk.
void use_single_threaded_blas();

// A uniform double in [0, 1) from a splitmix64 state: the same stream on every platform.
double next_uniform(uint64_t& state);

}  // namespace slimkv
