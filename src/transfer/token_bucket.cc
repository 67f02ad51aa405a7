#include "transfer/token_bucket.h"

#include <algorithm>
#include <thread>

namespace slimkv {

TokenBucket::TokenBucket(double bits_per_second, size_t burst_bytes)
    : bytes_per_second_(bits_per_second > 0 ? bits_per_second / 8.0 : 0.0),
      burst_bytes_(double(burst_bytes)),
      tokens_(0),
      last_(Clock::now()) {}

void TokenBucket::take(size_t bytes) {
  if (!capped()) return;
  const Clock::time_point now = Clock::now();
  tokens_ = std::min(burst_bytes_, tokens_ + std::chrono::duration<double>(now - last_).count() * bytes_per_second_);
  last_ = now;
  tokens_ -= double(bytes);
  // In debt: wait until the refill has paid it back, so the long-run rate is exactly the cap.
  if (tokens_ < 0) {
    const double wait = -tokens_ / bytes_per_second_;
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    waited_seconds_ += wait;
  }
}

}  // namespace slimkv
