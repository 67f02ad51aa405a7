#include "util/thread_pool.h"

#include <algorithm>
#include <chrono>

namespace slimkv {
namespace {

constexpr int kSpinsBeforeSleep = 20000;  // ~tens of µs of polling between loops of a forward pass

uint32_t generation_of(uint64_t next) { return uint32_t(next >> 32); }

}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int t = 1; t < threads; ++t) workers_.emplace_back([this, t] { work(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

int64_t ThreadPool::take(uint32_t generation) {
  uint64_t current = next_.load(std::memory_order_acquire);
  // The count of this generation's loop or none: run() posts a loop's count before its first index,
  // so a worker whose loop just ended cannot pair its exhausted index with the next loop's larger count
  // (it then ran a task past its loop's end through the ended loop's task, gone with its caller: a
  // segfault seen once in an hours-long eval).
  const uint64_t loop = loop_.load(std::memory_order_acquire);
  if (generation_of(loop) != generation) return -1;
  const int64_t n_tasks = int64_t(loop & 0xffffffffu);
  while (generation_of(current) == generation && int64_t(current & 0xffffffffu) < n_tasks) {
    if (next_.compare_exchange_weak(current, current + 1, std::memory_order_acq_rel)) {
      return int64_t(current & 0xffffffffu);
    }
  }
  return -1;
}

void ThreadPool::run(int64_t n_tasks, const std::function<void(int64_t task, int thread)>& task) {
  if (n_tasks <= 0) return;
  if (n_tasks > int64_t(0xffffffffu)) {  // task indices are 32 bits of next_: run it in parts
    for (int64_t first = 0; first < n_tasks; first += 0xffffffffu) {
      const int64_t count = std::min<int64_t>(0xffffffffu, n_tasks - first);
      run(count, [&](int64_t i, int thread) { task(first + i, thread); });
    }
    return;
  }
  if (workers_.empty() || n_tasks == 1) {
    for (int64_t i = 0; i < n_tasks; ++i) task(i, 0);
    return;
  }
  uint32_t generation;
  {
    std::lock_guard lock(mutex_);
    generation = generation_of(next_.load()) + 1;
    task_ = &task;
    loop_.store(uint64_t(generation) << 32 | uint64_t(n_tasks), std::memory_order_release);
    finished_.store(0, std::memory_order_relaxed);
    next_.store(uint64_t(generation) << 32, std::memory_order_release);
  }
  wake_.notify_all();
  for (int64_t i; (i = take(generation)) >= 0;) {
    task(i, 0);
    finished_.fetch_add(1, std::memory_order_acq_rel);
  }
  // Wait only for tasks that workers took and are still running.
  while (finished_.load(std::memory_order_acquire) < n_tasks) std::this_thread::yield();
}

void ThreadPool::work(int thread) {
  uint32_t seen = 0;
  while (true) {
    // Spin a little for the next loop, then sleep until one is posted.
    for (int spin = 0; spin < kSpinsBeforeSleep && generation_of(next_.load(std::memory_order_acquire)) == seen; ++spin) {
      if (spin % 64 == 63) std::this_thread::yield();
    }
    const std::function<void(int64_t, int)>* task;
    uint32_t generation;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_of(next_.load()) != seen; });
      if (stop_) return;
      generation = generation_of(next_.load());
      task = task_;
    }
    seen = generation;
    for (int64_t i; (i = take(generation)) >= 0;) {
      (*task)(i, thread);
      finished_.fetch_add(1, std::memory_order_acq_rel);
    }
  }
}

}  // namespace slimkv
