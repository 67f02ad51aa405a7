// Timing for benchmarks: warm up, then repeat until at least `min_seconds` have passed and take the
// median, so a noisy machine moves the figure less. Variants of one run are printed side by side.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace slimkv {

inline double median_seconds(const std::function<void()>& run, double min_seconds = 0.5, int min_reps = 3) {
  using Clock = std::chrono::steady_clock;
  run();  // warm-up: page in weights, fill caches, start threads
  std::vector<double> times;
  const auto start = Clock::now();
  while (int(times.size()) < min_reps || std::chrono::duration<double>(Clock::now() - start).count() < min_seconds) {
    const auto t0 = Clock::now();
    run();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (times.size() >= 1000) break;
  }
  std::nth_element(times.begin(), times.begin() + long(times.size() / 2), times.end());
  return times[times.size() / 2];
}

}  // namespace slimkv
