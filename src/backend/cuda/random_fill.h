// Random FP16 data generated on the GPU, for benchmarks and random-weight models: gigabytes of KV or
// weights made in place instead of being generated on the host and copied over.
#pragma once

#include <cstddef>
#include <cstdint>

#include "slimkv/status.h"

namespace slimkv::cuda {

// Fills n FP16 values at `device` with uniform values in [-amplitude, amplitude), a hash of (seed, index):
// the same seed gives the same data.
Status fill_random_fp16(uint16_t* device, size_t n, uint64_t seed, float amplitude);

}  // namespace slimkv::cuda
