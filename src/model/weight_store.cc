#include "model/weight_store.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>
#include <utility>

#include "util/mapped_file.h"
#include "util/json_error.h"

namespace slimkv {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kSingleFileName = "model.safetensors";
constexpr const char* kIndexFileName = "model.safetensors.index.json";

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool is_regular_file(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// Why a directory has no weights we can read, with the likely fix.
Status explain_missing_weights(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return error(dir, ": not a directory (expected a Hugging Face model directory holding ",
                 kSingleFileName, " or ", kIndexFileName, ")");
  }
  std::vector<std::string> safetensors_files;
  bool has_pytorch_bin = false;
  // error_code overloads throughout: a directory that vanishes mid-listing must not throw.
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& path = it->path();
    if (path.extension() == ".safetensors") safetensors_files.push_back(path.filename().string());
    if (path.extension() == ".bin" || path.extension() == ".pt") has_pytorch_bin = true;
  }
  std::string message = str_cat(dir, ": has neither ", kSingleFileName, " nor ", kIndexFileName);
  if (!safetensors_files.empty()) {
    std::sort(safetensors_files.begin(), safetensors_files.end());
    message += "; it has other .safetensors files (";
    for (size_t i = 0; i < safetensors_files.size() && i < 4; ++i) {
      message += (i ? ", " : "") + safetensors_files[i];
    }
    message += safetensors_files.size() > 4 ? ", ...)" : ")";
    message += ": shards need their index file";
  } else if (has_pytorch_bin) {
    message +=
        "; it holds PyTorch .bin/.pt weights: convert them to safetensors (e.g. "
        "model.save_pretrained(dir, safe_serialization=True))";
  }
  return Status::error(message);
}

// A shard name from the index must be a plain file in the model directory.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

Expected<std::map<std::string, std::string>> parse_shard_index(const std::string& text, const std::string& index_path) {
  Json index;
  try {
    index = Json::parse(text);
  } catch (const Json::parse_error& e) {
    return Status::error(json_syntax_error(index_path, text, e.byte, e.what()));
  } catch (const Json::exception& e) {
    return error(index_path, ": not valid JSON: ", e.what());
  }
  if (!index.is_object()) {
    return error(index_path, ": is a JSON ", index.type_name(),
                 ", expected an object with \"weight_map\"");
  }
  const auto map_it = index.find("weight_map");
  if (map_it == index.end()) {
    return error(index_path, ": has no \"weight_map\" (tensor name -> shard file)");
  }
  if (!map_it->is_object()) {
    return error(index_path, ": \"weight_map\" is a JSON ", map_it->type_name(),
                 ", expected an object of tensor name -> shard file");
  }
  if (map_it->empty()) return error(index_path, ": \"weight_map\" is empty: it names no tensors");
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, shard] : map_it->items()) {
    if (!shard.is_string()) {
      return error(index_path, ": weight_map entry for tensor '", name, "' is a JSON ",
                   shard.type_name(), ", expected a shard file name");
    }
    const std::string shard_name = shard.get<std::string>();
    if (!is_plain_file_name(shard_name)) {
      return error(index_path, ": weight_map puts tensor '", name, "' in shard \"", shard_name,
                   "\", which is not a plain file name in the model directory");
    }
    weight_map.emplace(name, shard_name);
  }
  return weight_map;
}

