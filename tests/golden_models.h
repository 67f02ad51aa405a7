// What the tests that hold slimkv to Hugging Face share (tests/engine/hf_parity_test.cc on the CPU,
// tests/cuda/llama_cuda_test.cc on the GPU): the golden models made by scripts/golden/make_golden.py,
// their token ids, and the error measure logits are compared by.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/sampler.h"
#include "model/model_config.h"
#include "slimkv/engine.h"
#include "source_dir.h"

namespace slimkv {

inline const std::string kGoldenModels = slimkv::test::source_dir() + "/tests/data/models";

// Every directory under tests/data/models with golden logits, sorted.
inline std::vector<std::string> golden_models() {
  std::vector<std::string> dirs;
  for (const auto& entry : std::filesystem::directory_iterator(kGoldenModels)) {
    if (std::filesystem::exists(entry.path() / "golden_logits.npy")) dirs.push_back(entry.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

// The comma-separated ids of DIR/golden_tokens.txt.
inline std::vector<int32_t> golden_tokens(const std::string& dir) {
  std::ifstream in(dir + "/golden_tokens.txt");
  std::vector<int32_t> ids;
  std::string piece;
  while (std::getline(in, piece, ',')) ids.push_back(std::stoi(piece));
  return ids;
}

// max |a − b| / max |b|; infinite when a holds a NaN or infinity.
inline double relative_max_error(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    err = std::max(err, double(std::fabs(a[i] - b[i])));
    ref = std::max(ref, double(std::fabs(b[i])));
  }
  return err / ref;
}

// DIR/golden_greedy.json: transformers' greedy continuation of a prompt.
struct GoldenGreedy {
  std::vector<int32_t> prompt;
  std::vector<int32_t> generated;
};
inline GoldenGreedy golden_greedy(const std::string& dir) {
  std::ifstream in(dir + "/golden_greedy.json");
  const auto json = nlohmann::json::parse(in);
  return {json["prompt"].get<std::vector<int32_t>>(), json["generated"].get<std::vector<int32_t>>()};
}

// The session's greedy continuation of `prompt`, n tokens long.
inline Expected<std::vector<int32_t>> greedy_continuation(Session& session, const std::vector<int32_t>& prompt, size_t n) {
  SLIMKV_ASSIGN_OR_RETURN(std::vector<float> logits, session.prefill(prompt));
  std::vector<int32_t> generated;
  while (n > 0) {
    generated.push_back(argmax(logits));
    if (generated.size() >= n) break;
    SLIMKV_ASSIGN_OR_RETURN(logits, session.decode(generated.back()));
  }
  return generated;
}

}  // namespace slimkv
