// A short fingerprint of a model's weights, for files computed from them (a ZACK calibration) that
// must not be used with another model: a hash of config.json and, for every tensor in name order, its
// name, dtype, shape and first and last 4 KiB of data. Cheap (a few pages per tensor are read), and a
// fine-tune of the same architecture differs in its bytes.
#pragma once

#include <string>

#include "model/weight_store.h"
#include "slimkv/status.h"

namespace slimkv {

// "fnv1a64:<16 hex digits>"; fails only when config.json cannot be read (a GGUF file has none: its
// tensors alone are hashed).
Expected<std::string> model_identity(const std::string& model_dir, const WeightStore& weights);

}  // namespace slimkv
