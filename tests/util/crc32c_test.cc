// CRC-32C: the standard check values, the hardware path against the tables on every length and
// misalignment around its stripes, and combining two CRCs against the CRC of the joined bytes.
#include "util/crc32c.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace slimkv {
namespace {

TEST(Crc32c, MatchesTheStandardCheckValues) {
  const std::string text = "123456789";
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  EXPECT_EQ(crc32c(bytes, text.size()), 0xE3069283u);
  EXPECT_EQ(crc32c_portable(bytes, text.size()), 0xE3069283u);
  const std::vector<uint8_t> zeros(32, 0), ones(32, 0xff);  // RFC 3720 B.4
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
}

TEST(Crc32c, EqualsTheTablesOnEveryLengthAndAlignment) {
  const unsigned seed = 20261127u;
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<uint8_t> data(3 * 4096 * 3 + 200);
  for (uint8_t& b : data) b = uint8_t(rng());
  // Lengths around one and two rounds of the three 4096-byte stripes, at every offset mod 8.
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 64; ++n) lengths.push_back(n);
  for (const size_t round : {size_t(3 * 4096), size_t(6 * 4096)}) {
    for (size_t n = round - 9; n <= round + 9; ++n) lengths.push_back(n);
  }
  for (const size_t n : lengths) {
    for (size_t offset = 0; offset < 8; ++offset) {
      const uint32_t start = uint32_t(rng());
      EXPECT_EQ(crc32c(data.data() + offset, n, start), crc32c_portable(data.data() + offset, n, start))
          << "length " << n << " offset " << offset;
    }
  }
}

TEST(Crc32c, CombinesAsTheJoinedBytes) {
  std::mt19937 rng(5);
  std::vector<uint8_t> data(40000);
  for (uint8_t& b : data) b = uint8_t(rng());
  for (const size_t split : {size_t(0), size_t(1), size_t(7), size_t(4096), size_t(12289), size_t(39999), size_t(40000)}) {
    const uint32_t a = crc32c(data.data(), split), b = crc32c(data.data() + split, data.size() - split);
    EXPECT_EQ(crc32c_combine(a, b, data.size() - split), crc32c(data.data(), data.size())) << "split " << split;
  }
  EXPECT_EQ(crc32c_combine(0x12345678u, 0, 0), 0x12345678u);  // nothing appended
}

}  // namespace
}  // namespace slimkv
