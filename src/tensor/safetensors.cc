#include "tensor/safetensors.h"


#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "util/atomic_file.h"

namespace slimkv {
namespace {

using Json = nlohmann::json;

// Where empty tensors point: aligned for every dtype, never dereferenced, never null (so that
// memcpy(dst, data, 0) by a caller stays defined).
alignas(64) constexpr uint8_t kEmptyTensorData[64] = {};

constexpr size_t kOwnedCopyAlignment = 64;

// ---------------------------------------------------------------------------------------------
// dtypes: every fixed-width dtype the format defines; only F32/F16/BF16 are computed with.
// ---------------------------------------------------------------------------------------------

struct StoredDType {
  std::string_view name;
  size_t size_bytes;
  bool supported;
  DType dtype;  // when supported
};

constexpr StoredDType kStoredDTypes[] = {
    {"F32", 4, true, DType::kF32},      {"F16", 2, true, DType::kF16},
    {"BF16", 2, true, DType::kBF16},    {"F64", 8, false, DType::kF32},
    {"I64", 8, false, DType::kF32},     {"U64", 8, false, DType::kF32},
    {"I32", 4, false, DType::kF32},     {"U32", 4, false, DType::kF32},
    {"I16", 2, false, DType::kF32},     {"U16", 2, false, DType::kF32},
    {"I8", 1, false, DType::kF32},      {"U8", 1, false, DType::kF32},
    {"BOOL", 1, false, DType::kF32},    {"F8_E4M3", 1, false, DType::kF32},
    {"F8_E5M2", 1, false, DType::kF32}, {"F8_E8M0", 1, false, DType::kF32},
};

const StoredDType* find_stored_dtype(std::string_view name) {
  for (const StoredDType& entry : kStoredDTypes) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

std::string known_dtype_list() {
  std::string list;
  for (const StoredDType& entry : kStoredDTypes) {
    if (!list.empty()) list += ", ";
    list += entry.name;
  }
  return list;
}

// ---------------------------------------------------------------------------------------------
// small checked helpers
// ---------------------------------------------------------------------------------------------

const char* json_type_name(const Json& value) { return value.type_name(); }

// A JSON integer that fits int64 (floats like 2.0 are refused: shapes and offsets are integers).
bool json_to_int64(const Json& value, int64_t* out) {
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v > uint64_t(std::numeric_limits<int64_t>::max())) return false;
    *out = int64_t(v);
    return true;
  }
  if (value.is_number_integer()) {
    *out = value.get<int64_t>();
    return true;
  }
  return false;
}

bool json_to_uint64(const Json& value, uint64_t* out) {
  if (value.is_number_unsigned()) {
    *out = value.get<uint64_t>();
    return true;
  }
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    *out = uint64_t(value.get<int64_t>());
    return true;
  }
  return false;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// Element count of `shape`, or false on a negative dim or int64 overflow.
bool checked_num_elements(const std::vector<int64_t>& shape, int64_t* out) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0 || __builtin_mul_overflow(count, dim, &count)) return false;
  }
  *out = count;
  return true;
}

