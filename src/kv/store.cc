#include "kv/store.h"

#include "kv/rotation.h"

#include <cassert>
#include <cstring>

namespace slimkv {

int KvShape::layer_k_dims(int layer) const {
  int dims = 0;
  for (int g = 0; g < num_kv_heads; ++g) dims += k_dim_of(layer, g);
  return dims;
}

int KvShape::layer_v_dims(int layer) const {
  int dims = 0;
  for (int g = 0; g < num_kv_heads; ++g) dims += v_dim_of(layer, g);
  return dims;
}

KvStore::KvStore(const KvShape& shape, const KvPipeline& pipeline)
    : shape_(shape),
      pipeline_(pipeline),
      requantizes_open_(pipeline.codec->requantizes_open_block()),
      layers_(size_t(shape.num_layers)) {
  for (int l = 0; l < shape.num_layers; ++l) {
    layers_[size_t(l)].heads.resize(size_t(shape.num_kv_heads));
    for (int g = 0; g < shape.num_kv_heads; ++g) {
      Head& head = layers_[size_t(l)].heads[size_t(g)];
      head.block_shape = {pipeline.block_tokens, shape.k_dim_of(l, g), shape.v_dim_of(l, g)};
      head.block_bytes = pipeline.codec->block_bytes(head.block_shape);
      head.pool = &pools_.try_emplace(head.block_bytes, head.block_bytes).first->second;
      head.open_k.assign(size_t(block_tokens()) * size_t(head.block_shape.k_dim), 0.0f);
      head.open_v.assign(size_t(block_tokens()) * size_t(head.block_shape.v_dim), 0.0f);
    }
  }
}

int KvStore::num_sealed_blocks(int layer) const { return int(layers_[size_t(layer)].heads[0].sealed.size()); }

uint64_t KvStore::block_seed(int layer, int head, int index) const {
  // splitmix64 of the block's identity: reproducible, and independent between blocks.
  uint64_t z = pipeline_.seed ^ (uint64_t(layer) << 40) ^ (uint64_t(head) << 24) ^ uint64_t(index);
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void KvStore::append(int layer_index, const float* k, const float* v, int n) {
  Layer& layer = layers_[size_t(layer_index)];
  assert(layer.num_tokens + n <= shape_.max_tokens);
  const size_t k_row = size_t(shape_.layer_k_dims(layer_index)), v_row = size_t(shape_.layer_v_dims(layer_index));
  for (int t = 0; t < n; ++t) {
    const int slot = layer.num_tokens - int(layer.heads[0].sealed.size()) * block_tokens();
    size_t k_offset = 0, v_offset = 0;  // of head g within the token's row
    for (Head& head : layer.heads) {
      const size_t k_dim = size_t(head.block_shape.k_dim), v_dim = size_t(head.block_shape.v_dim);
      float* open_k = head.open_k.data() + size_t(slot) * k_dim;
      float* open_v = head.open_v.data() + size_t(slot) * v_dim;
      std::memcpy(open_k, k + size_t(t) * k_row + k_offset, k_dim * sizeof(float));
      std::memcpy(open_v, v + size_t(t) * v_row + v_offset, v_dim * sizeof(float));
      k_offset += k_dim;
      v_offset += v_dim;
      if (pipeline_.hadamard) {
        hadamard_rotate(open_k, int(k_dim));
        hadamard_rotate(open_v, int(v_dim));
      }
    }
    if (requantizes_open_) {  // the HACK/RQE ablation: the partial block is kept quantized
      for (int g = 0; g < shape_.num_kv_heads; ++g) {
        Head& head = layer.heads[size_t(g)];
        pipeline_.codec->requantize_open_block(head.block_shape, head.open_k.data(), head.open_v.data(), slot,
                                               slot + 1,
                                               block_seed(layer_index, g, int(head.sealed.size())) ^ uint64_t(slot));
      }
    }
    ++layer.num_tokens;
    if (slot + 1 == block_tokens()) {  // the open block is full: seal it
      for (int g = 0; g < shape_.num_kv_heads; ++g) {
        Head& head = layer.heads[size_t(g)];
        uint8_t* block = head.pool->allocate();
        pipeline_.codec->seal(head.block_shape, head.open_k.data(), head.open_v.data(),
                              block_seed(layer_index, g, int(head.sealed.size())), block);
        head.sealed.push_back(block);
      }
    }
  }
}

KvMemory KvStore::memory() const {
  KvMemory memory;
  for (const auto& [unused, pool] : pools_) {
    memory.sealed_blocks += pool.blocks_in_use();
    memory.sealed_bytes += pool.bytes_in_use();
  }
  memory.sealed_tokens = layers_.empty() ? 0 : size_t(num_sealed_blocks(0)) * size_t(block_tokens());
  for (const Layer& layer : layers_) {
    for (const Head& head : layer.heads) memory.open_bytes += (head.open_k.size() + head.open_v.size()) * sizeof(float);
  }
  return memory;
}

void KvStore::restore_sealed_block(int layer, int head, const uint8_t* block) {
  Head& target = layers_[size_t(layer)].heads[size_t(head)];
  assert(layers_[size_t(layer)].num_tokens == 0);  // sealed blocks come before the open tokens
  uint8_t* slot = target.pool->allocate();
  std::memcpy(slot, block, target.block_bytes);
  target.sealed.push_back(slot);
}

void KvStore::restore_open_tokens(int layer_index, int head, const float* k, const float* v, int n) {
  Layer& layer = layers_[size_t(layer_index)];
  Head& target = layer.heads[size_t(head)];
  assert(n >= 0 && n < block_tokens());
  assert(target.sealed.size() == layer.heads[0].sealed.size());
  if (n > 0) {
    std::memcpy(target.open_k.data(), k, size_t(n) * size_t(target.block_shape.k_dim) * sizeof(float));
    std::memcpy(target.open_v.data(), v, size_t(n) * size_t(target.block_shape.v_dim) * sizeof(float));
  }
  layer.num_tokens = int(target.sealed.size()) * block_tokens() + n;  // the same for every head
}

void KvStore::clear() {
  for (auto& [unused, pool] : pools_) pool.clear();
  for (Layer& layer : layers_) {
    layer.num_tokens = 0;
    for (Head& head : layer.heads) head.sealed.clear();
  }
}

}  // namespace slimkv
