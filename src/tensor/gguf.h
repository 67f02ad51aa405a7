// GGUF: the single-file model format of llama.cpp, Ollama and LM Studio (version 3; version 2 has the
// same layout and is read too).
//
// A file is, little-endian throughout:
//   magic "GGUF", u32 version, u64 tensor_count, u64 metadata_kv_count
//   metadata_kv_count × (string key, u32 value type, value)
//   tensor_count × (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset)
//   padding to general.alignment (default 32), then the data region; each tensor's offset is
//   relative to the data region and a multiple of the alignment.
// A string is a u64 length and that many bytes (UTF-8, no terminator). A value is one of the scalar
// types, a string, or an array (u32 element type, u64 count, the elements; arrays may nest).
// ne[0] is the innermost (fastest-varying) dimension: a ggml [ne0, ne1] matrix is a row-major
// [ne1, ne0] one, and `GgufTensor::shape` lists it the way safetensors does, outermost first.
//
// The whole file is mapped and every count, length, offset, size and type is checked against the
// file's length before a byte past the header is trusted; each error names the file and the field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "slimkv/status.h"
#include "tensor/ggml_type.h"
#include "util/mapped_file.h"

namespace slimkv {

enum class GgufValueType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6, kBool = 7,
  kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};
std::string_view gguf_value_type_name(GgufValueType type);

// One metadata value. Scalars: integers and bools in `integer` (a u64 above INT64_MAX is refused),
// floats in `real`, strings in `text`. Arrays: `element_type` and the elements in the field of that
// kind (`integers`, `reals`, `texts`, or `arrays` for nested arrays).
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  int64_t integer = 0;
  double real = 0;
  std::string text;
  GgufValueType element_type = GgufValueType::kUint8;
  std::vector<int64_t> integers;
  std::vector<double> reals;
  std::vector<std::string> texts;
  std::vector<GgufValue> arrays;

  bool is_integer() const;  // any integer type or bool
  bool is_real() const { return type == GgufValueType::kFloat32 || type == GgufValueType::kFloat64; }
  size_t array_size() const;
};

struct GgufTensor {
  std::string name;
  const GgmlType* type = nullptr;  // never null
  std::vector<int64_t> shape;      // outermost first: ggml's ne reversed
  uint64_t offset = 0;             // into the data region
  size_t size_bytes = 0;
  const uint8_t* data = nullptr;   // into the mapping (or the parsed buffer)
  int64_t num_elements() const;
};

struct GgufContents {
  uint32_t version = 0;
  std::map<std::string, GgufValue> metadata;
  std::vector<GgufTensor> tensors;  // in file order
  uint64_t alignment = 32;
  size_t data_offset = 0;  // where the data region starts in the file
};

// Parses and validates a GGUF file held in memory; `source` names it in errors. Tensor data points
// into `bytes`, which must outlive the result. Fuzzed (fuzz/gguf_fuzz.cc).
Expected<GgufContents> parse_gguf(const uint8_t* bytes, size_t size, const std::string& source);

// One memory-mapped GGUF file, with typed metadata lookups whose errors name the key.
class GgufFile {
 public:
  static Expected<GgufFile> open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const GgufContents& contents() const { return contents_; }
  const std::vector<GgufTensor>& tensors() const { return contents_.tensors; }
  const GgufValue* find(const std::string& key) const;  // nullptr when absent

  // The value of `key` as that kind; an error names the key and the type found.
  Expected<int64_t> get_int(const std::string& key) const;
  Expected<double> get_real(const std::string& key) const;  // a float, or an integer
  Expected<std::string> get_string(const std::string& key) const;
  // An array of that element kind.
  Expected<const std::vector<std::string>*> get_strings(const std::string& key) const;
  Expected<const std::vector<int64_t>*> get_ints(const std::string& key) const;
  Expected<const std::vector<double>*> get_reals(const std::string& key) const;

 private:
  Expected<const GgufValue*> get(const std::string& key) const;

  MappedFile file_;
  GgufContents contents_;
};

// Files that start with the GGUF magic (what `--model FILE.gguf` accepts whatever its name).
bool has_gguf_magic(const std::string& path);

}  // namespace slimkv
