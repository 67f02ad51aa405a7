// Fuzzes the GGUF parser: any bytes must give either validated contents whose every tensor byte lies
// inside the input (ASan checks as we touch them), aligned for its scales, with a size that matches
// its shape and type, or an error naming the source. Supported quantized tensors are dequantized by
// the reference, which reads every block. Seeds: fuzz/corpus/gguf_fuzz/ (scripts/gguf/make_fixtures.py).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "tensor/gguf.h"

namespace {

slimkv::BlockQuant block_quant(uint32_t id) {
  switch (id) {
    case slimkv::kGgmlQ8_0: return slimkv::BlockQuant::kQ8_0;
    case slimkv::kGgmlQ4_0: return slimkv::BlockQuant::kQ4_0;
    case slimkv::kGgmlQ4_K: return slimkv::BlockQuant::kQ4_K;
    case slimkv::kGgmlQ6_K: return slimkv::BlockQuant::kQ6_K;
    default: return slimkv::BlockQuant::kNone;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto result = slimkv::parse_gguf(data, size, "fuzz.gguf");
  if (!result.has_value()) {
    if (result.status().message().find("fuzz.gguf") == std::string::npos) std::abort();
    return 0;
  }
  uint8_t checksum = 0;
  std::vector<float> values;
  for (const slimkv::GgufTensor& tensor : result->tensors) {
    if (tensor.type == nullptr || tensor.data == nullptr) std::abort();
    if (tensor.data < data || tensor.data + tensor.size_bytes > data + size) std::abort();
    if (uint64_t(tensor.num_elements()) / uint64_t(tensor.type->block_elements) * tensor.type->block_bytes !=
        tensor.size_bytes) {
      std::abort();
    }
    for (size_t i = 0; i < tensor.size_bytes; ++i) checksum ^= tensor.data[i];
    const slimkv::BlockQuant quant = block_quant(tensor.type->id);
    if (quant != slimkv::BlockQuant::kNone && tensor.num_elements() <= (int64_t(1) << 16)) {
      values.resize(size_t(tensor.num_elements()));
      slimkv::dequantize_reference(quant, tensor.data, values.data(), tensor.num_elements());
    }
  }
  volatile uint8_t sink = checksum;
  (void)sink;
  return 0;
}
