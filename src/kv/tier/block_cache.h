// Which blocks of the slow tier have a copy in the fast tier: a fixed number of slots, filled on a miss
// and given back by LRU (the least recently used block leaves) or LFU (the least often used leaves,
// ties to the least recently used), as PQCache's block-level cache (§3.4). Bookkeeping only: the owner
// moves the bytes (kv/tier/offload_tier.h). Counts hits and misses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace slimkv {

enum class CachePolicy { kLru, kLfu };

class BlockCache {
 public:
  BlockCache(int slots, CachePolicy policy);

  struct Lookup {
    int slot = -1;       // where the block is (hit) or goes (miss); -1: no slot may be taken
    bool hit = false;
    int64_t evicted = -1;  // the block that left the slot on a miss, or -1
  };
  // Looks up block `id`, counting a use. On a miss, the victim is chosen among slots not pinned
  // (pinned: used since the last unpin_all(), i.e. in the current step, whose pointers are in use).
  Lookup use(int64_t id);
  void unpin_all() { ++step_; }

  int slots() const { return int(entries_.size()); }
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }
  void clear();

 private:
  struct Entry {
    int64_t id = -1;
    uint64_t last_use = 0;  // a logical clock, for LRU and LFU ties
    uint64_t uses = 0;
    uint64_t step = 0;
  };
  CachePolicy policy_;
  std::vector<Entry> entries_;
  std::unordered_map<int64_t, int> slot_of_;
  uint64_t clock_ = 0, step_ = 1;
  int64_t hits_ = 0, misses_ = 0;
};

}  // namespace slimkv
