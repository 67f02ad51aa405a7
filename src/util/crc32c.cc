#include "util/crc32c.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace slimkv {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // reflected

// --- polynomials mod P, reflected (bit 31 is x^0): what combining two CRCs takes ---------------------

// a(x) · b(x) mod P(x).
constexpr uint32_t multiply_mod_p(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = uint32_t(1) << 31; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = b & 1 ? (b >> 1) ^ kPolynomial : b >> 1;
  }
  return product;
}

// x^(2^k) mod P for k = 0..63.
constexpr std::array<uint32_t, 64> make_x_power_table() {
  std::array<uint32_t, 64> table{};
  uint32_t p = uint32_t(1) << 30;  // x^1
  for (uint32_t& entry : table) {
    entry = p;
    p = multiply_mod_p(p, p);
  }
  return table;
}
constexpr std::array<uint32_t, 64> kXPower = make_x_power_table();

// x^(8n) mod P: what n zero bytes appended multiply a CRC register by.
constexpr uint32_t x_power_of_bytes(uint64_t n) {
  uint32_t p = uint32_t(1) << 31;  // x^0
  for (int k = 3; n != 0; n >>= 1, ++k) {
    if (n & 1) p = multiply_mod_p(kXPower[size_t(k) & 63], p);
  }
  return p;
}

// --- the tables, slice-by-8 ---------------------------------------------------------------------

struct Crc32cTables {
  uint32_t table[8][256];  // table[s][b]: the CRC of byte b followed by s zero bytes
};

constexpr Crc32cTables make_tables() {
  Crc32cTables tables{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (kPolynomial & (0u - (crc & 1u)));
    tables.table[0][b] = crc;
  }
  for (int s = 1; s < 8; ++s) {
    for (uint32_t b = 0; b < 256; ++b) {
      const uint32_t previous = tables.table[s - 1][b];
      tables.table[s][b] = (previous >> 8) ^ tables.table[0][previous & 0xff];
    }
  }
  return tables;
}
constexpr Crc32cTables kTables = make_tables();

uint32_t load_u32(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }

#if defined(__x86_64__)
// SSE 4.2's crc32 instruction computes exactly this CRC, 8 bytes at a time. It takes 3 cycles and
// starts one a cycle, so three streams over three stripes run at once and are joined by
// multiply_mod_p (measured on this machine's Xeon: ~3x one stream, which is ~10x the tables).
// Compiled for the target, called only where the CPU has it.
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const uint8_t* data, size_t size, uint32_t crc) {
  constexpr size_t kStripe = 4096;
  static constexpr uint32_t kStripeShift = x_power_of_bytes(kStripe);
  const auto load_u64 = [](const uint8_t* p) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    return word;
  };
  uint64_t a = ~crc;
  for (; size >= 3 * kStripe; data += 3 * kStripe, size -= 3 * kStripe) {
    uint64_t b = 0, c = 0;
    for (size_t i = 0; i < kStripe; i += 8) {
      a = __builtin_ia32_crc32di(a, load_u64(data + i));
      b = __builtin_ia32_crc32di(b, load_u64(data + kStripe + i));
      c = __builtin_ia32_crc32di(c, load_u64(data + 2 * kStripe + i));
    }
    // The register after a stripe and then kStripe more bytes is its value times x^(8 kStripe), xor
    // what those bytes alone leave (the CRC is linear in the register and the data).
    a = multiply_mod_p(kStripeShift, uint32_t(a)) ^ uint32_t(b);
    a = multiply_mod_p(kStripeShift, uint32_t(a)) ^ uint32_t(c);
  }
  for (; size >= 8; data += 8, size -= 8) a = __builtin_ia32_crc32di(a, load_u64(data));
  uint32_t state = uint32_t(a);
  for (; size > 0; ++data, --size) state = __builtin_ia32_crc32qi(state, *data);
  return ~state;
}
#endif

}  // namespace

uint32_t crc32c_portable(const uint8_t* data, size_t size, uint32_t crc) {
  const auto& table = kTables.table;
  crc = ~crc;
  for (; size >= 8; data += 8, size -= 8) {  // 8 bytes per step: the 8 table lookups are independent
    const uint32_t low = crc ^ load_u32(data), high = load_u32(data + 4);
    crc = table[7][low & 0xff] ^ table[6][(low >> 8) & 0xff] ^ table[5][(low >> 16) & 0xff] ^ table[4][low >> 24] ^
          table[3][high & 0xff] ^ table[2][(high >> 8) & 0xff] ^ table[1][(high >> 16) & 0xff] ^ table[0][high >> 24];
  }
  for (; size > 0; ++data, --size) crc = (crc >> 8) ^ table[0][(crc ^ *data) & 0xff];
  return ~crc;
}

uint32_t crc32c(const uint8_t* data, size_t size, uint32_t crc) {
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  if (has_sse42) return crc32c_sse42(data, size, crc);
#endif
  return crc32c_portable(data, size, crc);
}

uint32_t crc32c_copy(uint8_t* dst, const uint8_t* src, size_t n, uint32_t crc) {
  constexpr size_t kPiece = size_t(64) << 10;  // well inside L2
  for (size_t done = 0; done < n; done += kPiece) {
    const size_t piece = std::min(kPiece, n - done);
    std::memcpy(dst + done, src + done, piece);
    crc = crc32c(dst + done, piece, crc);
  }
  return crc;
}

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t size_b) {
  // The initial value and final xor cancel: as zlib's crc32_combine.
  return multiply_mod_p(x_power_of_bytes(size_b), crc_a) ^ crc_b;
}

}  // namespace slimkv
