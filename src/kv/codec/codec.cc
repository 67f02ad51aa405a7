#include "kv/codec/codec.h"

#include <cstring>
#include <vector>

#include "attention/cpu/dense_block_attention.h"
#include "kv/codec/gpu_block_format.h"

namespace slimkv {

void attend_decoded(const Codec& codec, const BlockShape& shape, std::span<const uint8_t* const> blocks,
                    const QueryTile& tile, AttentionPartials& partials, int first_partial) {
  thread_local std::vector<float> k, v;
  k.resize(size_t(shape.block_tokens) * size_t(shape.k_dim));
  v.resize(size_t(shape.block_tokens) * size_t(shape.v_dim));
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (i + 1 < blocks.size()) prefetch_block(blocks[i + 1], codec.block_bytes(shape));
    codec.decode(shape, blocks[i], k.data(), v.data());
    attend_block_f32(tile, k.data(), v.data(), shape.k_dim, shape.v_dim, partials, first_partial);
  }
}

void prefetch_block(const uint8_t* block, size_t bytes) {
  for (size_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(block + offset, 0, 2);
}

void Codec::decode_tokens(const BlockShape& shape, const uint8_t* block, const int* tokens, int n, float* k,
                          float* v) const {
  thread_local std::vector<float> block_k, block_v;
  block_k.resize(size_t(shape.block_tokens) * size_t(shape.k_dim));
  block_v.resize(size_t(shape.block_tokens) * size_t(shape.v_dim));
  decode(shape, block, block_k.data(), block_v.data());
  for (int i = 0; i < n; ++i) {
    if (k) {
      std::memcpy(k + size_t(i) * shape.k_dim, block_k.data() + size_t(tokens[i]) * shape.k_dim,
                  size_t(shape.k_dim) * sizeof(float));
    }
    if (v) {
      std::memcpy(v + size_t(i) * shape.v_dim, block_v.data() + size_t(tokens[i]) * shape.v_dim,
                  size_t(shape.v_dim) * sizeof(float));
    }
  }
}

GpuBlockFormat Codec::gpu_block_format() const {
  GpuBlockFormat format;
  format.unsupported = describe();
  return format;
}

GpuBlockFormat quantized_gpu_block_format(const QuantizationConfig& config, bool integer_attention) {
  GpuBlockFormat format;
  if (config.k_bits != config.v_bits) {
    format.unsupported = "kbits != vbits";
  } else if (!config.store_sums || !config.keep_open_exact) {
    format.unsupported = "the se=off / rqe=off ablations";
  } else if (!integer_attention && (config.k_per_channel || config.v_per_token)) {
    format.unsupported = "quant with klayout=channel / vlayout=token (kivi too): the GPU reads them with hack only";
  } else {
    format.kind = GpuBlockFormat::Kind::kQuantized;
    format.quantization = config;
    format.integer_attention = integer_attention;
  }
  return format;
}

}  // namespace slimkv
