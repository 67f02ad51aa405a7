#include "util/json_error.h"

#include "slimkv/status.h"
#include "slimkv/untrusted_text.h"

namespace slimkv {

std::string json_syntax_error(std::string_view source, std::string_view text, size_t byte, std::string_view what) {
  // Line and column of the byte before `byte` (1-based; nlohmann points one past the offending byte).
  const size_t end = byte == 0 ? 0 : (byte - 1 < text.size() ? byte - 1 : text.size());
  size_t line = 1, column = 1;
  for (size_t i = 0; i < end; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  // nlohmann: "[json.exception.parse_error.101] parse error at line 1, column 2: syntax error while
  // parsing value - invalid literal; last read: '<raw bytes>'": keep the middle part only.
  std::string_view reason = what;
  if (const size_t colon = reason.find(": "); colon != std::string_view::npos) reason.remove_prefix(colon + 2);
  if (const size_t last_read = reason.find("; last read:"); last_read != std::string_view::npos) {
    reason = reason.substr(0, last_read);
  }
  const size_t context_begin = end >= 16 ? end - 16 : 0;
  return str_cat(source, ":", line, ":", column, ": not valid JSON: ", reason, " (near ",
                 quote_untrusted(text.substr(context_begin, end - context_begin + 1 > 32 ? 32 : end - context_begin + 1), 32),
                 ")");
}

}  // namespace slimkv