uint64_t read_le_u64(const uint8_t* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

// ---------------------------------------------------------------------------------------------
// one header entry -> TensorInfo (without data pointer)
// ---------------------------------------------------------------------------------------------

Expected<TensorInfo> parse_tensor_entry(const std::string& name, const Json& entry,
                                        uint64_t data_region_bytes, const std::string& source) {
  const std::string where = str_cat(source, ": tensor '", name, "'");
  if (!entry.is_object()) {
    return error(where, ": header entry is a JSON ", json_type_name(entry),
                 ", expected an object {\"dtype\", \"shape\", \"data_offsets\"}");
  }
  TensorInfo info;
  info.name = name;
  info.file = source;

  // dtype
  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end()) return error(where, ": header entry has no \"dtype\"");
  if (!dtype_it->is_string()) {
    return error(where, ": \"dtype\" is a JSON ", json_type_name(*dtype_it), ", expected a string");
  }
  info.stored_dtype = dtype_it->get<std::string>();
  const StoredDType* stored = find_stored_dtype(info.stored_dtype);
  if (!stored) {
    return error(where, ": unknown dtype \"", info.stored_dtype, "\" (known: ", known_dtype_list(),
                 ")");
  }
  info.dtype_supported = stored->supported;
  info.dtype = stored->dtype;
  info.element_size_bytes = stored->size_bytes;

  // shape
  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) return error(where, ": header entry has no \"shape\"");
  if (!shape_it->is_array()) {
    return error(where, ": \"shape\" is a JSON ", json_type_name(*shape_it),
                 ", expected an array of non-negative integers");
  }
  for (size_t i = 0; i < shape_it->size(); ++i) {
    const Json& dim_json = (*shape_it)[i];
    int64_t dim = 0;
    if (!json_to_int64(dim_json, &dim)) {
      return error(where, ": shape[", i, "] is ", dim_json.dump(),
                   ", expected a non-negative integer");
    }
    if (dim < 0) return error(where, ": shape[", i, "] is negative (", dim, ")");
    info.shape.push_back(dim);
  }
  int64_t num_elements = 0;
  if (!checked_num_elements(info.shape, &num_elements)) {
    return error(where, ": shape ", shape_string(info.shape),
                 " has more elements than fit in 64 bits");
  }
  uint64_t expected_bytes = 0;
  if (__builtin_mul_overflow(uint64_t(num_elements), uint64_t(info.element_size_bytes),
                             &expected_bytes)) {
    return error(where, ": shape ", shape_string(info.shape), " of ", info.stored_dtype,
                 " is more bytes than fit in 64 bits");
  }

  // data_offsets
  const auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end()) return error(where, ": header entry has no \"data_offsets\"");
  if (!offsets_it->is_array() || offsets_it->size() != 2 ||
      !json_to_uint64((*offsets_it)[0], &info.data_begin) ||
      !json_to_uint64((*offsets_it)[1], &info.data_end)) {
    return error(where, ": \"data_offsets\" is ", offsets_it->dump(),
                 ", expected [begin, end] with non-negative integers");
  }
  if (info.data_begin > info.data_end) {
    return error(where, ": data_offsets [", info.data_begin, ", ", info.data_end,
                 "] has begin after end");
  }
  if (info.data_end > data_region_bytes) {
    return error(where, ": data_offsets [", info.data_begin, ", ", info.data_end,
                 "] end past the data region, which is ", data_region_bytes,
                 " bytes (file truncated?)");
  }
  const uint64_t stored_bytes = info.data_end - info.data_begin;
  if (stored_bytes != expected_bytes) {
    return error(where, ": data_offsets [", info.data_begin, ", ", info.data_end, "] hold ",
                 stored_bytes, " bytes, but shape ", shape_string(info.shape), " of ",
                 info.stored_dtype, " needs ", num_elements, " x ", info.element_size_bytes, " = ",
                 expected_bytes, " bytes");
  }
  info.size_bytes = size_t(stored_bytes);
  return info;
}

Status parse_metadata(const Json& value, const std::string& source,
                      std::map<std::string, std::string>* metadata) {
  if (!value.is_object()) {
    return error(source, ": \"__metadata__\" is a JSON ", json_type_name(value),
                 ", expected an object of string values");
  }
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      return error(source, ": \"__metadata__\" key '", key, "' is a JSON ", json_type_name(item),
                   ", expected a string");
    }
    (*metadata)[key] = item.get<std::string>();
  }
  return Status::ok();
}

// Points the tensor at its bytes, copying them to an aligned buffer when the mapping is misaligned.
void attach_data(const uint8_t* data_region, TensorInfo* info) {
  if (info->size_bytes == 0) {
    info->data = kEmptyTensorData;
    return;
  }
  const uint8_t* mapped = data_region + info->data_begin;
  if (reinterpret_cast<uintptr_t>(mapped) % info->element_size_bytes == 0) {
    info->data = mapped;
    return;
  }
  auto* copy = static_cast<uint8_t*>(
      ::operator new (info->size_bytes, std::align_val_t{kOwnedCopyAlignment}));
  std::memcpy(copy, mapped, info->size_bytes);
  info->owned_copy = std::shared_ptr<const uint8_t>(copy, [](const uint8_t* p) {
    ::operator delete (const_cast<uint8_t*>(p), std::align_val_t{kOwnedCopyAlignment});
  });
  info->data = copy;
}

}  // namespace

