// safetensors: the checkpoint format Hugging Face writes (model.safetensors and its shards).
//
// A file is: an 8-byte little-endian header length N, N bytes of JSON header, then the data region.
// The header maps each tensor name to {"dtype": "BF16", "shape": [rows, cols],
// "data_offsets": [begin, end]} (byte offsets into the data region), plus an optional
// "__metadata__" object of string -> string.
//
// We read files in place (memory-mapped) and validate everything a corrupt or hostile file could
// get wrong before any tensor byte is touched: every error names the file and the tensor.
//
// Alignment: tensors are packed back to back, so an F32 tensor that follows an odd-length F16 one
// starts at an address that is not a multiple of 4. Loading floats through such a pointer is
// undefined behaviour (and a UBSan report), so a tensor whose data is not aligned to its element
// size gets an owned, 64-byte-aligned copy (`TensorInfo::owned_copy`); every other tensor points
// straight into the mapping. Either way `TensorInfo::data` is aligned to the element size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "slimkv/status.h"
#include "tensor/dtype.h"
#include "tensor/ggml_type.h"
#include "util/mapped_file.h"

namespace slimkv {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;  // meaningful only when dtype_supported
  std::vector<int64_t> shape;
  // Aligned to the element size; points into the mapped file, or into owned_copy. Valid while the
  // SafetensorsFile / WeightStore it came from lives (or, for an owned copy, while this TensorInfo
  // or a copy of it lives). An empty tensor points at a static aligned zero-length buffer, never
  // null.
  const uint8_t* data = nullptr;
  size_t size_bytes = 0;
  std::string file;  // which file it came from, for messages

  // The header's dtype string ("BF16", "I8", "F8_E4M3", ...). Tensors in dtypes we do not compute
  // with (anything but F32/F16/BF16) are still listed, with dtype_supported = false, so a file with
  // e.g. an I8 tensor can be inspected; WeightStore::get refuses them.
  std::string stored_dtype;
  bool dtype_supported = true;
  size_t element_size_bytes = 0;  // of stored_dtype (a GGUF block type's: 0)
  // GGUF files only: the tensor is in ggml's quantized blocks (then `dtype` is meaningless).
  BlockQuant quant = BlockQuant::kNone;
  // Byte range within the file's data region, as the header said (for messages and tools).
  uint64_t data_begin = 0;
  uint64_t data_end = 0;
  // Set only when the mapped data was misaligned and had to be copied (see the file comment).
  std::shared_ptr<const uint8_t> owned_copy;

  int64_t num_elements() const;
};

// Parses the 8-byte little-endian header length + JSON header of a safetensors blob in memory and
// returns every tensor (data pointers into `bytes`, or owned aligned copies), validated, in the
// order their data appears. `source` names the file in errors. `bytes` must outlive the result.
Expected<std::vector<TensorInfo>> parse_safetensors(const uint8_t* bytes, size_t size,
                                                    const std::string& source);

// The same, also returning the header's "__metadata__".
struct SafetensorsContents {
  std::vector<TensorInfo> tensors;  // in data order
  std::map<std::string, std::string> metadata;
  size_t data_region_offset = 0;  // 8 + header length
};
Expected<SafetensorsContents> parse_safetensors_contents(const uint8_t* bytes, size_t size,
                                                         const std::string& source);

// One memory-mapped safetensors file. Movable; tensors' data stays valid across moves.
class SafetensorsFile {
 public:
  static Expected<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const std::vector<TensorInfo>& tensors() const { return contents_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return contents_.metadata; }
  // nullptr when the file has no tensor of that name.
  const TensorInfo* find(std::string_view name) const;
  size_t file_size_bytes() const { return file_.size_bytes(); }
  // MappedFile::release_pages for a tensor's bytes.
  void release_pages(const void* data, size_t bytes) const { file_.release_pages(data, bytes); }

 private:
  MappedFile file_;
  SafetensorsContents contents_;
  std::unordered_map<std::string, size_t> index_by_name_;  // into contents_.tensors
};

// One tensor for write_safetensors: `data` holds num_elements(shape) * dtype_size_bytes(dtype)
// bytes in little-endian element order, row-major.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const uint8_t> data;
};

// Writes tensors as a valid safetensors file; `metadata` goes to __metadata__. The header is padded
// with spaces so the data region starts 8-byte aligned, and tensors are laid out largest element
// size first (then in the given order), packed without gaps, so every tensor is aligned to its
// element size, as the reference writer does. Refuses duplicate/empty names and data of the wrong
// size.
Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

// The header size we refuse to go past: larger is a corrupt length, not a real header. The same
// limit as the reference implementation.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

}  // namespace slimkv
