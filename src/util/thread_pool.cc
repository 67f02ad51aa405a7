#include "util/thread_pool.h"

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
  while (generation_of(current) == generation && int64_t(current & 0xffffffffu) < n_tasks_.load(std::memory_order_relaxed)) {
    if (next_.compare_exchange_weak(current, current + 1, std::memory_order_acq_rel)) {
      return int64_t(current & 0xffffffffu);
    }
  }
  return -1;
}

void ThreadPool::run(int64_t n_tasks, const std::function<void(int64_t task, int thread)>& task) {
  if (n_tasks <= 0) return;
  if (workers_.empty() || n_tasks == 1) {
    for (int64_t i = 0; i < n_tasks; ++i) task(i, 0);
    return;
  }
  uint32_t generation;
  {
    std::lock_guard lock(mutex_);
    generation = generation_of(next_.load()) + 1;
    task_ = &task;
    n_tasks_.store(n_tasks, std::memory_order_relaxed);
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
