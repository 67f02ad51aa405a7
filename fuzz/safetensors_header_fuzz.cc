// Fuzzes the safetensors parser: any bytes must give either a validated tensor list whose every
// data byte lies inside the input (ASan checks as we touch them) and is aligned to its element
// size, or an error naming the source. Seeds: fuzz/corpus/safetensors_header_fuzz/.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "tensor/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto result = slimkv::parse_safetensors(data, size, "fuzz.safetensors");
  if (!result.has_value()) {
    if (result.status().message().find("fuzz.safetensors") == std::string::npos) std::abort();
    return 0;
  }
  uint8_t checksum = 0;
  for (const slimkv::TensorInfo& info : *result) {
    if (info.data == nullptr) std::abort();
    if (reinterpret_cast<uintptr_t>(info.data) % info.element_size_bytes != 0) std::abort();
    if (uint64_t(info.num_elements()) * info.element_size_bytes != info.size_bytes) std::abort();
    for (size_t i = 0; i < info.size_bytes; ++i) checksum ^= info.data[i];
  }
  volatile uint8_t sink = checksum;
  (void)sink;
  return 0;
}
