// The KV stream's bandwidth cap (transfer/token_bucket.h): never above the rate since its start, and
// time the sender lost elsewhere made up for (up to the burst), as a NIC draining its send buffer does.
#include "transfer/token_bucket.h"

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

namespace slimkv {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

constexpr double kBytesPerSecond = 50e6;  // 400 Mbit/s
constexpr size_t kSlice = size_t(64) << 10;

// Starts empty: what goes out from the start, back to back, takes at least its time at the rate.
TEST(TokenBucket, NeverAboveTheRateSinceItsStart) {
  TokenBucket bucket(kBytesPerSecond * 8);
  const Clock::time_point start = Clock::now();
  size_t taken = 0;
  for (int i = 0; i < 80; ++i) {  // 5.2 MB: more than the burst
    bucket.take(kSlice);
    taken += kSlice;
    EXPECT_GE(seconds_since(start), double(taken) / kBytesPerSecond * 0.999) << "after " << taken << " bytes";
  }
  EXPECT_GT(bucket.waited_seconds(), 0.0);
}

// A sender busy elsewhere for 40 ms (2 MB of link time, within the 4 MiB burst) gets that time back: the
// next 2 MB go at once, so its work overlapped the link instead of adding to it. Loose bound: a loaded
// CI machine may only be slower, and the 2 MB alone take 40 ms at the rate.
TEST(TokenBucket, TimeLostElsewhereIsMadeUpToTheBurst) {
  TokenBucket bucket(kBytesPerSecond * 8);
  bucket.take(kSlice);
  std::this_thread::sleep_for(40ms);
  const double waited = bucket.waited_seconds();
  for (int i = 0; i < 28; ++i) bucket.take(kSlice);  // 1.8 MB
  EXPECT_LT(bucket.waited_seconds() - waited, 0.010);
}

// Uncapped: never waits.
TEST(TokenBucket, UncappedNeverWaits) {
  TokenBucket bucket(0);
  EXPECT_FALSE(bucket.capped());
  for (int i = 0; i < 1000; ++i) bucket.take(size_t(1) << 30);
  EXPECT_EQ(bucket.waited_seconds(), 0.0);
}

}  // namespace
}  // namespace slimkv
