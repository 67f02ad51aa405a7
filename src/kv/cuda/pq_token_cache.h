// PQCache's GPU cache of selected K/V (§3.4, ../shared/papers/002; issue 25) for `pq:...@offload`: per
// (sequence, layer, KV head) `slots` tokens' K and V resident in GPU memory, so that the selection's
// re-rank and gather (pq_select.h) read a token found there from the GPU instead of from the pinned host
// pages over PCIe. Filled from each step's selection and given back by LRU or LFU, the policy of the
// CPU's offload tier (kv/tier/block_cache.h, the reference the GPU is tested against).
//
// Tokens, not the paper's 128-token blocks: the paper picks blocks to keep its Python bookkeeping cheap,
// but a selection of 1K tokens of 128K touches ~1K blocks with one token each, so a block cache would
// copy 64× the bytes it serves over PCIe. A token cache is filled from the compact buffer the gather has
// just written (GPU to GPU: no PCIe at all), and the policy is one kernel per layer on a stream of its
// own, overlapped with the layer's attention and the next layer's projections.
//
// One step of one (sequence, layer, KV head) — its selection's tokens t_0 < t_1 < ... (the gather's
// order) — is, as the reference BlockCache sees it: unpin_all(), then use(t) for each resident t
// ascending (hits), then use(t) for each other t ascending (misses, each into the policy's victim
// among the slots not used in this step, empty slots first, lowest first; none left: not cached). The
// GPU does the same at once: hits stamp their slots, the free slots are sorted by the policy's key, and
// the i-th miss takes the i-th of them. A use's stamp, step << 33 | miss << 32 | index, orders uses as
// the reference's clock does.
//
//   token → slot  int [sequences, layers, kv_heads, max_tokens]  (-1: not resident)
//   slot → token  int [sequences, layers, kv_heads, slots]       (-1: empty)
//   uses, stamp   [sequences, layers, kv_heads, slots]            (LFU's count; the last use)
//   K, V          FP16 [sequences, layers, kv_heads, slots, head_dim]
#pragma once

#include <cstdint>
#include <memory>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/pinned_memory.h"
#include "kv/cuda/pq_select.h"
#include "kv/tier/block_cache.h"

namespace slimkv::cuda {

// The most slots a (sequence, layer, KV head) may have: the policy sorts them in shared memory.
inline constexpr int kPqCacheMaxSlots = 8192;

struct PqTokenCacheShape {
  int num_layers = 0, num_kv_heads = 0, head_dim = 0;
  int max_sequences = 0, max_tokens = 0;
  int slots = 0;  // tokens per (sequence, layer, KV head), 1..kPqCacheMaxSlots
  int max_selected = 0;  // tokens a selection row may hold (PqTokenCacheView::tokens_stride)
};

// What the cache did, summed over the layers, rows and KV heads of the steps since reset_counters.
struct PqCacheCounters {
  long long used_tokens = 0;  // selected tokens looked up
  long long hit_tokens = 0;   // found in the cache
  long long filled_tokens = 0;  // copied into it
};

// One layer's update after its gather: the rows' selections (PqSelectRow::selected tokens each, listed
// in view.step_tokens) and their K/V in the compact buffer (pq_select.h's out layout).
struct PqCacheUpdate {
  const PqSelectRow* rows = nullptr;  // device [num_rows]
  int num_rows = 0;
  PqTokenCacheView view;
  const uint16_t* compact_k = nullptr;
  const uint16_t* compact_v = nullptr;
  int out_blocks_per_row = 0;
};

// The policy and the fill of one layer, on `stream` (a cudaStream_t; null: the default stream).
Status pq_cache_update(const PqCacheUpdate& update, void* stream);

class CudaPqTokenCache {
 public:
  // An error names `cache` and its range when shape.slots is out of it.
  static Expected<std::unique_ptr<CudaPqTokenCache>> create(const PqTokenCacheShape& shape, CachePolicy policy);
  ~CudaPqTokenCache();

  // Empties the sequence's slots in every layer (after the work queued on the cache's stream).
  Status reset_sequence(int sequence);
  // A decode step, before its rows are uploaded: waits for the last step's updates; a new stamp; the
  // counters start again from zero.
  Status begin_step();
  // Makes the GPU's next work wait for the last update (the compact buffer it reads is rewritten next).
  Status wait_for_update();
  PqTokenCacheView view(int layer);
  // After the layer's gather (queued on the default stream): its update on the cache's stream.
  Status update(int layer, const PqCacheUpdate& update);
  // The counters of the steps since begin_step (waits for their updates).
  Expected<PqCacheCounters> counters() const;
  size_t device_bytes() const;

 private:
  CudaPqTokenCache(const PqTokenCacheShape& shape, CachePolicy policy) : shape_(shape), policy_(policy) {}
  size_t units() const {  // (sequence, layer, KV head) triples
    return size_t(shape_.max_sequences) * size_t(shape_.num_layers) * size_t(shape_.num_kv_heads);
  }

  PqTokenCacheShape shape_;
  CachePolicy policy_;
  DeviceArray<int> token_slots_, slot_tokens_, step_tokens_;
  DeviceArray<unsigned> slot_uses_;
  DeviceArray<unsigned long long> slot_stamps_, counters_;
  DeviceArray<uint16_t> k_, v_;
  unsigned long long step_ = 0;
  void* stream_ = nullptr;   // cudaStream_t, non-blocking
  void* gathered_ = nullptr;  // cudaEvent_t: a layer's gather done
  void* updated_ = nullptr;   // cudaEvent_t: the last update done
};

}  // namespace slimkv::cuda
