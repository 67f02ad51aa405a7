// UTF-8 decoding and encoding as Rust's `str`/`String` see text: every tokenizer stage works on
// valid UTF-8, so untrusted bytes are made valid once, at the boundary (`make_valid_utf8`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace slimkv::utf8 {

// The code point starting at text[pos] of valid UTF-8, and its length in bytes (1..4).
struct DecodedChar {
  char32_t code_point;
  size_t size_bytes;
};
DecodedChar decode_at(std::string_view text, size_t pos);

// Number of bytes of the UTF-8 sequence that starts with `lead_byte` (1 for a stray byte).
inline size_t sequence_size(unsigned char lead_byte) {
  if (lead_byte < 0x80) return 1;
  if (lead_byte >= 0xF0) return 4;
  if (lead_byte >= 0xE0) return 3;
  if (lead_byte >= 0xC0) return 2;
  return 1;
}

// Appends the UTF-8 encoding of `code_point` (a Unicode scalar value) to `out`.
void append(char32_t code_point, std::string& out);

// True when `text` is valid UTF-8 (shortest form, no surrogates, at most U+10FFFF).
bool is_valid(std::string_view text);

// Length of the longest prefix of `text` that is valid UTF-8.
size_t valid_prefix_size(std::string_view text);

// `text` with every maximal invalid subsequence replaced by U+FFFD, exactly as Rust's
// String::from_utf8_lossy does (which is what HF tokenizers' decoders use).
std::string make_valid_utf8(std::string_view text);

// The replacement character U+FFFD in UTF-8.
inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

}  // namespace slimkv::utf8
