#include "slimkv/untrusted_text.h"

#include <cstdio>

namespace slimkv {

std::string quote_untrusted(std::string_view bytes, size_t max_bytes) {
  const size_t shown = bytes.size() < max_bytes ? bytes.size() : max_bytes;
  std::string out = "\"";
  for (size_t i = 0; i < shown; ++i) {
    const unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c >= 0x20 && c < 0x7F) {
      out += char(c);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof(hex), "\\x%02X", c);
      out += hex;
    }
  }
  out += '"';
  if (shown < bytes.size()) out += "... (" + std::to_string(bytes.size() - shown) + " more bytes)";
  return out;
}

}  // namespace slimkv
