#include "transfer/nccl_links.h"

#include <vector>

namespace slimkv {

void NcclLinks::touch_locked(const std::string& key) {
  recent_.remove(key);
  recent_.push_front(key);
}

std::shared_ptr<NcclPeerLink> NcclLinks::get_or_add(const std::string& key) {
  std::vector<std::shared_ptr<NcclPeerLink>> closed;  // closed after the lock is let go (a link's close waits)
  std::lock_guard lock(mutex_);
  std::shared_ptr<NcclPeerLink>& link = links_[key];
  if (!link) link = std::make_shared<NcclPeerLink>();
  std::shared_ptr<NcclPeerLink> found = link;
  touch_locked(key);
  // Close the least recently used idle links beyond the bound (a link in use is skipped: its stream
  // holds it; the caller's own new one is the most recent).
  for (auto oldest = recent_.end(); links_.size() > max_links_ && oldest != recent_.begin();) {
    --oldest;
    auto entry = links_.find(*oldest);
    std::unique_lock idle(entry->second->in_use, std::try_to_lock);
    if (!idle.owns_lock() || entry->second == found) continue;
    idle.unlock();
    closed.push_back(std::move(entry->second));
    links_.erase(entry);
    oldest = recent_.erase(oldest);
  }
  return found;
}

std::shared_ptr<NcclPeerLink> NcclLinks::find(const std::string& key) {
  std::lock_guard lock(mutex_);
  auto entry = links_.find(key);
  if (entry == links_.end()) return nullptr;
  touch_locked(key);
  return entry->second;
}

void NcclLinks::forget(const std::string& key, const std::shared_ptr<NcclPeerLink>& link) {
  std::lock_guard lock(mutex_);
  auto entry = links_.find(key);
  if (entry == links_.end() || entry->second != link) return;
  links_.erase(entry);
  recent_.remove(key);
}

size_t NcclLinks::size() {
  std::lock_guard lock(mutex_);
  return links_.size();
}

}  // namespace slimkv
