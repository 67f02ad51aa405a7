// The GGUF fixtures of tests/data/gguf (llama.cpp's converter and quantizer, scripts/gguf/make_fixtures.py):
// their manifest and llama.cpp's logits stored beside them, read by the CPU's and the GPU's parity tests.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "source_dir.h"

namespace slimkv::test {

inline const std::string kGgufDir = source_dir() + "/tests/data/gguf";

inline nlohmann::json gguf_manifest() {
  std::ifstream in(kGgufDir + "/manifest.json");
  return nlohmann::json::parse(in);
}

// A file of little-endian FP32 values (the logits llama.cpp wrote).
inline std::vector<float> read_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  std::vector<float> values(size_t(in.tellg()) / 4);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(values.data()), std::streamsize(values.size() * 4));
  return values;
}

}  // namespace slimkv::test
