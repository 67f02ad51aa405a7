// KVPR's profiler module (../shared/papers/004, §3.1): measures the two rates of this machine that the
// cost model (kv/tier/kvpr_cost_model.h, Eq. 10) divides by, the host-to-device link's bytes/s (v_com)
// and the GPU's FLOP/s on the recomputation GEMM (v_gpu), and caches them in a file so that start-up
// measures once per machine, model shape and dtype. Plain C++: no CUDA headers, like device_memory.h.
#pragma once

#include <string>

#include "slimkv/status.h"
#include "tensor/dtype.h"

namespace slimkv::cuda {

struct KvprProfile {
  std::string device;           // cudaGetDeviceProperties name + ", " + PCI bus id (identifies the GPU)
  int hidden = 0, kv_rows = 0;  // the recompute GEMM's shape: X[rows, hidden] · W_kvᵀ, W_kv [kv_rows = 2·kv_dim, hidden]
  std::string dtype;            // "f16" | "bf16"
  double link_bytes_per_s = 0;  // pinned host→device cudaMemcpyAsync bandwidth (v_com)
  double gemm_flops_per_s = 0;  // cuBLAS throughput of that GEMM (v_gpu), FLOPs = 2·rows·hidden·kv_rows
};

// Measures the current device: copies of pinned host memory to it (64, 128 and 256 MiB, after a
// warm-up, the median of repeats) and the recompute GEMM through CublasGemm at 1024, 4096 and 16384
// rows, reporting the rate at the largest (see kvpr_profiler.cc for why). Copies 2.6 GiB and runs 180
// GEMMs (a fraction of a second at GPU.md's H100 rates, 54 GB/s and ~760 TFLOP/s), holding 256 MiB of
// pinned host memory and a few hundred MiB of device memory meanwhile.
Expected<KvprProfile> measure_kvpr_profile(int hidden, int kv_rows, DType dtype);

// The profile cached in `path` when the file holds one for this device, shape and dtype and not
// `remeasure`; otherwise measures, writes it into the file (atomically, creating the directory,
// replacing only an entry of the same device, shape and dtype) and returns it. The file is JSON,
// {"profiles": [KvprProfile, ...]}, so several models and GPUs share one cache. A file that exists but
// is not valid JSON or lacks a field is an error naming the file and the field, never overwritten.
Expected<KvprProfile> load_or_measure_kvpr_profile(const std::string& path, int hidden, int kv_rows, DType dtype,
                                                   bool remeasure);

// $SLIMKV_KVPR_PROFILE if set, else $XDG_CACHE_HOME/slimkv/kvpr_profile.json, else
// $HOME/.cache/slimkv/kvpr_profile.json (an empty variable counts as unset, as the XDG spec says);
// kvpr_profile.json in the working directory when none is set.
std::string default_kvpr_profile_path();

}  // namespace slimkv::cuda
