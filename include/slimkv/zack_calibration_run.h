// `slimkv calibrate`'s work (ZACK §4.3, §6.6): runs an engine's model over calibration tokens in
// windows of the model's context and gathers the ZACK calibration (engine/zack_calibrator.h).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "slimkv/zack_calibration.h"
#include "slimkv/engine.h"

namespace slimkv {

struct ZackCalibrationRun {
  int window_tokens = 0;  // tokens per forward run; 0 = the model's context
  std::string source;     // what the tokens are, recorded in the file
  // Called after each window with (tokens done, tokens in all); may be empty.
  std::function<void(int64_t, int64_t)> progress = nullptr;
};

// The engine must be a plain one (no zack stage: calibration needs the model's own q, k, v).
Expected<ZackCalibration> run_zack_calibration(Engine& engine, std::span<const int32_t> tokens,
                                               const ZackCalibrationRun& run);

}  // namespace slimkv
