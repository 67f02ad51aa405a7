// Device side of kv_slots.h: where a token's 16-byte vector goes in a paged pool, shared by the kernels
// that write a step's K/V (write_kv_slots and the quantized cache's fused append-and-seal).
#pragma once

#include <cstddef>

#include "backend/cuda/sequence_blocks.h"

namespace slimkv::cuda {

// Vector `vector` of head `head` of the token in slot (block · kCudaBlockTokens + offset) of a pool
// [blocks, num_kv_heads, kCudaBlockTokens, head_dim], in 16-byte vectors.
__device__ __forceinline__ size_t kv_slot_vector(int slot, int head, int num_kv_heads, int vectors_per_head, int vector) {
  const int block = slot / kCudaBlockTokens, offset = slot % kCudaBlockTokens;
  return ((size_t(block) * num_kv_heads + head) * kCudaBlockTokens + offset) * vectors_per_head + vector;
}

}  // namespace slimkv::cuda
