#include "util/buffer_pool.h"

namespace slimkv {

BufferPool::BufferPool(size_t max_bytes, std::chrono::milliseconds idle) : max_bytes_(max_bytes), idle_(idle) {}

std::vector<uint8_t> BufferPool::take_locked(std::list<Held>::iterator it) {
  if (it == held_.end()) {
    ++stats_.fresh_total;
    return {};
  }
  std::vector<uint8_t> buffer = std::move(it->buffer);
  stats_.held_bytes -= buffer.capacity();
  --stats_.held_buffers;
  ++stats_.reused_total;
  held_.erase(it);
  return buffer;
}

std::vector<uint8_t> BufferPool::take(size_t bytes) {
  std::lock_guard lock(mutex_);
  auto best = held_.end();
  for (auto it = held_.begin(); it != held_.end(); ++it) {
    if (it->buffer.capacity() >= bytes && (best == held_.end() || it->buffer.capacity() < best->buffer.capacity())) best = it;
  }
  return take_locked(best);
}

std::vector<uint8_t> BufferPool::take_largest() {
  std::lock_guard lock(mutex_);
  auto best = held_.end();
  for (auto it = held_.begin(); it != held_.end(); ++it) {
    if (best == held_.end() || it->buffer.capacity() > best->buffer.capacity()) best = it;
  }
  return take_locked(best);
}

void BufferPool::give_back(std::vector<uint8_t> buffer) {
  const size_t bytes = buffer.capacity();
  if (bytes == 0) return;
  std::vector<std::vector<uint8_t>> dropped;  // freed after the lock (unmapping gigabytes takes a while)
  std::lock_guard lock(mutex_);
  if (bytes > max_bytes_) {
    ++stats_.dropped_total;
    dropped.push_back(std::move(buffer));
    return;
  }
  while (stats_.held_bytes + bytes > max_bytes_) {
    stats_.held_bytes -= held_.front().buffer.capacity();
    --stats_.held_buffers;
    ++stats_.dropped_total;
    dropped.push_back(std::move(held_.front().buffer));
    held_.pop_front();
  }
  held_.push_back({std::move(buffer), std::chrono::steady_clock::now()});
  stats_.held_bytes += bytes;
  ++stats_.held_buffers;
}

void BufferPool::release_idle() {
  std::vector<std::vector<uint8_t>> dropped;
  std::lock_guard lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  std::erase_if(held_, [&](Held& held) {
    if (now - held.since <= idle_) return false;
    stats_.held_bytes -= held.buffer.capacity();
    --stats_.held_buffers;
    ++stats_.dropped_total;
    dropped.push_back(std::move(held.buffer));
    return true;
  });
}

BufferPool::Stats BufferPool::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

std::shared_ptr<const std::vector<uint8_t>> share_pooled(std::shared_ptr<BufferPool> pool, std::vector<uint8_t> buffer,
                                                         std::shared_ptr<std::atomic<uint64_t>> held_bytes) {
  const uint64_t bytes = buffer.size();
  if (held_bytes) *held_bytes += bytes;
  // Owned as non-const (the deleter moves the bytes back into the pool), handed out as const.
  return std::shared_ptr<std::vector<uint8_t>>(
      new std::vector<uint8_t>(std::move(buffer)),
      [pool = std::move(pool), held_bytes = std::move(held_bytes), bytes](std::vector<uint8_t>* shared) {
        std::unique_ptr<std::vector<uint8_t>> owned(shared);
        if (held_bytes) *held_bytes -= bytes;
        if (pool) pool->give_back(std::move(*owned));
      });
}

}  // namespace slimkv
