#include "kv/codec/quant.h"

#include <vector>

#include "attention/cpu/dense_block_attention.h"
#include "kv/codec/hack.h"

namespace slimkv {

std::string QuantCodec::describe() const { return "quant:" + describe_quantization(config_); }

void QuantCodec::seal(const BlockShape& shape, const float* k, const float* v, uint64_t seed, uint8_t* block) const {
  quantize_block(QuantizedBlockLayout(config_, shape), k, v, seed, block);
}

void QuantCodec::decode(const BlockShape& shape, const uint8_t* block, float* k, float* v) const {
  dequantize_block(QuantizedBlockLayout(config_, shape), block, k, v);
}

void QuantCodec::attend(const BlockShape& shape, const uint8_t* block, const QueryTile& tile,
                        AttentionPartials& partials, int first_partial) const {
  // Dequantize the whole block (the step HACK eliminates), then attend in FP32.
  thread_local std::vector<float> k, v;
  k.resize(size_t(shape.block_tokens) * size_t(shape.k_dim));
  v.resize(size_t(shape.block_tokens) * size_t(shape.v_dim));
  decode(shape, block, k.data(), v.data());
  attend_block_f32(tile, k.data(), v.data(), shape.k_dim, shape.v_dim, partials, first_partial);
}

}  // namespace slimkv
