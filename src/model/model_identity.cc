#include "model/model_identity.h"

#include <algorithm>
#include <cstdio>

#include "tensor/gguf.h"
#include "util/mapped_file.h"

namespace slimkv {
namespace {

// FNV-1a, 64 bit: simple and stable across platforms (a fingerprint, not a defence against forgery).
class Fnv1a64 {
 public:
  void add(const void* data, size_t size) {
    const auto* bytes = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < size; ++i) hash_ = (hash_ ^ bytes[i]) * 0x100000001b3ull;
  }
  void add(const std::string& text) { add(text.data(), text.size() + 1); }  // with its terminator
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

}  // namespace

Expected<std::string> model_identity(const std::string& model_dir, const WeightStore& weights) {
  constexpr size_t kSampleBytes = 4096;
  // A GGUF file's config is its metadata; its tensors (names, shapes, samples) stand for it here.
  std::string config = "gguf";
  if (!has_gguf_magic(model_dir)) {
    SLIMKV_ASSIGN_OR_RETURN(config, read_text_file(model_dir + "/config.json"));
  }
  Fnv1a64 hash;
  hash.add(config);
  for (const std::string& name : weights.names()) {
    const TensorInfo& tensor = *weights.find(name);
    hash.add(name);
    hash.add(tensor.stored_dtype);
    for (int64_t dim : tensor.shape) hash.add(&dim, sizeof(dim));
    const size_t head = std::min(kSampleBytes, tensor.size_bytes);
    hash.add(tensor.data, head);
    hash.add(tensor.data + tensor.size_bytes - head, head);
  }
  char text[32];
  std::snprintf(text, sizeof(text), "fnv1a64:%016llx", static_cast<unsigned long long>(hash.value()));
  return std::string(text);
}

}  // namespace slimkv
