#include "kv/codec/hack.h"

#include "attention/cpu/hack_block_attention.h"

namespace slimkv {

std::string describe_quantization(const QuantizationConfig& config) {
  return str_cat("kbits=", config.k_bits, ",vbits=", config.v_bits,
                 ",round=", config.rounding == Rounding::kStochastic ? "stochastic" : "nearest",
                 ",se=", config.store_sums ? "on" : "off", ",rqe=", config.keep_open_exact ? "on" : "off",
                 // Spelled out only when not HACK's defaults, so that existing specs (and the KV transfers
                 // that match stores by them) keep their form.
                 config.k_per_channel ? str_cat(",klayout=channel,kgroup=", config.k_group) : std::string(),
                 config.v_per_token ? str_cat(",vlayout=token,vgroup=", config.v_group) : std::string(),
                 config.symmetric ? ",range=sym" : "");
}

std::string HackCodec::describe() const { return "hack:" + describe_quantization(config_); }

GpuBlockFormat HackCodec::gpu_block_format() const {
  return quantized_gpu_block_format(config_, /*integer_attention=*/true);
}

void HackCodec::seal(const BlockShape& shape, const float* k, const float* v, uint64_t seed, uint8_t* block) const {
  quantize_block(QuantizedBlockLayout(config_, shape), k, v, seed, block);
}

void HackCodec::prepare_queries(const BlockShape& shape, const QueryTile& tile, std::vector<uint8_t>& prepared) const {
  prepare_hack_queries(QuantizedBlockLayout(config_, shape), tile, prepared);
}

void HackCodec::requantize_open_block(const BlockShape& shape, float* k, float* v, int first_new, int tokens,
                                      uint64_t seed) const {
  requantize_partial_block(QuantizedBlockLayout(config_, shape), k, v, first_new, tokens, seed);
}

void HackCodec::attend(const BlockShape& shape, std::span<const uint8_t* const> blocks, const QueryTile& tile,
                       AttentionPartials& partials, int first_partial) const {
  attend_hack_blocks(QuantizedBlockLayout(config_, shape), blocks, tile, partials, first_partial);
}

void HackCodec::decode(const BlockShape& shape, const uint8_t* block, float* k, float* v) const {
  dequantize_block(QuantizedBlockLayout(config_, shape), block, k, v);
}

}  // namespace slimkv
