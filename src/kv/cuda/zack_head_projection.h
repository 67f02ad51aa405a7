// ZACK's projection of q and k after RoPE onto each (layer, KV head)'s Q–K basis (ZACK §5.1, Lemma 2:
// scores q'·k' on the head's k_rank dims equal q·k up to the discarded singular values), on the GPU: what
// both of the GPU's zack caches run before they store or attend (zack_kv_cache.h over FP16 blocks,
// gpu_zack_quantized_kv.cc under a quantizing codec).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cuda/device_memory.h"

namespace slimkv::cuda {

struct ZackHeadProjectionShape {
  int num_layers = 0;
  int num_heads = 0;  // query heads; num_heads / num_kv_heads share a KV head's basis
  int num_kv_heads = 0;
  int head_dim = 0;   // at most 128
  int max_step_tokens = 0;
  std::vector<int> k_ranks;  // [num_layers · num_kv_heads], 1..head_dim
  // FP32, for each (layer, KV head) in order: its Q–K basis B_g[:k_rank] [k_rank, head_dim] (row-major).
  std::vector<float> qk_bases;
  // rot=hadamard: each basis turned by the head's H at k_rank (kv/rotation.h), so q' and k' come out
  // rotated, as the CPU store keeps them (scores unchanged: H is orthonormal).
  bool rotate = false;
};

// The rows of project_queries_and_keys (device, valid until the next call).
struct ReducedQueriesAndKeys {
  const uint16_t* q;
  const uint16_t* k;
};

class CudaZackHeadProjection {
 public:
  static Expected<std::unique_ptr<CudaZackHeadProjection>> create(const ZackHeadProjectionShape& shape);

  // q FP16 [n, num_heads, head_dim] (device) → each head's B_g[:k_rank] · q in the first k_rank entries of
  // the returned rows (device, same shape, the rest 0; valid until the next call), n ≤ max_step_tokens.
  Expected<const uint16_t*> project_queries(int layer, const uint16_t* q, int n);
  // The same for k FP16 [n, num_kv_heads, head_dim] (its own rows, valid until the next call).
  Expected<const uint16_t*> project_keys(int layer, const uint16_t* k, int n);
  // Both in one launch (a step's attend: one kernel fewer a layer; each row the same bits as alone).
  Expected<ReducedQueriesAndKeys> project_queries_and_keys(int layer, const uint16_t* q, const uint16_t* k, int n);

 private:
  explicit CudaZackHeadProjection(const ZackHeadProjectionShape& shape) : shape_(shape) {}
  // q into q_reduced_ and k into k_reduced_, either null to skip it.
  Status project(int layer, const uint16_t* q, const uint16_t* k, int n);

  ZackHeadProjectionShape shape_;
  DeviceArray<float> bases_t_;         // each basis transposed: [head_dim, k_rank]
  DeviceArray<int> basis_offsets_;     // [num_layers · num_kv_heads + 1]: floats before each basis
  DeviceArray<int> k_ranks_;           // [num_layers · num_kv_heads]
  DeviceArray<uint16_t> q_reduced_, k_reduced_;  // [max_step_tokens, heads, head_dim]
};

}  // namespace slimkv::cuda
