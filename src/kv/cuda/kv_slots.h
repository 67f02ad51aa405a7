// Writing a step's rows into the slots of a paged layout: the new K/V of each token into its block of
// a pool (the GPU's block pool, an offload tier's staging buffer, or its pinned host pool, which the
// GPU writes through its mapping), and rows of attention inputs X into the host's blocks of X.
#pragma once

#include <cstddef>
#include <cstdint>

#include "slimkv/status.h"

namespace slimkv::cuda {

// k, v FP16 [n, num_kv_heads, head_dim] (device): token t goes to slot slots[t] = block · 64 + offset
// of the pools [blocks, num_kv_heads, 64, head_dim]; a negative slot skips the token.
Status write_kv_slots(const uint16_t* k, const uint16_t* v, const int* slots, int n, int num_kv_heads, int head_dim,
                      uint16_t* k_pool, uint16_t* v_pool);

// rows [n, row_bytes] (device) go to rows slots[r] of out [.., row_bytes]; row_bytes a multiple of 16.
Status write_row_slots(const void* rows, const int* slots, int n, size_t row_bytes, void* out);

}  // namespace slimkv::cuda
