#include "kv/codec/codec.h"

#include <vector>

#include "attention/cpu/dense_block_attention.h"

namespace slimkv {

void attend_decoded(const Codec& codec, const BlockShape& shape, const uint8_t* block, const QueryTile& tile,
                    AttentionPartials& partials, int first_partial) {
  thread_local std::vector<float> k, v;
  k.resize(size_t(shape.block_tokens) * size_t(shape.k_dim));
  v.resize(size_t(shape.block_tokens) * size_t(shape.v_dim));
  codec.decode(shape, block, k.data(), v.data());
  attend_block_f32(tile, k.data(), v.data(), shape.k_dim, shape.v_dim, partials, first_partial);
}

}  // namespace slimkv
