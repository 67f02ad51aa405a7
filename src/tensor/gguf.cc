#include "tensor/gguf.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

namespace slimkv {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint32_t kMaxDims = 4;         // GGML_MAX_DIMS
// Nested arrays deeper than this are a hostile file, not a model (real files nest none).
constexpr int kMaxArrayDepth = 8;

// A cursor over the header that refuses to read past the end, naming what it was reading.
class Reader {
 public:
  Reader(const uint8_t* bytes, size_t size, const std::string& source) : bytes_(bytes), size_(size), source_(source) {}

  size_t position() const { return position_; }
  size_t remaining() const { return size_ - position_; }

  template <typename T>
  Status read(T* out, const std::string& field) {
    if (remaining() < sizeof(T)) {
      return error(source_, ": ", field, ": expected ", sizeof(T), " bytes at offset ", position_, ", but the file ends at ",
                   size_, " (truncated file?)");
    }
    std::memcpy(out, bytes_ + position_, sizeof(T));
    position_ += sizeof(T);
    return Status::ok();
  }

  Status read_string(std::string* out, const std::string& field) {
    uint64_t length = 0;
    SLIMKV_RETURN_IF_ERROR(read(&length, field + " (string length)"));
    if (length > remaining()) {
      return error(source_, ": ", field, ": string length ", length, " at offset ", position_ - 8,
                   " runs past the end of the file (", remaining(), " bytes left)");
    }
    out->assign(reinterpret_cast<const char*>(bytes_ + position_), size_t(length));
    position_ += size_t(length);
    return Status::ok();
  }

 private:
  const uint8_t* bytes_;
  size_t size_;
  size_t position_ = 0;
  const std::string& source_;
};

// The smallest encoding of one element of `type`: a bound on how many elements `remaining` bytes can
// hold, so a hostile count is refused before anything is allocated.
size_t min_value_bytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8: case GgufValueType::kInt8: case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16: case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32: case GgufValueType::kInt32: case GgufValueType::kFloat32: return 4;
    case GgufValueType::kUint64: case GgufValueType::kInt64: case GgufValueType::kFloat64: return 8;
    case GgufValueType::kString: return 8;   // the length
    case GgufValueType::kArray: return 12;   // element type + count
  }
  return 1;
}

bool known_value_type(uint32_t type) { return type <= uint32_t(GgufValueType::kFloat64); }

template <typename T>
Status read_integer(Reader& reader, const std::string& field, const std::string& source, int64_t* out) {
  T value{};
  SLIMKV_RETURN_IF_ERROR(reader.read(&value, field));
  if constexpr (std::is_same_v<T, uint64_t>) {
    if (value > uint64_t(std::numeric_limits<int64_t>::max())) {
      return error(source, ": ", field, ": u64 value ", value, " is larger than slimkv reads (at most 2^63 - 1)");
    }
  }
  *out = int64_t(value);
  return Status::ok();
}

// Reads one scalar (not an array) of `type` into the value's scalar fields.
Status read_scalar(Reader& reader, GgufValueType type, const std::string& field, const std::string& source,
                   GgufValue* value) {
  switch (type) {
    case GgufValueType::kUint8: return read_integer<uint8_t>(reader, field, source, &value->integer);
    case GgufValueType::kInt8: return read_integer<int8_t>(reader, field, source, &value->integer);
    case GgufValueType::kUint16: return read_integer<uint16_t>(reader, field, source, &value->integer);
    case GgufValueType::kInt16: return read_integer<int16_t>(reader, field, source, &value->integer);
    case GgufValueType::kUint32: return read_integer<uint32_t>(reader, field, source, &value->integer);
    case GgufValueType::kInt32: return read_integer<int32_t>(reader, field, source, &value->integer);
    case GgufValueType::kUint64: return read_integer<uint64_t>(reader, field, source, &value->integer);
    case GgufValueType::kInt64: return read_integer<int64_t>(reader, field, source, &value->integer);
    case GgufValueType::kBool: {
      uint8_t byte = 0;
      SLIMKV_RETURN_IF_ERROR(reader.read(&byte, field));
      if (byte > 1) return error(source, ": ", field, ": bool byte is ", int(byte), ", expected 0 or 1");
      value->integer = byte;
      return Status::ok();
    }
    case GgufValueType::kFloat32: {
      float f = 0;
      SLIMKV_RETURN_IF_ERROR(reader.read(&f, field));
      value->real = f;
      return Status::ok();
    }
    case GgufValueType::kFloat64: return reader.read(&value->real, field);
    case GgufValueType::kString: return reader.read_string(&value->text, field);
    case GgufValueType::kArray: break;
  }
  return error(source, ": ", field, ": not a scalar type");
}

