#include "util/buffer_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace slimkv {
namespace {

std::vector<uint8_t> filled(size_t bytes) { return std::vector<uint8_t>(bytes, 7); }

// A buffer given back is what the next take that fits gets: the same memory, emptied.
TEST(BufferPool, ReusesTheSmallestBufferThatFits) {
  BufferPool pool(1 << 20);
  std::vector<uint8_t> small = filled(1000), large = filled(5000);
  const uint8_t* small_data = small.data();
  const uint8_t* large_data = large.data();
  pool.give_back(std::move(large));
  pool.give_back(std::move(small));
  EXPECT_EQ(pool.stats().held_buffers, 2);
  std::vector<uint8_t> got = pool.take(800);
  EXPECT_EQ(got.data(), small_data);
  EXPECT_EQ(got.size(), 1000u);  // as given back: a writer of every byte need not clear it
  EXPECT_GE(got.capacity(), 1000u);
  // None held fits 6000: a new, unallocated buffer, and the one held stays.
  EXPECT_EQ(pool.take(6000).capacity(), 0u);
  EXPECT_EQ(pool.take_largest().data(), large_data);
  const BufferPool::Stats stats = pool.stats();
  EXPECT_EQ(stats.held_buffers, 0);
  EXPECT_EQ(stats.held_bytes, 0u);
  EXPECT_EQ(stats.reused_total, 2u);
  EXPECT_EQ(stats.fresh_total, 1u);
}

// The held capacity never exceeds the limit: the oldest go first, one larger than the limit is freed.
TEST(BufferPool, StaysWithinItsLimit) {
  BufferPool pool(10000);
  pool.give_back(filled(4000));
  pool.give_back(filled(4000));
  EXPECT_EQ(pool.stats().held_buffers, 2);
  pool.give_back(filled(5000));  // the first 4000 makes room
  BufferPool::Stats stats = pool.stats();
  EXPECT_EQ(stats.held_buffers, 2);
  EXPECT_LE(stats.held_bytes, 10000u);
  EXPECT_EQ(stats.dropped_total, 1u);
  pool.give_back(filled(20000));  // beyond the limit by itself: freed, nothing else dropped
  stats = pool.stats();
  EXPECT_EQ(stats.held_buffers, 2);
  EXPECT_EQ(stats.dropped_total, 2u);
  BufferPool none(0);  // a limit of 0 keeps nothing
  none.give_back(filled(10));
  EXPECT_EQ(none.stats().held_buffers, 0);
}

TEST(BufferPool, FreesBuffersIdleLongerThanItsIdleTime) {
  BufferPool pool(1 << 20, std::chrono::milliseconds(50));
  pool.give_back(filled(1000));
  pool.release_idle();
  EXPECT_EQ(pool.stats().held_buffers, 1);  // not idle long enough yet
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  pool.release_idle();
  EXPECT_EQ(pool.stats().held_buffers, 0);
  EXPECT_EQ(pool.stats().held_bytes, 0u);
}

// A shared buffer goes back when its last holder lets go.
TEST(BufferPool, SharedBufferGoesBackWithItsLastHolder) {
  auto pool = std::make_shared<BufferPool>(1 << 20);
  std::vector<uint8_t> bytes = filled(3000);
  const uint8_t* data = bytes.data();
  auto first = share_pooled(pool, std::move(bytes));
  auto second = first;
  first.reset();
  EXPECT_EQ(pool->stats().held_buffers, 0);
  second.reset();
  EXPECT_EQ(pool->stats().held_buffers, 1);
  EXPECT_EQ(pool->take(3000).data(), data);
}

// Threads taking and giving back at once (a receiver's streams and a scheduler's imports): every buffer
// is accounted for, none is handed to two takers, and the limit holds.
TEST(BufferPool, ConcurrentTakersEachGetTheirOwnBuffer) {
  BufferPool pool(64 * 4096);
  constexpr int kThreads = 4, kRounds = 200;
  std::vector<std::thread> threads;
  std::atomic<int> clobbered{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        const size_t bytes = 1024 * size_t(1 + (t * 7 + r) % 16);
        std::vector<uint8_t> buffer = pool.take(bytes);
        buffer.assign(bytes, uint8_t(t));
        std::this_thread::yield();
        for (const uint8_t b : buffer) clobbered += b != uint8_t(t);
        pool.give_back(std::move(buffer));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(clobbered.load(), 0);
  const BufferPool::Stats stats = pool.stats();
  EXPECT_EQ(stats.reused_total + stats.fresh_total, uint64_t(kThreads * kRounds));
  EXPECT_GT(stats.reused_total, 0u);
  EXPECT_LE(stats.held_bytes, pool.max_bytes());
  // Every buffer made (a fresh take) is held or was dropped: none lost, none handed out twice.
  EXPECT_EQ(uint64_t(stats.held_buffers), stats.fresh_total - stats.dropped_total);
}

}  // namespace
}  // namespace slimkv
