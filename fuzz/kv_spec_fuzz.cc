// Fuzzes the KV spec grammar and factory (parse_kv_spec, make_kv_pipeline): any text must give a
// pipeline or an error that names the spec, never a crash. Seeds: fuzz/corpus/kv_spec_fuzz/.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kv/kv_factory.h"
#include "slimkv/kv_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;  // specs are one line; longer inputs only slow the search
  const std::string spec(reinterpret_cast<const char*>(data), size);
  auto config = slimkv::parse_kv_spec(spec);
  if (!config.has_value()) {
    if (config.status().message().find("KV spec") == std::string::npos) std::abort();
    return 0;
  }
  if (config->stages.empty()) std::abort();  // a parsed spec has at least one stage
  auto pipeline = slimkv::make_kv_pipeline(*config);
  if (!pipeline.has_value() && pipeline.status().message().empty()) std::abort();
  return 0;
}
