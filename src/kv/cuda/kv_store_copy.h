// Moving one sequence between the GPU's FP16 pages and a host KvStore (kv/store.h), the form the
// transfer format is read and written in (kv/transfer.h): what export_sequence and import_sequence of
// the GPU caches share. Host code; a page is one block of kCudaBlockTokens tokens of one layer.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "attention/cuda/kv_views.h"
#include "slimkv/status.h"

namespace slimkv {
class KvStore;
}

namespace slimkv::cuda {

// Page `block` of one layer's view, every KV head: k, v [num_kv_heads, kCudaBlockTokens, head_dim] FP16.
Status download_page(const PagedKvView& view, int block, std::vector<uint16_t>& k, std::vector<uint16_t>& v);

// A page's first n tokens (download_page's k, v) as every head's open tokens of `layer` in `into`
// (KvStore::restore_open_tokens, FP32: FP16 widened exactly); n = 0 sets the layer's count.
void restore_open_tokens_from_page(KvStore& into, int layer, const std::vector<uint16_t>& k,
                                   const std::vector<uint16_t>& v, int n);
// The first `open` tokens of page `block` of `view` (one layer's) as that layer's open tokens in
// `into` (download_page, then restore_open_tokens_from_page); open = 0 reads nothing.
Status restore_open_page(const PagedKvView& view, int block, int open, KvStore& into, int layer);

// Tokens [first, first + n) of one layer of `from` as step rows: k, v [n, num_kv_heads, head_dim] FP16
// (the append kernels' input). Sealed tokens are read from dense FP16 blocks (`dense:dtype=f16`), open
// ones narrowed from FP32 (exact: they were FP16).
void store_rows(const KvStore& from, int layer, int first, int n, std::vector<uint16_t>& k, std::vector<uint16_t>& v);

// Runs `tokens` tokens of a sequence into a cache `step_tokens` at a time: begin(n) starts a step of n
// tokens, then append(layer, k, v) for each layer with device rows of that chunk (store_rows of `from`).
Status append_store_rows(const KvStore& from, int first, int tokens, int step_tokens,
                         const std::function<Status(int n)>& begin,
                         const std::function<Status(int layer, const uint16_t* k, const uint16_t* v)>& append);

}  // namespace slimkv::cuda
