// A token bucket: caps the rate at which a sender hands bytes to its socket, so that one machine can
// measure the link-bandwidth-bound regimes of disaggregated serving (HACK §6: 1–100 Gbit/s) without a
// real link of that speed. Bytes may go out in a burst of up to `burst_bytes`; beyond it, take() waits
// until the average since the start is back at the rate.
#pragma once

#include <chrono>
#include <cstddef>

namespace slimkv {

class TokenBucket {
 public:
  // bits_per_second <= 0: no cap (take() never waits).
  explicit TokenBucket(double bits_per_second, size_t burst_bytes = size_t(256) << 10);

  // Takes `bytes` from the bucket, first sleeping as long as the rate needs.
  void take(size_t bytes);
  bool capped() const { return bytes_per_second_ > 0; }
  // The time take() has slept for the cap so far (a stream's share of waiting on the link).
  double waited_seconds() const { return waited_seconds_; }

 private:
  using Clock = std::chrono::steady_clock;
  double bytes_per_second_ = 0;
  double burst_bytes_ = 0;
  double tokens_ = 0;  // bytes that may go out now; negative: owed (take() sleeps them off)
  Clock::time_point last_;
  double waited_seconds_ = 0;
};

}  // namespace slimkv
