// Fuzzes config.json parsing: any text must give either a ModelConfig whose derived sizes are
// consistent, or an error naming the source. Seeds: fuzz/corpus/model_config_fuzz/.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto result = slimkv::parse_model_config(text, "fuzz/config.json");
  if (!result.has_value()) {
    if (result.status().message().find("fuzz/config.json") == std::string::npos) std::abort();
    return 0;
  }
  const slimkv::ModelConfig& config = *result;
  if (config.hidden_size <= 0 || config.num_heads <= 0 || config.num_kv_heads <= 0 ||
      config.head_dim <= 0 || config.num_heads % config.num_kv_heads != 0 ||
      config.head_dim % 2 != 0 || config.vocab_size <= 0 || config.num_layers <= 0 ||
      config.intermediate_size <= 0 || config.max_position_embeddings <= 0 ||
      !(config.rms_norm_eps > 0) || !(config.rope.theta > 0)) {
    std::abort();
  }
  return 0;
}
