#include "kv/codec/quant.h"


#include "kv/codec/hack.h"

namespace slimkv {

std::string QuantCodec::describe() const { return "quant:" + describe_quantization(config_); }

GpuBlockFormat QuantCodec::gpu_block_format() const {
  return quantized_gpu_block_format(config_, /*integer_attention=*/false);
}

void QuantCodec::seal(const BlockShape& shape, const float* k, const float* v, uint64_t seed, uint8_t* block) const {
  quantize_block(QuantizedBlockLayout(config_, shape), k, v, seed, block);
}

void QuantCodec::decode(const BlockShape& shape, const uint8_t* block, float* k, float* v) const {
  dequantize_block(QuantizedBlockLayout(config_, shape), block, k, v);
}

void QuantCodec::attend(const BlockShape& shape, std::span<const uint8_t* const> blocks, const QueryTile& tile,
                        AttentionPartials& partials, int first_partial) const {
  attend_decoded(*this, shape, blocks, tile, partials, first_partial);  // dequantize (what HACK avoids), then FP32
}

}  // namespace slimkv
