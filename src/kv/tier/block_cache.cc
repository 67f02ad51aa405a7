#include "kv/tier/block_cache.h"

namespace slimkv {

BlockCache::BlockCache(int slots, CachePolicy policy) : policy_(policy), entries_(size_t(slots)) {}

BlockCache::Lookup BlockCache::use(int64_t id) {
  ++clock_;
  if (auto found = slot_of_.find(id); found != slot_of_.end()) {
    Entry& entry = entries_[size_t(found->second)];
    entry.last_use = clock_;
    ++entry.uses;
    entry.step = step_;
    ++hits_;
    return {found->second, true, -1};
  }
  ++misses_;
  // The victim: an empty slot first, else the policy's choice among slots not used in this step.
  int victim = -1;
  for (int s = 0; s < slots(); ++s) {
    const Entry& e = entries_[size_t(s)];
    if (e.id < 0) {
      victim = s;
      break;
    }
    if (e.step == step_) continue;
    if (victim < 0) {
      victim = s;
      continue;
    }
    const Entry& v = entries_[size_t(victim)];
    const bool better = policy_ == CachePolicy::kLru ? e.last_use < v.last_use
                                                     : e.uses < v.uses || (e.uses == v.uses && e.last_use < v.last_use);
    if (better) victim = s;
  }
  if (victim < 0) return {-1, false, -1};
  Entry& entry = entries_[size_t(victim)];
  const int64_t evicted = entry.id;
  if (evicted >= 0) slot_of_.erase(evicted);
  entry = {id, clock_, 1, step_};
  slot_of_[id] = victim;
  return {victim, false, evicted};
}

void BlockCache::clear() {
  for (Entry& e : entries_) e = Entry{};
  slot_of_.clear();
  hits_ = misses_ = 0;
}

}  // namespace slimkv
