// A token bucket: caps the rate at which a sender hands bytes to its socket, so that one machine can
// measure the link-bandwidth-bound regimes of disaggregated serving (HACK §6: 1–100 Gbit/s) without a
// real link of that speed. It starts empty and fills at the rate, so the bytes taken since its start
// never exceed rate × time (plus the take in progress). Time the sender spends elsewhere (a receiver
// that is slow for a moment, the sender's own work between writes, a descheduled thread) fills it up
// to `burst_bytes`, which later takes spend at once: a real NIC keeps draining its socket's send buffer
// (Linux's tcp_wmem grows it to 4 MiB) while the sending thread is busy, so the hosts' work overlaps
// the wire's time instead of adding to it. (With a 256 KiB bucket, full from the start, any stall over
// 0.2 ms at 10 Gbit/s was lost for good: a capped stream took its host time plus its wire time,
// docs/disaggregated.md, "Where the overlap went".)
#pragma once

#include <chrono>
#include <cstddef>

namespace slimkv {

class TokenBucket {
 public:
  // bits_per_second <= 0: no cap (take() never waits).
  explicit TokenBucket(double bits_per_second, size_t burst_bytes = size_t(4) << 20);

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