Status read_value(Reader& reader, GgufValueType type, const std::string& field, const std::string& source, int depth,
                  GgufValue* value);

Status read_array(Reader& reader, const std::string& field, const std::string& source, int depth, GgufValue* value) {
  if (depth >= kMaxArrayDepth) return error(source, ": ", field, ": arrays nested deeper than ", kMaxArrayDepth);
  uint32_t element_type = 0;
  uint64_t count = 0;
  SLIMKV_RETURN_IF_ERROR(reader.read(&element_type, field + " (array element type)"));
  if (!known_value_type(element_type)) {
    return error(source, ": ", field, ": array element type ", element_type, " is not a GGUF value type (0..12)");
  }
  SLIMKV_RETURN_IF_ERROR(reader.read(&count, field + " (array length)"));
  value->element_type = GgufValueType(element_type);
  if (count > reader.remaining() / min_value_bytes(value->element_type)) {
    return error(source, ": ", field, ": array of ", count, " ", gguf_value_type_name(value->element_type),
                 " elements cannot fit in the ", reader.remaining(), " bytes left in the file");
  }
  GgufValue element;
  for (uint64_t i = 0; i < count; ++i) {
    const std::string element_field = str_cat(field, "[", i, "]");
    if (value->element_type == GgufValueType::kArray) {
      value->arrays.emplace_back();
      SLIMKV_RETURN_IF_ERROR(read_value(reader, GgufValueType::kArray, element_field, source, depth + 1, &value->arrays.back()));
      continue;
    }
    SLIMKV_RETURN_IF_ERROR(read_scalar(reader, value->element_type, element_field, source, &element));
    if (value->element_type == GgufValueType::kString) {
      value->texts.push_back(std::move(element.text));
    } else if (value->element_type == GgufValueType::kFloat32 || value->element_type == GgufValueType::kFloat64) {
      value->reals.push_back(element.real);
    } else {
      value->integers.push_back(element.integer);
    }
  }
  return Status::ok();
}

Status read_value(Reader& reader, GgufValueType type, const std::string& field, const std::string& source, int depth,
                  GgufValue* value) {
  value->type = type;
  if (type == GgufValueType::kArray) return read_array(reader, field, source, depth, value);
  return read_scalar(reader, type, field, source, value);
}

// ne[] to the outermost-first shape, checking each dimension and the element count, and that the
// innermost dimension holds whole blocks of the type.
Status tensor_shape(const std::vector<uint64_t>& ne, const GgmlType& type, const std::string& field,
                    const std::string& source, std::vector<int64_t>* shape, size_t* size_bytes) {
  uint64_t elements = 1;
  for (size_t d = 0; d < ne.size(); ++d) {
    if (ne[d] == 0 || ne[d] > uint64_t(std::numeric_limits<int64_t>::max())) {
      return error(source, ": ", field, ": ne[", d, "] = ", ne[d], ", expected a positive dimension");
    }
    if (elements > uint64_t(std::numeric_limits<int64_t>::max()) / ne[d]) {
      return error(source, ": ", field, ": the dimensions' product overflows 64 bits");
    }
    elements *= ne[d];
  }
  if (ne[0] % uint64_t(type.block_elements) != 0) {
    return error(source, ": ", field, ": type ", type.name, " stores blocks of ", type.block_elements,
                 " values, but the row length ne[0] = ", ne[0], " is not a multiple of it");
  }
  const uint64_t blocks = elements / uint64_t(type.block_elements);
  if (blocks > std::numeric_limits<uint64_t>::max() / type.block_bytes) {
    return error(source, ": ", field, ": its byte size overflows 64 bits");
  }
  *size_bytes = size_t(blocks * type.block_bytes);
  shape->assign(ne.rbegin(), ne.rend());
  return Status::ok();
}

