// How the CUDA benchmarks end on an error: the status's message on stderr, then exit status 1.
#pragma once

#include <cstdio>

#include "slimkv/status.h"

namespace slimkv::cuda {

// True (after printing "error: <message>") when status is an error.
inline bool failed(const Status& status) {
  if (!status) std::fprintf(stderr, "error: %s\n", status.message().c_str());
  return !status;
}

}  // namespace slimkv::cuda
