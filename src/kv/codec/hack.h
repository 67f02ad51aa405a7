// The `hack` codec (HACK §5.2–5.3): blocks quantized to b bits (tensor/quantized_block.h), and attention
// computed on the quantized integers with no dequantization (attention/cpu/hack_block_attention.h).
// Spec: hack:bits=2,pi=64 with kbits, vbits (2/4/8), pi (32/64/128: the block size),
// round=stochastic|nearest, se=on|off (summation elimination), rqe=on|off (requantization
// elimination: off requantizes the open block at every append), rot=hadamard|none (default hadamard:
// kv/rotation.h), seed.
#pragma once

#include "kv/codec/codec.h"
#include "kv/codec/gpu_block_format.h"
#include "tensor/quantized_block.h"

namespace slimkv {

class HackCodec final : public Codec {
 public:
  explicit HackCodec(const QuantizationConfig& config) : config_(config) {}
  const QuantizationConfig& config() const { return config_; }

  std::string describe() const override;
  GpuBlockFormat gpu_block_format() const override;
  Status check_shape(const BlockShape& shape) const override { return check_quantized_shape(config_, shape); }
  size_t block_bytes(const BlockShape& shape) const override { return QuantizedBlockLayout(config_, shape).block_bytes; }
  void seal(const BlockShape& shape, const float* k, const float* v, uint64_t seed, uint8_t* block) const override;
  void prepare_queries(const BlockShape& shape, const QueryTile& tile, std::vector<uint8_t>& prepared) const override;
  bool requantizes_open_block() const override { return !config_.keep_open_exact; }
  void requantize_open_block(const BlockShape& shape, float* k, float* v, int first_new, int tokens,
                             uint64_t seed) const override;
  void attend(const BlockShape& shape, std::span<const uint8_t* const> blocks, const QueryTile& tile,
              AttentionPartials& partials, int first_partial) const override;
  void decode(const BlockShape& shape, const uint8_t* block, float* k, float* v) const override;
  // A token selection's rows: only those tokens' codes are read (tensor/quantized_block.h).
  void decode_tokens(const BlockShape& shape, const uint8_t* block, const int* tokens, int n, float* k,
                     float* v) const override {
    dequantize_tokens(QuantizedBlockLayout(config_, shape), block, tokens, n, k, v);
  }
  size_t token_read_bytes(const BlockShape& shape, int n, bool keys, bool values) const override {
    return dequantized_token_bytes(QuantizedBlockLayout(config_, shape), n, keys, values);
  }

 private:
  QuantizationConfig config_;
};

// Describes a quantization config as spec options: "kbits=2,vbits=2,round=stochastic,se=on".
std::string describe_quantization(const QuantizationConfig& config);

}  // namespace slimkv
