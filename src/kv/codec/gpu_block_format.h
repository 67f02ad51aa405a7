// What the GPU's KV caches (kv/cuda/) run of a codec's sealed blocks, as the codec states it
// (Codec::gpu_block_format), asked once when a model is made for device "cuda": so that the GPU side
// recognises no codec by its type or its spec string, and a codec the GPU learns says so here.
#pragma once

#include <memory>
#include <string>

#include "tensor/quantized_block.h"

namespace slimkv {

struct GpuBlockFormat {
  enum class Kind {
    kNone,       // the GPU has no kernels for these blocks (unsupported says what it lacks)
    kFp16,       // FP16 pages (kv/cuda/paged_kv_cache.h)
    kQuantized,  // quantized blocks in quantized_block.h's byte layout (kv/cuda/quantized_kv_cache.h)
  };
  Kind kind = Kind::kNone;
  std::string unsupported;          // kNone: what of the codec the GPU does not run, for the error
  QuantizationConfig quantization;  // kQuantized: the blocks' bits and rounding
  bool integer_attention = false;   // kQuantized: attention on the codes (HACK Eq. 4); false: dequantized
  // The codec as the GPU runs it, when that differs from the codec asked (dense FP32 runs as FP16
  // blocks: `dense:dtype=f16`, the spec a GPU's KV transfer carries); null: the same codec.
  std::shared_ptr<const Codec> runs_as;
};

// The quantized codecs' answer (hack: integer_attention): kQuantized when the GPU kernels hold the
// config (equal K/V bits, stored sums, exact open block), else kNone naming what they lack.
GpuBlockFormat quantized_gpu_block_format(const QuantizationConfig& config, bool integer_attention);

}  // namespace slimkv