int64_t TensorInfo::num_elements() const {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;  // validated at parse time: no overflow
  return count;
}

// ---------------------------------------------------------------------------------------------
// parsing
// ---------------------------------------------------------------------------------------------

Expected<SafetensorsContents> parse_safetensors_contents(const uint8_t* bytes, size_t size,
                                                         const std::string& source) {
  if (size < 8 || bytes == nullptr) {
    return error(source, ": file is ", size,
                 " bytes, shorter than the 8-byte header length that starts a safetensors file "
                 "(truncated, or not safetensors)");
  }
  const uint64_t header_bytes = read_le_u64(bytes);
  if (header_bytes > kMaxSafetensorsHeaderBytes) {
    return error(source, ": header length is ", header_bytes, " bytes, more than the ",
                 kMaxSafetensorsHeaderBytes, "-byte limit: the file is corrupt or not safetensors");
  }
  if (header_bytes > size - 8) {
    return error(source, ": header length ", header_bytes, " goes past the end of the file (", size,
                 " bytes, so at most ", size - 8, " header bytes): truncated, or not safetensors");
  }
  if (header_bytes == 0)
    return error(source, ": header is empty (0 bytes), expected a JSON object");

  // Parse the JSON header, noting top-level keys that occur twice (the JSON library keeps only the
  // last, which would silently drop a tensor).
  const char* header_begin = reinterpret_cast<const char*>(bytes + 8);
  std::set<std::string> seen_names;
  std::string duplicate_name;
  auto note_duplicates = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      if (!seen_names.insert(parsed.get<std::string>()).second && duplicate_name.empty()) {
        duplicate_name = parsed.get<std::string>();
      }
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(header_begin, header_begin + header_bytes, note_duplicates);
  } catch (const Json::exception& e) {
    return error(source, ": header (", header_bytes, " bytes) is not valid JSON: ", e.what());
  } catch (const std::bad_alloc&) {
    return error(source, ": header (", header_bytes, " bytes) needs more memory than is available");
  }
  if (!header.is_object()) {
    return error(source, ": header is a JSON ", json_type_name(header),
                 ", expected an object of tensor entries");
  }
  if (!duplicate_name.empty()) {
    return error(source, ": tensor '", duplicate_name, "' appears twice in the header");
  }

  SafetensorsContents contents;
  contents.data_region_offset = size_t(8 + header_bytes);
  const uint64_t data_region_bytes = size - contents.data_region_offset;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      SLIMKV_RETURN_IF_ERROR(parse_metadata(entry, source, &contents.metadata));
      continue;
    }
    SLIMKV_ASSIGN_OR_RETURN(TensorInfo info,
                            parse_tensor_entry(name, entry, data_region_bytes, source));
    contents.tensors.push_back(std::move(info));
  }

  // Data order; then no two non-empty byte ranges may share a byte. (Gaps are tolerated: they are
  // harmless, although the reference writer never leaves any.)
  std::stable_sort(contents.tensors.begin(), contents.tensors.end(),
                   [](const TensorInfo& a, const TensorInfo& b) {
                     return a.data_begin != b.data_begin ? a.data_begin < b.data_begin
                                                         : a.data_end < b.data_end;
                   });
  const TensorInfo* previous = nullptr;  // the non-empty tensor reaching furthest so far
  for (const TensorInfo& info : contents.tensors) {
    if (info.size_bytes == 0) continue;
    if (previous && info.data_begin < previous->data_end) {
      return error(source, ": tensor '", info.name, "' data_offsets [", info.data_begin, ", ",
                   info.data_end, "] overlap tensor '", previous->name, "' data_offsets [",
                   previous->data_begin, ", ", previous->data_end, "]");
    }
    if (!previous || info.data_end > previous->data_end) previous = &info;
  }

  const uint8_t* data_region = bytes + contents.data_region_offset;
  try {
    for (TensorInfo& info : contents.tensors) attach_data(data_region, &info);
  } catch (const std::bad_alloc&) {
    return error(source, ": out of memory making aligned copies of misaligned tensors");
  }
  return contents;
}

