// What the GPU runs of a KV pipeline (kv/kv_factory.h): the options of its KV cache (gpu_kv_cache.h) and
// the pipeline as the GPU runs it, whose describe() is the device's KV spec (the key its KV transfers
// carry: `dense` runs as `dense:dtype=f16`). The codec states its GPU form (Codec::gpu_block_format);
// nothing here looks at a codec's type or spec string.
#pragma once

#include <string>

#include "kv/cuda/gpu_kv_cache.h"
#include "kv/kv_factory.h"

namespace slimkv::cuda {

struct GpuKvPlan {
  GpuKvOptions options;
  KvPipeline pipeline;        // as the GPU runs it
  bool rotate_heads = false;  // rot=hadamard
};

// An error names what of `spec` the GPU does not run yet. hidden, kv_dim: the model's (the kvpr tier's
// profile of this machine is measured, or read from its cache, for that GEMM shape).
Expected<GpuKvPlan> plan_gpu_kv(const KvPipeline& pipeline, const std::string& spec, int hidden, int kv_dim);

}  // namespace slimkv::cuda
