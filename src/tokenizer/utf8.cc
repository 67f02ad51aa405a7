#include "tokenizer/utf8.h"

namespace slimkv::utf8 {
namespace {

// Length of the valid sequence at text[pos], or 0 when the bytes there are not valid UTF-8.
// Follows the Unicode table of well-formed byte sequences (Table 3-7).
size_t valid_sequence_size(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char b0 = byte(pos);
  const size_t remaining = text.size() - pos;
  if (b0 < 0x80) return 1;
  auto continuation = [&](size_t i, unsigned char low, unsigned char high) {
    return i < remaining && byte(pos + i) >= low && byte(pos + i) <= high;
  };
  if (b0 >= 0xC2 && b0 <= 0xDF) return continuation(1, 0x80, 0xBF) ? 2 : 0;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    const unsigned char low = b0 == 0xE0 ? 0xA0 : 0x80;
    const unsigned char high = b0 == 0xED ? 0x9F : 0xBF;
    return continuation(1, low, high) && continuation(2, 0x80, 0xBF) ? 3 : 0;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    const unsigned char low = b0 == 0xF0 ? 0x90 : 0x80;
    const unsigned char high = b0 == 0xF4 ? 0x8F : 0xBF;
    return continuation(1, low, high) && continuation(2, 0x80, 0xBF) && continuation(3, 0x80, 0xBF)
               ? 4
               : 0;
  }
  return 0;
}

// Length of the maximal prefix of an invalid sequence at text[pos] (at least 1): the bytes that
// from_utf8_lossy replaces by one U+FFFD.
size_t invalid_sequence_size(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char b0 = byte(pos);
  const size_t remaining = text.size() - pos;
  unsigned char low = 0x80, high = 0xBF;
  size_t needed = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    needed = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    needed = 2;
    if (b0 == 0xE0) low = 0xA0;
    if (b0 == 0xED) high = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    needed = 3;
    if (b0 == 0xF0) low = 0x90;
    if (b0 == 0xF4) high = 0x8F;
  } else {
    return 1;
  }
  size_t size = 1;
  for (size_t i = 1; i <= needed && i < remaining; ++i) {
    const unsigned char b = byte(pos + i);
    const unsigned char lo = i == 1 ? low : 0x80;
    const unsigned char hi = i == 1 ? high : 0xBF;
    if (b < lo || b > hi) break;
    ++size;
  }
  return size;
}

}  // namespace

DecodedChar decode_at(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<char32_t>(static_cast<unsigned char>(text[i])); };
  const char32_t b0 = byte(pos);
  const size_t size = sequence_size(static_cast<unsigned char>(b0));
  if (size == 1 || pos + size > text.size()) return {b0, 1};
  if (size == 2) return {((b0 & 0x1F) << 6) | (byte(pos + 1) & 0x3F), 2};
  if (size == 3) return {((b0 & 0x0F) << 12) | ((byte(pos + 1) & 0x3F) << 6) | (byte(pos + 2) & 0x3F), 3};
  return {((b0 & 0x07) << 18) | ((byte(pos + 1) & 0x3F) << 12) | ((byte(pos + 2) & 0x3F) << 6) |
              (byte(pos + 3) & 0x3F),
          4};
}

void append(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t valid_prefix_size(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t size = valid_sequence_size(text, pos);
    if (size == 0) break;
    pos += size;
  }
  return pos;
}

bool is_valid(std::string_view text) { return valid_prefix_size(text) == text.size(); }

std::string make_valid_utf8(std::string_view text) {
  size_t pos = valid_prefix_size(text);
  if (pos == text.size()) return std::string(text);
  std::string out(text.substr(0, pos));
  out.reserve(text.size() + 8);
  while (pos < text.size()) {
    const size_t size = valid_sequence_size(text, pos);
    if (size > 0) {
      out.append(text.substr(pos, size));
      pos += size;
    } else {
      out.append(kReplacementChar);
      pos += invalid_sequence_size(text, pos);
    }
  }
  return out;
}

}  // namespace slimkv::utf8
