#include "slimkv/token_ids.h"

#include <cstdint>

#include "slimkv/untrusted_text.h"

namespace slimkv {
namespace {

bool is_separator(char c) { return c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

}  // namespace

Expected<std::vector<int32_t>> parse_token_ids(std::string_view text, const std::string& source) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    if (is_separator(text[i])) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < text.size() && !is_separator(text[end])) ++end;
    const std::string_view piece = text.substr(i, end - i);
    // Digits only (no sign, no "0x"), accumulated with an overflow check: stoll would accept "+1"
    // and leading whitespace, and throw on a long run of digits.
    int64_t value = 0;
    bool valid = true;
    for (const char c : piece) {
      if (c < '0' || c > '9' || value > (int64_t(INT32_MAX) - (c - '0')) / 10) {
        valid = false;
        break;
      }
      value = value * 10 + (c - '0');
    }
    if (!valid) {
      return error(source, ": ", quote_untrusted(piece), " (at byte ", i,
                   ") is not a token id: expected integers in [0, ", INT32_MAX,
                   "] separated by commas or whitespace");
    }
    ids.push_back(int32_t(value));
    i = end;
  }
  if (ids.empty()) {
    return error(source, ": no token ids (", text.empty() ? "it is empty" : "only separators",
                 "; expected integers separated by commas or whitespace)");
  }
  return ids;
}

}  // namespace slimkv
