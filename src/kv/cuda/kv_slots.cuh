// Device side of kv_slots.h: where a token's 16-byte vector goes in a paged pool, and its copy there,
// shared by the kernels that write a step's K/V (write_kv_slots and the quantized cache's fused
// append-and-seal).
#pragma once

#include <cstddef>

#include "kv/cuda/sequence_blocks.h"

namespace slimkv::cuda {

// Vector `vector` of head `head` of the token in slot (block · kCudaBlockTokens + offset) of a pool
// [blocks, num_kv_heads, kCudaBlockTokens, head_dim], in 16-byte vectors.
__device__ __forceinline__ size_t kv_slot_vector(int slot, int head, int num_kv_heads, int vectors_per_head, int vector) {
  const int block = slot / kCudaBlockTokens, offset = slot % kCudaBlockTokens;
  return ((size_t(block) * num_kv_heads + head) * kCudaBlockTokens + offset) * vectors_per_head + vector;
}

// Copies vector `vector` of head `head` of step token `token` (k, v: [tokens, num_kv_heads,
// vectors_per_head]) into its slot of the pools; a negative slot writes nothing.
__device__ __forceinline__ void write_kv_vector(const uint4* k, const uint4* v, const int* slots, int token, int head,
                                                int num_kv_heads, int vectors_per_head, int vector, uint4* k_pool,
                                                uint4* v_pool) {
  const int slot = slots[token];
  if (slot < 0) return;
  const size_t source = (size_t(token) * num_kv_heads + head) * vectors_per_head + vector;
  const size_t destination = kv_slot_vector(slot, head, num_kv_heads, vectors_per_head, vector);
  k_pool[destination] = k[source];
  v_pool[destination] = v[source];
}

}  // namespace slimkv::cuda
