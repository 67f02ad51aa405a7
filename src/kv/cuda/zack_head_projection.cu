#include "kv/cuda/zack_head_projection.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "kv/rotation.h"

namespace slimkv::cuda {
namespace {

constexpr int kProjectTokens = 8;   // tokens per CTA of the projection: each basis element read once for them
constexpr int kMaxHeadDim = 128;
// The input dims are split into kProjectParts ranges, each summed by its own threads and the parts'
// sums added in part order: a decode step projects one token per head (32 CTAs for Llama-3-8B's queries,
// 8 for its keys), and one thread per output dim walking all head_dim basis rows in turn left a handful
// of loads in flight per SM (14 µs a projection, for 256 KB of bases). With 8 parts a thread's basis
// loads (16 at head_dim 128) are all issued before the first is used.
constexpr int kProjectParts = 8;

// The rows one launch projects of q or of k: x [n, heads, head_dim] into out, heads_per_basis of the
// heads sharing a KV head's basis (no heads: nothing of this side).
struct ProjectedRows {
  const __half* x = nullptr;
  __half* out = nullptr;
  int heads = 0, heads_per_basis = 1;
};

// out[t, h, :k_rank] = B_g[:k_rank] · x[t, h, :] with g = h / heads_per_basis, in FP32 from FP16 rows;
// out[t, h, k_rank:] = 0, for q's heads (CTAs 0..q.heads - 1) then k's. Thread (part, j) sums output dim j
// over the part's input dims, reading the transposed basis [head_dim, k_rank] along j (coalesced). Each
// token's sums run in the same order whatever else the step holds or the launch projects.
// grid (q.heads + k.heads, ceil(n / kProjectTokens)), kProjectParts · head_dim threads.
__global__ void __launch_bounds__(kProjectParts * kMaxHeadDim)
    project_heads_kernel(ProjectedRows q, ProjectedRows k, int n, int head_dim, const float* bases_t,
                         const int* basis_offsets, const int* k_ranks) {
  __shared__ float rows[kProjectTokens][kMaxHeadDim];
  __shared__ float part_sums[kProjectParts][kProjectTokens][kMaxHeadDim];
  const bool query = int(blockIdx.x) < q.heads;
  const ProjectedRows side = query ? q : k;
  const int h = query ? int(blockIdx.x) : int(blockIdx.x) - q.heads, g = h / side.heads_per_basis;
  const int first = blockIdx.y * kProjectTokens, tokens = min(kProjectTokens, n - first), rank = k_ranks[g];
  for (int e = threadIdx.x; e < tokens * head_dim; e += blockDim.x) {
    const int t = e / head_dim, c = e % head_dim;
    rows[t][c] = __half2float(side.x[(size_t(first + t) * side.heads + h) * head_dim + c]);
  }
  __syncthreads();
  const int part = threadIdx.x / head_dim, j = threadIdx.x % head_dim;
  const int part_dims = (head_dim + kProjectParts - 1) / kProjectParts;
  const int begin = part * part_dims, end = min(head_dim, begin + part_dims);
  float acc[kProjectTokens] = {};
  if (j < rank) {
    const float* basis = bases_t + basis_offsets[g] + j;
#pragma unroll 16
    for (int i = begin; i < end; ++i) {
      const float b = basis[i * rank];
#pragma unroll
      for (int t = 0; t < kProjectTokens; ++t) acc[t] = fmaf(rows[t][i], b, acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < kProjectTokens; ++t) part_sums[part][t][j] = acc[t];
  __syncthreads();
  for (int e = threadIdx.x; e < tokens * head_dim; e += blockDim.x) {
    const int t = e / head_dim, c = e % head_dim;
    float value = 0.0f;
#pragma unroll
    for (int p = 0; p < kProjectParts; ++p) value += part_sums[p][t][c];
    side.out[(size_t(first + t) * side.heads + h) * head_dim + c] = __float2half(value);
  }
}

}  // namespace

Expected<std::unique_ptr<CudaZackHeadProjection>> CudaZackHeadProjection::create(const ZackHeadProjectionShape& shape) {
  const size_t heads = size_t(shape.num_layers) * size_t(shape.num_kv_heads);
  if (shape.num_layers <= 0 || shape.num_kv_heads <= 0 || shape.num_heads % shape.num_kv_heads != 0 ||
      shape.max_step_tokens <= 0 || shape.head_dim <= 0 || shape.head_dim > kMaxHeadDim) {
    return error("CUDA ZACK projection: every size must be positive, query heads a multiple of KV heads, head_dim at most ",
                 kMaxHeadDim, " (layers ", shape.num_layers, ", heads ", shape.num_heads, "/", shape.num_kv_heads, ", head_dim ",
                 shape.head_dim, ", step tokens ", shape.max_step_tokens, ")");
  }
  if (shape.k_ranks.size() != heads) {
    return error("CUDA ZACK projection: ", shape.k_ranks.size(), " K ranks, expected one per layer and KV head (", heads, ")");
  }
  std::vector<int> offsets = {0};
  for (size_t i = 0; i < heads; ++i) {
    const int rank = shape.k_ranks[i];
    if (rank < 1 || rank > shape.head_dim) {
      return error("CUDA ZACK projection: layer ", i / size_t(shape.num_kv_heads), " KV head ", i % size_t(shape.num_kv_heads),
                   " has K rank ", rank, ", expected 1..", shape.head_dim);
    }
    offsets.push_back(offsets.back() + rank * shape.head_dim);
  }
  if (shape.qk_bases.size() != size_t(offsets.back())) {
    return error("CUDA ZACK projection: ", shape.qk_bases.size(), " basis values, expected ", offsets.back(),
                 " (k_rank · head_dim for each layer and KV head)");
  }
  std::vector<float> transposed(shape.qk_bases.size());
  for (size_t i = 0; i < heads; ++i) {
    const int rank = shape.k_ranks[i], offset = offsets[i];
    for (int r = 0; r < rank; ++r) {
      for (int c = 0; c < shape.head_dim; ++c) {
        transposed[size_t(offset + c * rank + r)] = shape.qk_bases[size_t(offset + r * shape.head_dim + c)];
      }
    }
    // H · B: each column c of the basis (its k_rank values, contiguous here) turned by H.
    for (int c = 0; c < shape.head_dim && shape.rotate; ++c) hadamard_rotate(&transposed[size_t(offset + c * rank)], rank);
  }
  std::unique_ptr<CudaZackHeadProjection> projection(new CudaZackHeadProjection(shape));
  const size_t step = size_t(shape.max_step_tokens) * size_t(shape.head_dim);
  SLIMKV_ASSIGN_OR_RETURN(projection->bases_t_, DeviceArray<float>::allocate(std::max<size_t>(1, transposed.size()), "the ZACK Q-K bases"));
  SLIMKV_ASSIGN_OR_RETURN(projection->basis_offsets_, DeviceArray<int>::allocate(heads + 1, "the ZACK basis offsets"));
  SLIMKV_ASSIGN_OR_RETURN(projection->k_ranks_, DeviceArray<int>::allocate(heads, "the ZACK K ranks"));
  SLIMKV_ASSIGN_OR_RETURN(projection->q_reduced_, DeviceArray<uint16_t>::allocate(step * shape.num_heads, "the reduced queries"));
  SLIMKV_ASSIGN_OR_RETURN(projection->k_reduced_, DeviceArray<uint16_t>::allocate(step * shape.num_kv_heads, "the reduced keys"));
  SLIMKV_RETURN_IF_ERROR(projection->bases_t_.upload(transposed.data(), transposed.size()));
  SLIMKV_RETURN_IF_ERROR(projection->basis_offsets_.upload(offsets.data(), heads + 1));
  SLIMKV_RETURN_IF_ERROR(projection->k_ranks_.upload(shape.k_ranks.data(), heads));
  return Expected<std::unique_ptr<CudaZackHeadProjection>>(std::move(projection));
}

Status CudaZackHeadProjection::project(int layer, const uint16_t* q, const uint16_t* k, int n) {
  if (n < 0 || n > shape_.max_step_tokens) {
    return error("CUDA ZACK projection: ", n, " tokens, expected 0..", shape_.max_step_tokens, " (max_step_tokens)");
  }
  if (n == 0) return Status::ok();
  ProjectedRows queries, keys;
  if (q != nullptr) {
    queries = {reinterpret_cast<const __half*>(q), reinterpret_cast<__half*>(q_reduced_.data()), shape_.num_heads,
               shape_.num_heads / shape_.num_kv_heads};
  }
  if (k != nullptr) {
    keys = {reinterpret_cast<const __half*>(k), reinterpret_cast<__half*>(k_reduced_.data()), shape_.num_kv_heads, 1};
  }
  const size_t first = size_t(layer) * shape_.num_kv_heads;
  const dim3 grid(unsigned(queries.heads + keys.heads), unsigned((n + kProjectTokens - 1) / kProjectTokens));
  project_heads_kernel<<<grid, kProjectParts * shape_.head_dim>>>(queries, keys, n, shape_.head_dim, bases_t_.data(),
                                                                  basis_offsets_.data() + first, k_ranks_.data() + first);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Expected<const uint16_t*> CudaZackHeadProjection::project_queries(int layer, const uint16_t* q, int n) {
  SLIMKV_RETURN_IF_ERROR(project(layer, q, nullptr, n));
  return static_cast<const uint16_t*>(q_reduced_.data());
}

Expected<const uint16_t*> CudaZackHeadProjection::project_keys(int layer, const uint16_t* k, int n) {
  SLIMKV_RETURN_IF_ERROR(project(layer, nullptr, k, n));
  return static_cast<const uint16_t*>(k_reduced_.data());
}

Expected<ReducedQueriesAndKeys> CudaZackHeadProjection::project_queries_and_keys(int layer, const uint16_t* q,
                                                                                 const uint16_t* k, int n) {
  SLIMKV_RETURN_IF_ERROR(project(layer, q, k, n));
  return ReducedQueriesAndKeys{q_reduced_.data(), k_reduced_.data()};
}

}  // namespace slimkv::cuda
