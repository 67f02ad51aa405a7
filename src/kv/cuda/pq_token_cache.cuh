// Where the selection's kernels find a token in PQCache's GPU cache (pq_token_cache.h).
#pragma once

#include "kv/cuda/pq_select.h"

namespace slimkv::cuda {

// The (sequence, layer, KV head) triple's index in the cache's arrays.
__device__ inline long long pq_cache_unit(const PqTokenCacheView& c, int sequence, int g) {
  return ((long long)sequence * c.num_layers + c.layer) * c.num_kv_heads + g;
}

// The slot holding token t of (sequence, the view's layer, KV head g), or -1 (no cache too).
__device__ inline int pq_cached_slot(const PqTokenCacheView& c, int sequence, int g, int t) {
  if (c.token_slots == nullptr) return -1;
  return c.token_slots[pq_cache_unit(c, sequence, g) * c.max_tokens + t];
}

// The offset of a slot's K (and V) row in c.k (c.v).
__device__ inline long long pq_cache_row(const PqTokenCacheView& c, int sequence, int g, int slot) {
  return (pq_cache_unit(c, sequence, g) * c.slots + slot) * c.head_dim;
}

}  // namespace slimkv::cuda
