// Transfer-sized byte buffers kept for reuse. A KV transfer's buffers (the sender's export, the
// receiver's assembly, gigabytes for a long prompt) were fresh memory every time, and first touching
// memory costs more than the copies and CRCs that fill it (the kernel zeroes each new page; on a VM
// the hypervisor backs it too: 0.8-4 GB/s, against ~9 GB/s for a copy). A worker keeps the buffers of
// its finished transfers here and takes them back for the next one, so a server's transfers after its
// first write into memory that is already there.
//
// Bounded: the buffers held (their capacity) never exceed max_bytes; a buffer given back beyond that
// is freed (the oldest held first make room). Buffers unused for longer than `idle` are freed by
// release_idle(), which a worker calls from a loop it already has. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

namespace slimkv {

class BufferPool {
 public:
  explicit BufferPool(size_t max_bytes, std::chrono::milliseconds idle = std::chrono::seconds(60));

  // A buffer whose capacity holds `bytes`: the smallest held one that does, with the size and bytes it
  // was given back with (a writer of every byte keeps them: assign_for_overwrite; others clear it),
  // else a new one with nothing allocated yet.
  std::vector<uint8_t> take(size_t bytes);
  // The largest buffer held (for a writer that learns its size only as it writes), or a new one.
  std::vector<uint8_t> take_largest();
  // Keeps `buffer` for a later take, within max_bytes.
  void give_back(std::vector<uint8_t> buffer);
  // Frees the buffers not taken for longer than `idle`.
  void release_idle();

  struct Stats {
    size_t held_bytes = 0;  // capacity of the buffers held now
    int held_buffers = 0;
    uint64_t reused_total = 0;   // takes served by a held buffer
    uint64_t fresh_total = 0;    // takes that found none that fits
    uint64_t dropped_total = 0;  // buffers freed: over the limit, or idle
  };
  Stats stats() const;
  size_t max_bytes() const { return max_bytes_; }

 private:
  struct Held {
    std::vector<uint8_t> buffer;
    std::chrono::steady_clock::time_point since;
  };
  std::vector<uint8_t> take_locked(std::list<Held>::iterator it);

  const size_t max_bytes_;
  const std::chrono::milliseconds idle_;
  mutable std::mutex mutex_;
  std::list<Held> held_;  // oldest given back first
  Stats stats_;
};

// `buffer` shared, given back to `pool` when the last holder lets go (no pool: just freed). For
// pieces of one buffer handed to another thread (a KV transfer's layers, sent as they are written).
// held_bytes (nullptr: none): holds the buffer's size while it is shared, for a caller whose memory
// budget must see what its pieces hold after they left (the engine's KV budget: Engine::kv_budget).
std::shared_ptr<const std::vector<uint8_t>> share_pooled(std::shared_ptr<BufferPool> pool, std::vector<uint8_t> buffer,
                                                         std::shared_ptr<std::atomic<uint64_t>> held_bytes = nullptr);

}  // namespace slimkv