namespace {

Expected<std::map<std::string, std::string>> read_weight_map(const std::string& index_path) {
  SLIMKV_ASSIGN_OR_RETURN(const std::string text, read_text_file(index_path));
  return parse_shard_index(text, index_path);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// opening
// ---------------------------------------------------------------------------------------------

Expected<WeightStore> WeightStore::open(const std::string& model_dir) {
  WeightStore store;
  store.model_dir_ = model_dir;
  const std::string index_path = join_path(model_dir, kIndexFileName);
  const std::string single_path = join_path(model_dir, kSingleFileName);

  // Anything at the index path (also a directory or a FIFO) makes the model sharded, so that
  // read_text_file names what is wrong with it rather than "no weights".
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(index_path, ec))) {
    if (!fs::exists(fs::symlink_status(single_path, ec))) return explain_missing_weights(model_dir);
    SLIMKV_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(single_path));
    for (const TensorInfo& info : file.tensors()) store.tensors_.emplace(info.name, info);
    store.files_.push_back(std::move(file));
    return store;
  }

  // Sharded: map each shard once, then check index and shards against each other.
  store.sharded_ = true;
  SLIMKV_ASSIGN_OR_RETURN(const auto weight_map, read_weight_map(index_path));
  std::map<std::string, std::vector<std::string>> tensors_by_shard;  // as the index says
  for (const auto& [name, shard] : weight_map) tensors_by_shard[shard].push_back(name);

  std::map<std::string, std::vector<std::string>> shards_holding;  // tensor -> shards that hold it
  for (const auto& [shard, listed] : tensors_by_shard) {
    const std::string shard_path = join_path(model_dir, shard);
    if (const Status readable = check_input_file(shard_path); !readable) {
      return error(index_path, ": weight_map puts ", listed.size(), " tensor(s) (e.g. '",
                   listed.front(), "') in shard ", shard, ", but ", readable.message(),
                   is_regular_file(shard_path) ? "" : " (incomplete download?)");
    }
    SLIMKV_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(shard_path));
    for (const TensorInfo& info : file.tensors()) shards_holding[info.name].push_back(shard);
    store.files_.push_back(std::move(file));
  }

  for (const auto& [name, shards] : shards_holding) {
    if (shards.size() > 1) {
      return error(model_dir, ": tensor '", name, "' is present in two shards, ", shards[0],
                   " and ", shards[1], " (the index puts it in ",
                   weight_map.count(name) ? weight_map.at(name) : std::string("neither"), ")");
    }
    const auto listed = weight_map.find(name);
    if (listed == weight_map.end()) {
      return error(index_path, ": shard ", shards[0], " holds tensor '", name,
                   "', which weight_map does not list (index out of date?)");
    }
    if (listed->second != shards[0]) {
      return error(index_path, ": weight_map puts tensor '", name, "' in shard ", listed->second,
                   ", but it is in shard ", shards[0], " (index out of date?)");
    }
  }
  for (const auto& [name, shard] : weight_map) {
    if (!shards_holding.count(name)) {
      return error(index_path, ": weight_map puts tensor '", name, "' in shard ", shard, ", but ",
                   join_path(model_dir, shard), " does not contain it");
    }
  }

  for (const SafetensorsFile& file : store.files_) {
    for (const TensorInfo& info : file.tensors()) store.tensors_.emplace(info.name, info);
  }
  return store;
}

// ---------------------------------------------------------------------------------------------
// lookups
// ---------------------------------------------------------------------------------------------

WeightStore WeightStore::from_tensors(std::string source, std::vector<TensorInfo> tensors,
                                      std::shared_ptr<const void> owner) {
  WeightStore store;
  store.model_dir_ = std::move(source);
  store.owner_ = std::move(owner);
  for (TensorInfo& info : tensors) store.tensors_.emplace(info.name, std::move(info));
  return store;
}

const TensorInfo* WeightStore::find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Expected<TensorInfo> WeightStore::get(const std::string& name,
                                      const std::vector<int64_t>& shape) const {
  const TensorInfo* info = find(name);
  if (!info) {
    // Suggest the names sharing the longest prefix: usually a naming-scheme mismatch.
    size_t best_prefix = 0;
    std::vector<std::string> similar;
    for (const std::string& candidate : names()) {
      const size_t prefix =
          size_t(std::mismatch(name.begin(), name.end(), candidate.begin(), candidate.end()).first -
                 name.begin());
      if (prefix > best_prefix) {
        best_prefix = prefix;
        similar.clear();
      }
      if (prefix == best_prefix && prefix > 0 && similar.size() < 3) similar.push_back(candidate);
    }
    std::string message = str_cat(model_dir_, ": tensor '", name, "' not found (the model has ",
                                  tensors_.size(), " tensors in ", std::max<size_t>(files_.size(), 1), " file(s))");
    if (!similar.empty()) {
      message += "; similar names: ";
      for (size_t i = 0; i < similar.size(); ++i) message += (i ? ", '" : "'") + similar[i] + "'";
    }
    return Status::error(message);
  }
  if (!info->dtype_supported) {
    return error(info->file, ": tensor '", name, "' has dtype ", info->stored_dtype,
                 ", which slimkv does not compute with (supported: F32, F16, BF16; in GGUF files also ",
                 "Q8_0, Q4_0, Q4_K, Q6_K); re-quantize or dequantize the model");
  }
  if (info->shape != shape) {
    std::string hint;
    if (shape.size() == 2 && info->shape.size() == 2 && shape[0] == info->shape[1] &&
        shape[1] == info->shape[0]) {
      hint = " (transposed? HF stores linear weights as [out_features, in_features])";
    }
    return error(info->file, ": tensor '", name, "' has shape ", shape_string(info->shape),
                 ", expected ", shape_string(shape), hint,
                 ": the checkpoint does not match config.json");
  }
  return *info;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> result;
  result.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) result.push_back(name);
  std::sort(result.begin(), result.end());
  return result;
}

void WeightStore::release_pages(const void* data, size_t bytes) const {
  for (const SafetensorsFile& file : files_) file.release_pages(data, bytes);
}

size_t WeightStore::total_bytes() const {
  size_t total = 0;
  for (const auto& [name, info] : tensors_) total += info.size_bytes;
  return total;
}

}  // namespace slimkv
