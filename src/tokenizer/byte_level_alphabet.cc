#include "tokenizer/byte_level_alphabet.h"

#include <array>
#include <string>

#include "tokenizer/utf8.h"

namespace slimkv::byte_level {
namespace {

struct Alphabet {
  std::array<std::string, 256> char_of_byte;  // UTF-8 of the character for each byte
  std::array<int16_t, 0x144> byte_of_char;    // indexed by code point < 0x144; -1 when unused

  Alphabet() {
    byte_of_char.fill(-1);
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    int next_extra = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t c = printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next_extra++);
      utf8::append(c, char_of_byte[b]);
      byte_of_char[c] = static_cast<int16_t>(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet instance;  // immutable after construction; thread-safe initialization
  return instance;
}

}  // namespace

std::string_view char_for_byte(uint8_t byte) { return alphabet().char_of_byte[byte]; }

int byte_for_char(char32_t c) { return c < 0x144 ? alphabet().byte_of_char[c] : -1; }

}  // namespace slimkv::byte_level
