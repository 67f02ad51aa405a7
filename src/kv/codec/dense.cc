#include "kv/codec/dense.h"

#include <cstring>
#include <memory>

#include "attention/cpu/dense_block_attention.h"
#include "backend/cpu/vec_ops.h"
#include "kv/codec/gpu_block_format.h"
#include "util/half.h"

namespace slimkv {

GpuBlockFormat DenseCodec::gpu_block_format() const {
  GpuBlockFormat format;
  if (dtype_ == DType::kBF16) {
    format.unsupported = "dtype=bf16 (the GPU keeps FP16 blocks)";
    return format;
  }
  format.kind = GpuBlockFormat::Kind::kFp16;
  if (dtype_ != DType::kF16) format.runs_as = std::make_shared<DenseCodec>(DType::kF16);
  return format;
}

std::string DenseCodec::describe() const {
  const char* names[] = {"f32", "f16", "bf16"};
  return str_cat("dense:dtype=", names[static_cast<int>(dtype_)]);
}

size_t DenseCodec::block_bytes(const BlockShape& shape) const {
  return size_t(shape.block_tokens) * size_t(shape.k_dim + shape.v_dim) * dtype_size_bytes(dtype_);
}

void DenseCodec::seal(const BlockShape& shape, const float* k, const float* v, uint64_t /*seed*/,
                      uint8_t* block) const {
  const size_t nk = size_t(shape.block_tokens) * size_t(shape.k_dim);
  const size_t nv = size_t(shape.block_tokens) * size_t(shape.v_dim);
  if (dtype_ == DType::kF32) {
    std::memcpy(block, k, nk * 4);
    std::memcpy(block + nk * 4, v, nv * 4);
    return;
  }
  auto* out = reinterpret_cast<uint16_t*>(block);
  const auto narrow = dtype_ == DType::kBF16 ? float_to_bf16 : float_to_fp16;
  for (size_t i = 0; i < nk; ++i) out[i] = narrow(k[i]);
  for (size_t i = 0; i < nv; ++i) out[nk + i] = narrow(v[i]);
}

void DenseCodec::decode(const BlockShape& shape, const uint8_t* block, float* k, float* v) const {
  const size_t nk = size_t(shape.block_tokens) * size_t(shape.k_dim);
  const size_t nv = size_t(shape.block_tokens) * size_t(shape.v_dim);
  const size_t element = dtype_size_bytes(dtype_);
  widen_to_f32(block, dtype_, k, nk);
  widen_to_f32(block + nk * element, dtype_, v, nv);
}

void DenseCodec::decode_tokens(const BlockShape& shape, const uint8_t* block, const int* tokens, int n, float* k,
                               float* v) const {
  const size_t element = dtype_size_bytes(dtype_);
  const uint8_t* v_block = block + size_t(shape.block_tokens) * size_t(shape.k_dim) * element;
  for (int i = 0; i < n; ++i) {
    if (k) {
      widen_to_f32(block + size_t(tokens[i]) * size_t(shape.k_dim) * element, dtype_, k + size_t(i) * shape.k_dim,
                   size_t(shape.k_dim));
    }
    if (v) {
      widen_to_f32(v_block + size_t(tokens[i]) * size_t(shape.v_dim) * element, dtype_, v + size_t(i) * shape.v_dim,
                   size_t(shape.v_dim));
    }
  }
}

size_t DenseCodec::token_read_bytes(const BlockShape& shape, int n, bool keys, bool values) const {
  return size_t(n) * size_t((keys ? shape.k_dim : 0) + (values ? shape.v_dim : 0)) * dtype_size_bytes(dtype_);
}

void DenseCodec::prefetch_tokens(const BlockShape& shape, const uint8_t* block, const int* tokens, int n, bool keys,
                                 bool values) const {
  const size_t element = dtype_size_bytes(dtype_);
  const size_t k_row_bytes = size_t(shape.k_dim) * element, v_row_bytes = size_t(shape.v_dim) * element;
  const uint8_t* v_block = block + size_t(shape.block_tokens) * k_row_bytes;
  for (int i = 0; i < n; ++i) {
    const uint8_t* k_row = block + size_t(tokens[i]) * k_row_bytes;
    const uint8_t* v_row = v_block + size_t(tokens[i]) * v_row_bytes;
    for (size_t b = 0; keys && b < k_row_bytes; b += 64) __builtin_prefetch(k_row + b);
    for (size_t b = 0; values && b < v_row_bytes; b += 64) __builtin_prefetch(v_row + b);
  }
}

void DenseCodec::attend(const BlockShape& shape, std::span<const uint8_t* const> blocks, const QueryTile& tile,
                        AttentionPartials& partials, int first_partial) const {
  attend_dense_blocks(blocks, dtype_, shape, tile, partials, first_partial);
}

}  // namespace slimkv
