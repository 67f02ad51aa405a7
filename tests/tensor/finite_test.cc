// first_non_finite on the raw bits of each stored dtype: NaN, ±Inf found at any position (also in a
// later chunk), the largest finite values and denormals not flagged.
#include "tensor/finite.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace slimkv {
namespace {

template <typename Bits>
std::vector<uint8_t> bytes_of(const std::vector<Bits>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(Bits));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

struct Case {
  DType dtype;
  uint32_t fill;       // a finite value (the largest finite one: exponent one below all ones)
  uint32_t planted;    // NaN or Inf bits
  const char* name;    // what non_finite_name must say
};

TEST(Finite, FindsFirstNonFiniteOfEachDtype) {
  const Case cases[] = {
      {DType::kF32, 0x7F7FFFFFu, 0x7FC00000u, "NaN"},  {DType::kF32, 0xFF7FFFFFu, 0xFF800000u, "-Inf"},
      {DType::kF32, 0x00000001u, 0x7F800000u, "+Inf"}, {DType::kF16, 0x7BFFu, 0x7E00u, "NaN"},
      {DType::kF16, 0xFBFFu, 0xFC00u, "-Inf"},         {DType::kF16, 0x0001u, 0x7C00u, "+Inf"},
      {DType::kBF16, 0x7F7Fu, 0x7FC0u, "NaN"},         {DType::kBF16, 0xFF7Fu, 0xFF80u, "-Inf"},
      {DType::kBF16, 0x0001u, 0x7F80u, "+Inf"},
  };
  for (const Case& c : cases) {
    for (size_t count : {size_t(1), size_t(7), size_t(4096), size_t(10001)}) {
      for (size_t at : {size_t(0), count / 2, count - 1}) {
        const std::string label = std::string(dtype_name(c.dtype)) + " " + c.name + " count=" +
                                  std::to_string(count) + " at=" + std::to_string(at);
        std::vector<uint8_t> data;
        if (c.dtype == DType::kF32) {
          std::vector<uint32_t> values(count, c.fill);
          EXPECT_EQ(first_non_finite(bytes_of(values).data(), c.dtype, count), -1) << label;
          values[at] = c.planted;
          data = bytes_of(values);
        } else {
          std::vector<uint16_t> values(count, uint16_t(c.fill));
          EXPECT_EQ(first_non_finite(bytes_of(values).data(), c.dtype, count), -1) << label;
          values[at] = uint16_t(c.planted);
          data = bytes_of(values);
        }
        EXPECT_EQ(first_non_finite(data.data(), c.dtype, count), int64_t(at)) << label;
        EXPECT_STREQ(non_finite_name(data.data(), c.dtype, at), c.name) << label;
      }
    }
  }
  EXPECT_EQ(first_non_finite(nullptr, DType::kF32, 0), -1);
}

}  // namespace
}  // namespace slimkv