Status read_tensor_info(Reader& reader, uint64_t index, const std::string& source, GgufTensor* tensor) {
  const std::string field = str_cat("tensor info ", index);
  SLIMKV_RETURN_IF_ERROR(reader.read_string(&tensor->name, field + " name"));
  const std::string named = str_cat(field, " ('", tensor->name, "')");
  uint32_t n_dims = 0;
  SLIMKV_RETURN_IF_ERROR(reader.read(&n_dims, named + " n_dims"));
  if (n_dims == 0 || n_dims > kMaxDims) {
    return error(source, ": ", named, ": n_dims is ", n_dims, ", expected 1 to ", kMaxDims);
  }
  std::vector<uint64_t> ne(n_dims);
  for (uint32_t d = 0; d < n_dims; ++d) SLIMKV_RETURN_IF_ERROR(reader.read(&ne[d], str_cat(named, " ne[", d, "]")));
  uint32_t type_id = 0;
  SLIMKV_RETURN_IF_ERROR(reader.read(&type_id, named + " type"));
  tensor->type = find_ggml_type(type_id);
  if (!tensor->type) {
    return error(source, ": ", named, ": ggml type ", type_id, " is unknown to slimkv (it reads ",
                 supported_ggml_type_names(), ")");
  }
  SLIMKV_RETURN_IF_ERROR(reader.read(&tensor->offset, named + " offset"));
  return tensor_shape(ne, *tensor->type, named, source, &tensor->shape, &tensor->size_bytes);
}

}  // namespace

std::string_view gguf_value_type_name(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8: return "u8";
    case GgufValueType::kInt8: return "i8";
    case GgufValueType::kUint16: return "u16";
    case GgufValueType::kInt16: return "i16";
    case GgufValueType::kUint32: return "u32";
    case GgufValueType::kInt32: return "i32";
    case GgufValueType::kFloat32: return "f32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kUint64: return "u64";
    case GgufValueType::kInt64: return "i64";
    case GgufValueType::kFloat64: return "f64";
  }
  return "?";
}

namespace {

bool is_integer_type(GgufValueType type) {
  return type != GgufValueType::kString && type != GgufValueType::kArray && type != GgufValueType::kFloat32 &&
         type != GgufValueType::kFloat64;
}

}  // namespace

bool GgufValue::is_integer() const { return is_integer_type(type); }

size_t GgufValue::array_size() const { return integers.size() + reals.size() + texts.size() + arrays.size(); }

