// Fuzzes model.safetensors.index.json parsing (parse_shard_index): any text gives a weight map of
// plain shard file names (no '/', '.', '..': nothing outside the model directory) or an error naming
// the index. Seeds: fuzz/corpus/shard_index_fuzz/.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "model/weight_store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto map = slimkv::parse_shard_index(text, "fuzz/model.safetensors.index.json");
  if (!map.has_value()) {
    if (map.status().message().find("fuzz/model.safetensors.index.json") == std::string::npos) std::abort();
    return 0;
  }
  if (map->empty()) std::abort();
  for (const auto& [tensor, shard] : *map) {
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
        shard.find('\0') != std::string::npos) {
      std::abort();
    }
  }
  return 0;
}
