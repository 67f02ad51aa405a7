// Rows of a source gathered into a dense array, a warp per row in 8-byte lanes: the access pattern of
// PQCache's gather of selected tokens (kv/cuda/pq_select.cu), apart from any KV layout, so that a
// benchmark can read scattered rows of mapped host memory the way the selection does
// (bench/cuda/bench_pinned_gather_cuda.cc).
#pragma once

#include <cstdint>

#include "slimkv/status.h"

namespace slimkv::cuda {

struct RowGather {
  const uint8_t* source = nullptr;       // device or mapped host memory
  const long long* offsets = nullptr;    // device [rows]: each row's byte offset in source (8-byte aligned)
  int rows = 0;
  int row_bytes = 0;                     // a multiple of 8
  uint8_t* out = nullptr;                // device [rows, row_bytes]
};

// On the default stream.
Status gather_rows(const RowGather& gather);

}  // namespace slimkv::cuda
