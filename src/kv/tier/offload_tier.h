// The `offload` tier (PQCache §3.4, ARCHITECTURE.md): sealed blocks live in the slow tier, on the CPU a
// memory-mapped file on disk (unlinked at once: it never outlives the sequence), and a block cache of
// hot blocks in the fast tier (RAM) serves attention. Before a layer's attention the store asks for
// the blocks the selection touches (`stage`); each is a cache hit, or a miss that copies it from the
// file into a cache slot. Blocks a step needs beyond the cache's slots are read straight from the
// mapping (counted as misses and as bytes moved). Bytes moved and written are counted and reported.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kv/tier/block_cache.h"
#include "slimkv/kv_memory.h"
#include "slimkv/status.h"

namespace slimkv {


struct OffloadConfig {
  // The block cache's size in tokens: room for the K and V of that many tokens in every layer and KV
  // head, as PQCache sizes its GPU cache (cache_tokens / block_tokens blocks per layer and KV head).
  int cache_tokens = 4096;
  CachePolicy policy = CachePolicy::kLru;
  std::string dir;  // where the file goes; empty: the system's temporary directory
  // Whether the spec gave any of the above (the GPU's offload tier, which streams every block from
  // pinned host memory, takes none of them and refuses them).
  bool options_given = false;
};

class OffloadTier {
 public:
  // Room for max_blocks blocks of block_bytes, and a cache of cache_blocks. Fails if the file cannot be
  // made or mapped.
  static Expected<std::unique_ptr<OffloadTier>> open(const OffloadConfig& config, int cache_blocks, size_t block_bytes,
                                                     size_t max_blocks);
  ~OffloadTier();
  OffloadTier(const OffloadTier&) = delete;
  OffloadTier& operator=(const OffloadTier&) = delete;

  // Where to seal the next block (a fast-tier buffer); then write() puts it in the file and returns its
  // id. Ids are in sealing order, from 0.
  uint8_t* scratch() { return scratch_.data(); }
  int64_t write(const uint8_t* block);

  // Brings the blocks of one step into the fast tier; resident(id) is then valid for them until the next stage().
  void stage(const std::vector<int64_t>& ids);
  // Where to read a block: its fast-tier copy, or where it lies in the slow tier (always readable on
  // the CPU: a KV transfer reads blocks whatever the cache holds).
  const uint8_t* read(const uint8_t* slow) const {
    const uint8_t* fast = resident_[size_t((slow - mapping_) / ptrdiff_t(block_bytes_))];
    return fast ? fast : slow;
  }
  // Whether read() gave the block where it lies in the slow tier (it is not in the cache this step).
  bool in_slow_tier(const uint8_t* block) const {
    return block >= mapping_ && block < mapping_ + max_blocks_ * block_bytes_;
  }
  // Counts bytes read where they lie in the slow tier outside stage(): pq's re-rank reads its candidates'
  // keys before the step's blocks are staged. Safe from concurrent threads (heads are scored in parallel).
  void count_direct_read(size_t bytes) const { direct_bytes_.fetch_add(bytes, std::memory_order_relaxed); }
  // The id of a block from where write() put it.
  int64_t id_of(const uint8_t* slow) const { return (slow - mapping_) / ptrdiff_t(block_bytes_); }
  const uint8_t* slow_block(int64_t id) const { return mapping_ + size_t(id) * block_bytes_; }

  TierStats stats() const;
  int64_t blocks() const { return blocks_; }
  size_t block_bytes() const { return block_bytes_; }  // a slot: every block of the tier takes one
  size_t cache_bytes() const { return slots_.size() + scratch_.size(); }  // what the tier holds in fast memory
  void clear();  // forgets every block (the file is reused); counters restart

 private:
  OffloadTier(int cache_blocks, CachePolicy policy, size_t block_bytes, size_t max_blocks, int fd, uint8_t* mapping);

  size_t block_bytes_, max_blocks_;
  int fd_;
  uint8_t* mapping_;
  std::vector<uint8_t> scratch_;
  std::vector<uint8_t> slots_;                // cache_blocks × block_bytes: the fast-tier copies
  std::vector<const uint8_t*> resident_;      // per block id: where attention reads it this step
  BlockCache cache_;
  int64_t blocks_ = 0;
  size_t bytes_moved_ = 0, bytes_written_ = 0;
  mutable std::atomic<size_t> direct_bytes_{0};  // count_direct_read's
};

}  // namespace slimkv
