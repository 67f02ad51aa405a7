#include "util/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

namespace slimkv {
namespace {

// Every task of every loop runs once, on a thread index below threads(), and never a task of a loop
// that has ended: loops of different sizes back to back (a worker still leaving one loop must not take
// an index of its own, ended, loop that a newer, longer loop's count would allow). Each loop's task
// outlives the test so that a stray call is counted, not a crash.
TEST(ThreadPool, EveryTaskOfEveryLoopRunsOnceAndNoneAfterItsLoop) {
  constexpr int kThreads = 4, kLoops = 20000;
  // Declared before the pool: they outlive its workers.
  std::vector<std::unique_ptr<std::atomic<int>[]>> runs(kLoops);
  std::vector<std::unique_ptr<std::atomic<bool>>> ended(kLoops);
  std::vector<std::function<void(int64_t, int)>> tasks(kLoops);
  std::atomic<int> stray{0}, bad_thread{0};
  ThreadPool pool(kThreads);
  for (int loop = 0; loop < kLoops; ++loop) {
    const int n = 1 + loop % 7 * (loop % 3 == 0 ? 5 : 1);  // sizes 1..31, short and long loops mixed
    runs[size_t(loop)] = std::make_unique<std::atomic<int>[]>(size_t(n));
    ended[size_t(loop)] = std::make_unique<std::atomic<bool>>(false);
    tasks[size_t(loop)] = [&, loop, n](int64_t i, int thread) {
      if (ended[size_t(loop)]->load() || i >= n) {
        stray.fetch_add(1);
        return;
      }
      if (thread < 0 || thread >= kThreads) bad_thread.fetch_add(1);
      runs[size_t(loop)][size_t(i)].fetch_add(1);
    };
    pool.run(n, tasks[size_t(loop)]);
    ended[size_t(loop)]->store(true);
    for (int i = 0; i < n; ++i) ASSERT_EQ(runs[size_t(loop)][size_t(i)].load(), 1) << "loop " << loop << " task " << i;
  }
  EXPECT_EQ(stray.load(), 0);
  EXPECT_EQ(bad_thread.load(), 0);
}

}  // namespace
}  // namespace slimkv