int64_t GgufTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Expected<GgufContents> parse_gguf(const uint8_t* bytes, size_t size, const std::string& source) {
  Reader reader(bytes, size, source);
  GgufContents contents;
  uint32_t magic = 0;
  SLIMKV_RETURN_IF_ERROR(reader.read(&magic, "magic"));
  if (magic != kMagic) return error(source, ": magic: expected \"GGUF\", this is not a GGUF file");
  SLIMKV_RETURN_IF_ERROR(reader.read(&contents.version, "version"));
  if (contents.version != 2 && contents.version != 3) {
    return error(source, ": version: expected 3 (or 2), found ", contents.version,
                 contents.version == 1 ? " (GGUF v1 files predate 2023-10: re-convert the model)" : "");
  }
  uint64_t tensor_count = 0, kv_count = 0;
  SLIMKV_RETURN_IF_ERROR(reader.read(&tensor_count, "tensor_count"));
  SLIMKV_RETURN_IF_ERROR(reader.read(&kv_count, "metadata_kv_count"));
  // Each key-value pair takes at least 13 bytes (key length, value type, one byte), each tensor info 24
  // (name length, n_dims, type, offset).
  if (kv_count > reader.remaining() / 13) {
    return error(source, ": metadata_kv_count: ", kv_count, " pairs cannot fit in a file of ", size, " bytes");
  }
  if (tensor_count > reader.remaining() / 24) {
    return error(source, ": tensor_count: ", tensor_count, " tensor infos cannot fit in a file of ", size, " bytes");
  }

  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key;
    SLIMKV_RETURN_IF_ERROR(reader.read_string(&key, str_cat("metadata key ", i)));
    const std::string field = str_cat("metadata '", key, "'");
    uint32_t type = 0;
    SLIMKV_RETURN_IF_ERROR(reader.read(&type, field + " value type"));
    if (!known_value_type(type)) return error(source, ": ", field, ": value type ", type, " is not a GGUF value type (0..12)");
    GgufValue value;
    SLIMKV_RETURN_IF_ERROR(read_value(reader, GgufValueType(type), field, source, 0, &value));
    if (!contents.metadata.emplace(key, std::move(value)).second) {
      return error(source, ": ", field, ": the key appears twice");
    }
  }

  if (const auto it = contents.metadata.find("general.alignment"); it != contents.metadata.end()) {
    const GgufValue& alignment = it->second;
    if (alignment.type != GgufValueType::kUint32 || alignment.integer == 0 ||
        (alignment.integer & (alignment.integer - 1)) != 0) {
      return error(source, ": metadata 'general.alignment': expected a u32 power of two, found a ",
                   gguf_value_type_name(alignment.type), alignment.is_integer() ? str_cat(" ", alignment.integer) : "");
    }
    contents.alignment = uint64_t(alignment.integer);
  }

  std::set<std::string> names;
  contents.tensors.resize(size_t(tensor_count));
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensor& tensor = contents.tensors[size_t(i)];
    SLIMKV_RETURN_IF_ERROR(read_tensor_info(reader, i, source, &tensor));
    if (!names.insert(tensor.name).second) return error(source, ": tensor '", tensor.name, "' appears twice");
  }

  // The data region starts at the next multiple of the alignment (the padding may be absent when no
  // tensor follows).
  const uint64_t header_end = reader.position();
  const uint64_t data_offset = (header_end + contents.alignment - 1) / contents.alignment * contents.alignment;
  if (tensor_count > 0 && data_offset > size) {
    return error(source, ": data region: the header ends at ", header_end, ", so tensor data starts at ", data_offset,
                 " (alignment ", contents.alignment, "), past the end of the file (", size, " bytes)");
  }
  contents.data_offset = size_t(std::min<uint64_t>(data_offset, size));
  const uint64_t data_bytes = size - contents.data_offset;

  // Every tensor inside the data region, aligned, and no two overlapping.
  std::vector<std::pair<uint64_t, size_t>> extents;  // (offset, index)
  for (size_t i = 0; i < contents.tensors.size(); ++i) {
    GgufTensor& tensor = contents.tensors[i];
    const std::string field = str_cat("tensor '", tensor.name, "'");
    if (tensor.offset % contents.alignment != 0) {
      return error(source, ": ", field, ": offset ", tensor.offset, " is not a multiple of the alignment ",
                   contents.alignment);
    }
    if (tensor.offset > data_bytes || tensor.size_bytes > data_bytes - tensor.offset) {
      return error(source, ": ", field, ": data [", tensor.offset, ", ", tensor.offset + tensor.size_bytes,
                   ") of the data region runs past its end (", data_bytes, " bytes; truncated file?)");
    }
    // Scales and plain values are read as 2- or 4-byte numbers: refuse data no load could be aligned for
    // (possible only with an alignment below 4).
    const size_t element_alignment = tensor.type->block_elements == 1 ? tensor.type->block_bytes : 2;
    if ((contents.data_offset + tensor.offset) % element_alignment != 0) {
      return error(source, ": ", field, ": data at file offset ", contents.data_offset + tensor.offset,
                   " is not aligned to its ", element_alignment, "-byte elements (general.alignment ",
                   contents.alignment, ")");
    }
    tensor.data = bytes + contents.data_offset + tensor.offset;
    extents.emplace_back(tensor.offset, i);
  }
  std::sort(extents.begin(), extents.end());
  for (size_t k = 1; k < extents.size(); ++k) {
    const GgufTensor& before = contents.tensors[extents[k - 1].second];
    const GgufTensor& after = contents.tensors[extents[k].second];
    if (before.offset + before.size_bytes > after.offset) {
      return error(source, ": tensor '", after.name, "': data at offset ", after.offset, " overlaps tensor '",
                   before.name, "' [", before.offset, ", ", before.offset + before.size_bytes, ")");
    }
  }
  return contents;
}

