// The `quant` codec: the same quantized blocks as `hack`, read the way KIVI/KVQuant-style caches read
// them — dequantized to FP32, then ordinary attention. HACK is measured against it; at equal bits
// its accuracy matches hack's (the only difference is hack's 8-bit Q and P).
// Spec: quant:bits=2,pi=64 with kbits, vbits, pi, round, seed.
#pragma once

#include "kv/codec/codec.h"
#include "kv/codec/gpu_block_format.h"
#include "tensor/quantized_block.h"

namespace slimkv {

class QuantCodec final : public Codec {
 public:
  explicit QuantCodec(const QuantizationConfig& config) : config_(config) {}
  const QuantizationConfig& config() const { return config_; }

  std::string describe() const override;
  GpuBlockFormat gpu_block_format() const override;
  Status check_shape(const BlockShape& shape) const override { return check_quantized_shape(config_, shape); }
  size_t block_bytes(const BlockShape& shape) const override { return QuantizedBlockLayout(config_, shape).block_bytes; }
  void seal(const BlockShape& shape, const float* k, const float* v, uint64_t seed, uint8_t* block) const override;
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

}  // namespace slimkv
