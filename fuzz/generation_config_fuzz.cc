// Fuzzes generation_config.json parsing (parse_generation_config): any text gives defaults within the
// sampler's ranges or an error naming the file. Seeds: fuzz/corpus/generation_config_fuzz/.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "slimkv/engine.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto defaults = slimkv::parse_generation_config(text, "fuzz/generation_config.json", {2});
  if (!defaults.has_value()) {
    if (defaults.status().message().find("fuzz/generation_config.json") == std::string::npos) std::abort();
    return 0;
  }
  if (!(defaults->temperature >= 0) || !std::isfinite(defaults->temperature) || defaults->top_k < 0 ||
      !(defaults->top_p >= 0 && defaults->top_p <= 1)) {
    std::abort();
  }
  return 0;
}
