// WeightStore: every tensor of a Hugging Face model directory, memory-mapped, by name.
//
// A directory holds either one `model.safetensors`, or shards named by
// `model.safetensors.index.json` ({"metadata": {...}, "weight_map": {tensor name: shard file}}).
// Each shard is mapped once. The index and the shards must agree exactly: every tensor the index
// lists is in the shard it names, no shard holds a tensor the index does not list or lists for
// another shard, and no tensor is in two shards. Model code asks for each weight with the shape it
// expects (`get`), so a checkpoint that does not fit the config fails at load with a message naming
// the tensor, the file, and both shapes. A GGUF file's tensors come in under the same names
// (model/gguf_model.h), some in ggml's quantized blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "slimkv/status.h"
#include "tensor/safetensors.h"

namespace slimkv {

// The weight_map of model.safetensors.index.json's text: tensor name -> shard file name, each a plain
// file name in the model directory; errors name `index_path` (with line and column for bad JSON).
// Fuzzed (fuzz/shard_index_fuzz.cc).
Expected<std::map<std::string, std::string>> parse_shard_index(const std::string& text, const std::string& index_path);

class WeightStore {
 public:
  // Opens DIR/model.safetensors, or every shard named by DIR/model.safetensors.index.json
  // ("weight_map"); the index wins when both exist, as in transformers.
  static Expected<WeightStore> open(const std::string& model_dir);
  // The tensors of another format (model/gguf_model.cc): `owner` keeps their data alive.
  static WeightStore from_tensors(std::string source, std::vector<TensorInfo> tensors,
                                  std::shared_ptr<const void> owner);

  // The tensor with exactly this shape, in a type we compute with (F32/F16/BF16, or a GGUF block
  // type, tensor/ggml_type.h). The error names
  // the tensor, its file, and the expected and found shape (or the dtype).
  Expected<TensorInfo> get(const std::string& name, const std::vector<int64_t>& shape) const;
  // The tensor whatever its shape and dtype; nullptr when absent.
  const TensorInfo* find(const std::string& name) const;
  bool contains(const std::string& name) const { return find(name) != nullptr; }
  std::vector<std::string> names() const;  // sorted
  size_t size() const { return tensors_.size(); }
  size_t total_bytes() const;  // sum of every tensor's size_bytes
  const std::string& model_dir() const { return model_dir_; }
  bool is_sharded() const { return sharded_; }  // opened through model.safetensors.index.json
  // Drops the mapped pages of a tensor's bytes from memory where a copy serves instead
  // (MappedFile::release_pages: read again from the file if touched); nothing for from_tensors' data.
  void release_pages(const void* data, size_t bytes) const;

 private:
  std::string model_dir_;
  bool sharded_ = false;
  std::vector<SafetensorsFile> files_;                   // each mapped once
  std::shared_ptr<const void> owner_;                    // from_tensors: what holds their data
  std::unordered_map<std::string, TensorInfo> tensors_;  // data points into files_
};

}  // namespace slimkv
