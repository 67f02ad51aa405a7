// Echoing bytes a user or a file gave us inside an error message: quoted, escaped and cut, so that binary
// junk or a megabyte line never reaches the terminal raw.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace slimkv {

// `bytes` in double quotes, at most `max_bytes` of it: printable ASCII as is (\" and \\ escaped), \n \r
// \t as such, every other byte (control, DEL, non-ASCII) as \xHH; a cut one ends in "..." and says
// how many bytes were left out, e.g. "abc\x01"... (1000 more bytes).
std::string quote_untrusted(std::string_view bytes, size_t max_bytes = 64);

}  // namespace slimkv
