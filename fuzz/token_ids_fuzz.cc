// Fuzzes token-id lists (`slimkv logits --tokens`, --tokens-file): any bytes give ids in [0, INT32_MAX]
// or an error naming the source whose echo of the input is escaped (no raw control byte).
// Seeds: fuzz/corpus/token_ids_fuzz/.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "slimkv/token_ids.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto ids = slimkv::parse_token_ids(text, "fuzz/tokens.txt");
  if (!ids.has_value()) {
    const std::string message = ids.status().message();  // a copy: status() returns by value
    if (message.find("fuzz/tokens.txt") == std::string::npos) std::abort();
    for (char c : message) {
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7F) std::abort();
    }
    if (message.size() > 400) std::abort();  // the echoed piece is cut
    return 0;
  }
  if (ids->empty()) std::abort();
  for (int32_t id : *ids) {
    if (id < 0) std::abort();
  }
  return 0;
}
