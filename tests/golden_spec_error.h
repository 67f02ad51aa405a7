// What the family tests share on the CPU (tests/engine/model_families_test.cc) and the GPU
// (tests/cuda/model_families_cuda_test.cc): how far a KV spec moves a golden model's logits from
// transformers', over its golden tokens in a prefill and then decode steps.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <unistd.h>
#include <vector>

#include "golden_models.h"
#include "slimkv/npy.h"
#include "slimkv/zack_calibration_run.h"

namespace slimkv {

inline std::string golden_model_dir(const std::string& name) { return kGoldenModels + "/" + name; }

inline std::unique_ptr<Engine> load_golden_engine(const std::string& dir, const std::string& kv,
                                                  const std::string& device = "cpu") {
  EngineConfig config;
  config.model_dir = dir;
  config.kv_spec = kv;
  config.device = device;
  config.threads = 2;
  auto engine = Engine::load(config);
  EXPECT_TRUE(engine) << kv << " on " << device << ": " << engine.status().message();
  return engine ? engine.take() : nullptr;
}

// The tokens' logits: the first `prefill` in one call, the rest one decode step each (where PQ selects
// and sealed blocks are read by each codec's decode path).
inline std::vector<float> prefill_then_decode_logits(Engine& engine, const std::vector<int32_t>& tokens, size_t prefill) {
  auto session = engine.new_session();
  auto all = session->prefill(std::span(tokens).first(prefill), /*all_logits=*/true);
  EXPECT_TRUE(all) << all.status().message();
  if (!all) return {};
  for (size_t t = prefill; t < tokens.size(); ++t) {
    auto row = session->decode(tokens[t]);
    EXPECT_TRUE(row) << row.status().message();
    if (!row) return {};
    all->insert(all->end(), row->begin(), row->end());
  }
  return *all;
}

// A ZACK calibration of the model from its own forward pass (on the CPU) over `n` seeded random
// tokens, written to a temporary file (its path).
inline std::string zack_calibration_file(const std::string& name, int n) {
  auto dense = load_golden_engine(golden_model_dir(name), "dense");
  if (!dense) return {};
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[size_t(i)] = int32_t((i * 7919 + 13) % dense->vocab_size());
  auto calibration = run_zack_calibration(*dense, ids, {.window_tokens = 128, .source = "random ids"});
  EXPECT_TRUE(calibration) << calibration.status().message();
  const std::string path =
      (std::filesystem::temp_directory_path() / (name + ".zack." + std::to_string(::getpid()))).string();
  EXPECT_TRUE(calibration && calibration->write(path).is_ok());
  return path;
}

// max |logits − golden| / max |golden| of `spec` on `device` over model `name`'s golden tokens (prefill
// 100, then 50 decode steps); `spec` may name a calibration as {calib}, made here from the model itself.
inline double golden_spec_error(const std::string& name, std::string spec, const std::string& device = "cpu") {
  const std::string dir = golden_model_dir(name);
  auto golden = read_npy_f32(dir + "/golden_logits.npy");
  EXPECT_TRUE(golden) << golden.status().message();
  std::string calibration;
  if (const size_t at = spec.find("{calib}"); at != std::string::npos) {
    calibration = zack_calibration_file(name, 256);
    if (calibration.empty()) return INFINITY;
    spec.replace(at, 7, calibration);
  }
  auto engine = load_golden_engine(dir, spec, device);
  if (!calibration.empty()) std::filesystem::remove(calibration);
  if (!engine || !golden) return INFINITY;
  const std::vector<float> found = prefill_then_decode_logits(*engine, golden_tokens(dir), 100);
  EXPECT_EQ(found.size(), golden->values.size());
  const double err = found.size() == golden->values.size() ? relative_max_error(found, golden->values) : INFINITY;
  std::printf("%s %s on %s: max error / max|logit| %.2e\n", name.c_str(), spec.c_str(), device.c_str(), err);
  return err;
}

}  // namespace slimkv
