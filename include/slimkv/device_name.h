// The device an engine runs on, as `--device` and EngineConfig::device name it: "cpu", or "cuda" /
// "cuda:N" for visible GPU N (the order CUDA_VISIBLE_DEVICES gives; "cuda" is "cuda:0"). One parser for
// the CLI, the Python module and the engine, so each refuses a bad name with the same message before
// anything loads.
#pragma once

#include <string_view>

#include "slimkv/status.h"

namespace slimkv {

struct DeviceName {
  bool cuda = false;
  int gpu = 0;  // with cuda: the visible GPU's index (cudaSetDevice's); 0 otherwise
};

// An error names the text and the expected forms: "cuda:x", "cuda:-1", "cuda:" and "cpu:1" are refused.
// Whether GPU N exists is the CUDA backend's to say (Engine::load asks it before loading the model).
Expected<DeviceName> parse_device_name(std::string_view name);

}  // namespace slimkv
