// The NCCL links (backend/cuda/nccl_link.h) a worker keeps to its peers on other GPUs: made at the first
// KV stream between two workers (docs/kv_stream_protocol.md, "NCCL"), then kept, since joining a link
// costs far more than a prompt's transfer over it. A sender keys its links by the receiver's address,
// a receiver by the link's id. NCCL matches a link's sends and receives in the order they are issued,
// so a link carries one stream at a time: the stream holds the link's `in_use` while it uses it.
#pragma once

#include <cstddef>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backend/cuda/nccl_link.h"

namespace slimkv {

struct NcclPeerLink {
  std::mutex in_use;
  cuda::NcclId id{};
  std::shared_ptr<cuda::NcclLink> link;  // null until both sides have joined
};

class NcclLinks {
 public:
  // Beyond `max_links` the least recently used idle link is closed (a worker restarted on the other
  // side leaves links nobody uses again).
  explicit NcclLinks(size_t max_links = 16) : max_links_(max_links) {}

  // The link kept under `key`, made (not joined yet) when there is none.
  std::shared_ptr<NcclPeerLink> get_or_add(const std::string& key);
  // The link kept under `key`, or nullptr.
  std::shared_ptr<NcclPeerLink> find(const std::string& key);
  // Drops `link` from under `key` (broken, or unknown to the peer): the next stream makes a new one.
  void forget(const std::string& key, const std::shared_ptr<NcclPeerLink>& link);
  size_t size();

 private:
  void touch_locked(const std::string& key);
  const size_t max_links_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<NcclPeerLink>> links_;
  std::list<std::string> recent_;  // keys, most recently used first
};

}  // namespace slimkv
