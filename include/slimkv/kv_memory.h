// What a sequence's KV takes, where it lies, and how a slow tier served it: for reports (slimkv
// generate, eval's memory task) and the server's metrics.
#pragma once

#include <cstddef>
#include <cstdint>

namespace slimkv {

struct TierStats {
  int64_t hits = 0, misses = 0;
  // slow tier -> fast tier: block copies on misses, streamed blocks, and what is read where it lies
  // outside staging (pq's re-rank reads its candidates' keys)
  size_t bytes_moved = 0;
  size_t bytes_written = 0;  // fast -> slow (sealed blocks written to the file)
  double hit_rate() const { return hits + misses ? double(hits) / double(hits + misses) : 0.0; }
};

struct KvMemory {
  size_t sealed_bytes = 0;  // sealed blocks, as the codec encodes them (in the pool, or the slow tier)
  // The open blocks' FP16 (dense FP32: FP32) buffers, with the recent window and the sink tokens of
  // sinks= / window= specs (allocated once, full size).
  size_t open_bytes = 0;
  bool sealed_in_slow_tier = false;  // offload: sealed blocks live in the slow tier...
  size_t cache_bytes = 0;            // ...and this much fast memory caches them
  size_t selector_bytes = 0;  // what the selector keeps (kv/select: pq's keys and index; 0 without one)
  size_t fast_bytes() const {
    return (sealed_in_slow_tier ? cache_bytes : sealed_bytes) + open_bytes + selector_bytes;
  }
  size_t slow_bytes() const { return sealed_in_slow_tier ? sealed_bytes : 0; }
  size_t sealed_blocks = 0;
  size_t sealed_tokens = 0;  // tokens whose K/V sit in sealed blocks (each full-attention layer holds them all)
  // Of sealed_bytes, what sliding-window layers (Gemma 3) hold: their last window's blocks only, so it
  // stops growing with the sequence; 0 for models without such layers.
  size_t window_sealed_bytes = 0;
  TierStats tier;  // the offload tier's block cache (all zero for the fast tier)
  // What each further token costs: the full-attention layers' sealed bytes per sealed token.
  double sealed_bytes_per_token() const {
    return sealed_tokens ? double(sealed_bytes - window_sealed_bytes) / double(sealed_tokens) : 0.0;
  }
};

}  // namespace slimkv
