// backend/cuda/device_checksum.h against a scalar reference of its definition (every length 0..2·8+1
// and a large odd one), and that it changes when one bit flips or two words swap.
#include <gtest/gtest.h>

#include <random>
#include <utility>

#include "backend/cuda/device_checksum.h"
#include "cuda_test_util.h"

namespace slimkv::cuda {
namespace {

// The definition, word by word: splitmix64's finalizer of (word ^ mix(index + golden ratio)), summed,
// plus mix(length); the last partial word zero-padded.
uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t reference_checksum(const std::vector<uint8_t>& bytes) {
  uint64_t sum = 0;
  for (size_t i = 0; i * 8 < bytes.size(); ++i) {
    uint64_t word = 0;
    for (size_t b = 0; b < 8 && i * 8 + b < bytes.size(); ++b) word |= uint64_t(bytes[i * 8 + b]) << (8 * b);
    sum += mix64(word ^ mix64(i + 0x9e3779b97f4a7c15ull));
  }
  return sum + mix64(uint64_t(bytes.size()));
}

uint64_t checksum_on_gpu(const std::vector<uint8_t>& bytes) {
  auto device = on_device(bytes);
  return take(device_checksum(device.data(), bytes.size()));
}

using DeviceChecksumTest = CudaTest;

TEST_F(DeviceChecksumTest, MatchesTheReferenceForEveryTailLength) {
  const unsigned seed = 20261127;
  std::mt19937 rng(seed);
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 17; ++n) lengths.push_back(n);
  lengths.push_back((size_t(1) << 22) + 5);
  for (const size_t n : lengths) {
    SCOPED_TRACE(str_cat("checksum(bytes=", n, ", seed=", seed, ")"));
    std::vector<uint8_t> bytes(n);
    for (uint8_t& b : bytes) b = uint8_t(rng());
    EXPECT_EQ(checksum_on_gpu(bytes), reference_checksum(bytes));
  }
}

TEST_F(DeviceChecksumTest, ChangesWhenABitFlipsOrTwoWordsSwap) {
  std::mt19937 rng(7);
  std::vector<uint8_t> bytes(size_t(1) << 20);
  for (uint8_t& b : bytes) b = uint8_t(rng());
  const uint64_t original = checksum_on_gpu(bytes);
  std::vector<uint8_t> flipped = bytes;
  flipped[123457] ^= 0x10;
  EXPECT_NE(checksum_on_gpu(flipped), original);
  std::vector<uint8_t> swapped = bytes;
  for (size_t b = 0; b < 8; ++b) std::swap(swapped[8 * 10 + b], swapped[8 * 5000 + b]);
  EXPECT_NE(checksum_on_gpu(swapped), original);
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);  // a zero byte more: the length is part of it
  EXPECT_NE(checksum_on_gpu(longer), original);
}

}  // namespace
}  // namespace slimkv::cuda
