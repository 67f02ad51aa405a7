// The `dense` codec: K and V stored as they are, in FP32, FP16 or BF16 (`dense:dtype=f16`).
// Layout of a block: K [block_tokens, k_dim] then V [block_tokens, v_dim], row-major, in dtype.
#pragma once

#include "kv/codec/codec.h"
#include "slimkv/status.h"
#include "tensor/dtype.h"

namespace slimkv {

class DenseCodec final : public Codec {
 public:
  explicit DenseCodec(DType dtype) : dtype_(dtype) {}

  std::string describe() const override;
  // FP16 pages on the GPU: dtype=f16 as it is, dtype=f32 as `dense:dtype=f16` (the GPU keeps no FP32
  // blocks); bf16 not yet.
  GpuBlockFormat gpu_block_format() const override;
  // FP32 blocks are the lossless baseline: an FP16 open block would round every token before sealing.
  DType open_block_dtype() const override { return dtype_ == DType::kF32 ? DType::kF32 : DType::kF16; }
  size_t block_bytes(const BlockShape& shape) const override;
  void seal(const BlockShape& shape, const float* k, const float* v, uint64_t seed, uint8_t* block) const override;
  void attend(const BlockShape& shape, std::span<const uint8_t* const> blocks, const QueryTile& tile,
              AttentionPartials& partials, int first_partial) const override;
  void decode(const BlockShape& shape, const uint8_t* block, float* k, float* v) const override;
  void decode_tokens(const BlockShape& shape, const uint8_t* block, const int* tokens, int n, float* k,
                     float* v) const override;  // reads only those rows
  size_t token_read_bytes(const BlockShape& shape, int n, bool keys, bool values) const override;
  void prefetch_tokens(const BlockShape& shape, const uint8_t* block, const int* tokens, int n, bool keys,
                       bool values) const override;

 private:
  DType dtype_;
};

}  // namespace slimkv