Expected<std::vector<TensorInfo>> parse_safetensors(const uint8_t* bytes, size_t size,
                                                    const std::string& source) {
  SLIMKV_ASSIGN_OR_RETURN(SafetensorsContents contents,
                          parse_safetensors_contents(bytes, size, source));
  return std::move(contents.tensors);
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile
// ---------------------------------------------------------------------------------------------

Expected<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  SafetensorsFile file;
  SLIMKV_ASSIGN_OR_RETURN(file.file_, MappedFile::open(path));
  SLIMKV_ASSIGN_OR_RETURN(
      file.contents_, parse_safetensors_contents(file.file_.data(), file.file_.size_bytes(), path));
  for (size_t i = 0; i < file.contents_.tensors.size(); ++i) {
    file.index_by_name_.emplace(file.contents_.tensors[i].name, i);
  }
  return file;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_by_name_.find(std::string(name));
  return it == index_by_name_.end() ? nullptr : &contents_.tensors[it->second];
}

// ---------------------------------------------------------------------------------------------
// writing
// ---------------------------------------------------------------------------------------------

Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  // Validate and lay out: largest element size first keeps every tensor aligned with no gaps.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size_bytes(tensors[a].dtype) > dtype_size_bytes(tensors[b].dtype);
  });

  Json header = Json::object();
  std::set<std::string> names;
  uint64_t offset = 0;
  for (size_t i : order) {
    const TensorToWrite& tensor = tensors[i];
    const std::string where = str_cat("writing ", path, ": tensor '", tensor.name, "'");
    if (tensor.name.empty()) return error("writing ", path, ": tensor #", i, " has an empty name");
    if (tensor.name == "__metadata__") return error(where, ": the name is reserved for metadata");
    if (!names.insert(tensor.name).second) return error(where, ": the name appears twice");
    int64_t num_elements = 0;
    if (!checked_num_elements(tensor.shape, &num_elements)) {
      return error(where, ": shape ", shape_string(tensor.shape),
                   " has a negative dim or too many elements");
    }
    uint64_t expected_bytes = 0;
    if (__builtin_mul_overflow(uint64_t(num_elements), uint64_t(dtype_size_bytes(tensor.dtype)),
                               &expected_bytes)) {
      return error(where, ": shape ", shape_string(tensor.shape),
                   " is more bytes than fit in 64 bits");
    }
    if (tensor.data.size() != expected_bytes) {
      return error(where, ": has ", tensor.data.size(), " bytes, but shape ",
                   shape_string(tensor.shape), " of ", dtype_name(tensor.dtype), " needs ",
                   expected_bytes);
    }
    header[tensor.name] = {{"dtype", std::string(dtype_name(tensor.dtype))},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + expected_bytes}}};
    offset += expected_bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;

  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const Json::exception& e) {
    return error("writing ", path,
                 ": cannot encode the header (names and metadata must be UTF-8): ", e.what());
  }
  while ((8 + header_text.size()) % 8 != 0) header_text.push_back(' ');

  // Written to a temporary name and renamed, so a failed write never leaves a truncated file behind.
  uint8_t length_bytes[8];
  for (int i = 0; i < 8; ++i) length_bytes[i] = uint8_t(uint64_t(header_text.size()) >> (8 * i));
  std::vector<std::span<const uint8_t>> pieces = {
      std::span<const uint8_t>(length_bytes, 8),
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(header_text.data()), header_text.size())};
  for (size_t i : order) pieces.push_back(tensors[i].data);
  return write_file_atomically(path, pieces);
}

}  // namespace slimkv