// ---------------------------------------------------------------------------------------------
// GgufFile
// ---------------------------------------------------------------------------------------------

Expected<GgufFile> GgufFile::open(const std::string& path) {
  GgufFile file;
  SLIMKV_ASSIGN_OR_RETURN(file.file_, MappedFile::open(path));
  SLIMKV_ASSIGN_OR_RETURN(file.contents_, parse_gguf(file.file_.data(), file.file_.size_bytes(), path));
  return file;
}

const GgufValue* GgufFile::find(const std::string& key) const {
  const auto it = contents_.metadata.find(key);
  return it == contents_.metadata.end() ? nullptr : &it->second;
}

Expected<const GgufValue*> GgufFile::get(const std::string& key) const {
  const GgufValue* value = find(key);
  if (!value) return error(path(), ": metadata '", key, "' is missing");
  return value;
}

namespace {

Status wrong_type(const std::string& path, const std::string& key, std::string_view expected, const GgufValue& value) {
  std::string found(gguf_value_type_name(value.type));
  if (value.type == GgufValueType::kArray) found += str_cat(" of ", gguf_value_type_name(value.element_type));
  return error(path, ": metadata '", key, "': expected ", expected, ", found ", found);
}

}  // namespace

Expected<int64_t> GgufFile::get_int(const std::string& key) const {
  SLIMKV_ASSIGN_OR_RETURN(const GgufValue* value, get(key));
  if (!value->is_integer()) return wrong_type(path(), key, "an integer", *value);
  return value->integer;
}

Expected<double> GgufFile::get_real(const std::string& key) const {
  SLIMKV_ASSIGN_OR_RETURN(const GgufValue* value, get(key));
  if (value->is_real()) return value->real;
  if (value->is_integer()) return double(value->integer);
  return wrong_type(path(), key, "a number", *value);
}

Expected<std::string> GgufFile::get_string(const std::string& key) const {
  SLIMKV_ASSIGN_OR_RETURN(const GgufValue* value, get(key));
  if (value->type != GgufValueType::kString) return wrong_type(path(), key, "a string", *value);
  return value->text;
}

Expected<const std::vector<std::string>*> GgufFile::get_strings(const std::string& key) const {
  SLIMKV_ASSIGN_OR_RETURN(const GgufValue* value, get(key));
  if (value->type != GgufValueType::kArray || value->element_type != GgufValueType::kString) {
    return wrong_type(path(), key, "an array of strings", *value);
  }
  return &value->texts;
}

Expected<const std::vector<int64_t>*> GgufFile::get_ints(const std::string& key) const {
  SLIMKV_ASSIGN_OR_RETURN(const GgufValue* value, get(key));
  if (value->type != GgufValueType::kArray || !is_integer_type(value->element_type)) {
    return wrong_type(path(), key, "an array of integers", *value);
  }
  return &value->integers;
}

Expected<const std::vector<double>*> GgufFile::get_reals(const std::string& key) const {
  SLIMKV_ASSIGN_OR_RETURN(const GgufValue* value, get(key));
  if (value->type != GgufValueType::kArray ||
      (value->element_type != GgufValueType::kFloat32 && value->element_type != GgufValueType::kFloat64)) {
    return wrong_type(path(), key, "an array of floats", *value);
  }
  return &value->reals;
}

bool has_gguf_magic(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) return false;
  uint32_t magic = 0;
  const bool read = std::fread(&magic, sizeof(magic), 1, file) == 1;
  std::fclose(file);
  return read && magic == kMagic;
}

}  // namespace slimkv
