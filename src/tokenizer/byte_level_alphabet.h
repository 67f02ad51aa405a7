// GPT-2's byte-level alphabet: every byte is shown as one printable character (printable Latin-1
// bytes as themselves, the other 68 bytes as U+0100..U+0143), so BPE can work on any byte string.
#pragma once

#include <cstdint>
#include <string_view>

namespace slimkv::byte_level {

// The UTF-8 text of the character that stands for `byte`.
std::string_view char_for_byte(uint8_t byte);

// The byte that character `c` stands for, or -1 when `c` is not in the alphabet.
int byte_for_char(char32_t c);

}  // namespace slimkv::byte_level
