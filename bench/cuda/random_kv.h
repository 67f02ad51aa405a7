// A one-layer KV cache of random K/V for the attention benchmarks: `batch` sequences of `context`
// tokens, dense (FP16 blocks, kv/cuda/paged_kv_cache.h) or quantized (`hack` / `quant` blocks
// sealed as steps seal them and an FP16 window, kv/cuda/quantized_kv_cache.h). Written a chunk at
// a time, the last `last_step` tokens of each sequence as one step of their own: the step whose
// attention is timed (a prefill step reads them from the FP16 window). The same options give the same
// values in either cache.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "kv/cuda/paged_kv_cache.h"
#include "kv/cuda/quantized_kv_cache.h"
#include "backend/cuda/random_fill.h"

namespace slimkv::cuda {

struct RandomKvOptions {
  int batch = 8, context = 4096, last_step = 1, kv_heads = 8, head_dim = 128;
  std::string kv = "dense";  // dense, hack or quant
  int bits = 2;              // hack / quant, K and V
  QuantizationConfig quantization = {};  // hack / quant: the rest (layouts, groups, range, rounding)
  HeadDims head_dims = {};  // hack / quant: each KV head at its own K and V dims ([kv_heads] each: ZACK's ranks)
};

struct RandomKv {
  std::unique_ptr<CudaPagedKvCache> dense;
  std::unique_ptr<CudaQuantizedKvCache> quantized;
  std::vector<int> ids;
  double append_ms = 0;  // GPU time of the appends (quantized: writing the window and sealing)
  PagedKvView view() const { return dense ? dense->view(0) : quantized->view(0); }
};

inline Expected<RandomKv> random_kv(const RandomKvOptions& o) {
  constexpr int kChunkTokens = 8192;  // small step buffers
  const int blocks_per_sequence = (o.context + kCudaBlockTokens - 1) / kCudaBlockTokens;
  const int step_tokens = std::max(std::min(o.context, kChunkTokens), o.last_step);
  const CudaKvShape shape{1, o.kv_heads, o.head_dim, o.batch * blocks_per_sequence, o.batch, blocks_per_sequence,
                          o.batch * step_tokens};
  RandomKv kv;
  if (o.kv == "dense") {
    SLIMKV_ASSIGN_OR_RETURN(kv.dense, CudaPagedKvCache::create(shape));
  } else {
    QuantizationConfig config = o.quantization;
    config.k_bits = config.v_bits = o.bits;
    SLIMKV_ASSIGN_OR_RETURN(kv.quantized, CudaQuantizedKvCache::create(shape, config, o.kv == "hack", 7, o.head_dims));
  }
  for (int b = 0; b < o.batch; ++b) {
    SLIMKV_ASSIGN_OR_RETURN(int id, kv.dense ? kv.dense->sequences().add_sequence() : kv.quantized->add_sequence());
    kv.ids.push_back(id);
  }
  const size_t step_elements = size_t(o.batch) * step_tokens * o.kv_heads * o.head_dim;
  SLIMKV_ASSIGN_OR_RETURN(auto k_step, DeviceArray<uint16_t>::allocate(step_elements, "K chunk"));
  SLIMKV_ASSIGN_OR_RETURN(auto v_step, DeviceArray<uint16_t>::allocate(step_elements, "V chunk"));
  cudaEvent_t start, stop;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  Status status = Status::ok();
  const auto append = [&](int n, int chunk) -> Status {
    const std::vector<int> counts(size_t(o.batch), n);
    SLIMKV_RETURN_IF_ERROR(kv.dense ? kv.dense->begin_step(kv.ids, counts) : kv.quantized->begin_step(kv.ids, counts));
    const size_t elements = size_t(o.batch) * n * o.kv_heads * o.head_dim;
    SLIMKV_RETURN_IF_ERROR(fill_random_fp16(k_step.data(), elements, 2 * uint64_t(chunk) + 1, 2.0f));
    SLIMKV_RETURN_IF_ERROR(fill_random_fp16(v_step.data(), elements, 2 * uint64_t(chunk) + 2, 1.0f));
    SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(start));
    SLIMKV_RETURN_IF_ERROR(kv.dense ? kv.dense->append(0, k_step.data(), v_step.data())
                                    : kv.quantized->append(0, k_step.data(), v_step.data()));
    SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop));
    SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
    float ms = 0;
    SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
    kv.append_ms += ms;
    return Status::ok();
  };
  const int before_last = o.context - o.last_step;
  int chunk = 0;
  for (int filled = 0; filled < before_last && status.is_ok(); filled += kChunkTokens) {
    status = append(std::min(kChunkTokens, before_last - filled), chunk++);
  }
  if (status.is_ok() && o.last_step > 0) status = append(o.last_step, chunk);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  SLIMKV_RETURN_IF_ERROR(status);
  return kv;
}

}  // namespace slimkv::cuda
