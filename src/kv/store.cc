#include "kv/store.h"

#include <cassert>
#include <cstring>

#include "kv/rotation.h"
#include "util/random.h"

namespace slimkv {

KvStore::KvStore(const KvShape& shape, const KvPipeline& pipeline)
    : shape_(shape),
      pipeline_(pipeline),
      block_shape_{pipeline.block_tokens, shape.k_dim, shape.v_dim},
      pool_(pipeline.codec->block_bytes(block_shape_)),
      requantizes_open_(pipeline.codec->requantizes_open_block()),
      layers_(size_t(shape.num_layers)) {
  for (Layer& layer : layers_) {
    layer.heads.resize(size_t(shape.num_kv_heads));
    for (Head& head : layer.heads) {
      head.open_k.assign(size_t(block_tokens()) * size_t(shape.k_dim), 0.0f);
      head.open_v.assign(size_t(block_tokens()) * size_t(shape.v_dim), 0.0f);
    }
  }
}

int KvStore::num_sealed_blocks(int layer) const { return int(layers_[size_t(layer)].heads[0].sealed.size()); }

uint64_t KvStore::block_seed(int layer, int head, int index) const {
  // splitmix64 of the block's identity: reproducible, and independent between blocks.
  return splitmix64(pipeline_.seed ^ (uint64_t(layer) << 40) ^ (uint64_t(head) << 24) ^ uint64_t(index));
}

void KvStore::append(int layer_index, const float* k, const float* v, int n) {
  Layer& layer = layers_[size_t(layer_index)];
  assert(layer.num_tokens + n <= shape_.max_tokens);
  const size_t k_dim = size_t(shape_.k_dim), v_dim = size_t(shape_.v_dim);
  for (int t = 0; t < n; ++t) {
    const int slot = layer.num_tokens - int(layer.heads[0].sealed.size()) * block_tokens();
    for (int g = 0; g < shape_.num_kv_heads; ++g) {
      Head& head = layer.heads[size_t(g)];
      std::memcpy(head.open_k.data() + size_t(slot) * k_dim, k + (size_t(t) * shape_.num_kv_heads + g) * k_dim,
                  k_dim * sizeof(float));
      std::memcpy(head.open_v.data() + size_t(slot) * v_dim, v + (size_t(t) * shape_.num_kv_heads + g) * v_dim,
                  v_dim * sizeof(float));
    }
    if (pipeline_.hadamard) {
      for (Head& head : layer.heads) {
        hadamard_rotate(head.open_k.data() + size_t(slot) * k_dim, shape_.k_dim);
        hadamard_rotate(head.open_v.data() + size_t(slot) * v_dim, shape_.v_dim);
      }
    }
    if (requantizes_open_) {  // the HACK/RQE ablation: the partial block is kept quantized
      for (int g = 0; g < shape_.num_kv_heads; ++g) {
        Head& head = layer.heads[size_t(g)];
        pipeline_.codec->requantize_open_block(block_shape_, head.open_k.data(), head.open_v.data(), slot, slot + 1,
                                               block_seed(layer_index, g, int(head.sealed.size())) ^ uint64_t(slot));
      }
    }
    ++layer.num_tokens;
    if (slot + 1 == block_tokens()) {  // the open block is full: seal it
      for (int g = 0; g < shape_.num_kv_heads; ++g) {
        Head& head = layer.heads[size_t(g)];
        uint8_t* block = pool_.allocate();
        pipeline_.codec->seal(block_shape_, head.open_k.data(), head.open_v.data(),
                              block_seed(layer_index, g, int(head.sealed.size())), block);
        head.sealed.push_back(block);
      }
    }
  }
}

KvMemory KvStore::memory() const {
  KvMemory memory;
  memory.sealed_blocks = pool_.blocks_in_use();
  memory.sealed_bytes = pool_.bytes_in_use();
  memory.sealed_tokens = layers_.empty() ? 0 : size_t(num_sealed_blocks(0)) * size_t(block_tokens());
  memory.open_bytes = size_t(shape_.num_layers) * size_t(shape_.num_kv_heads) * size_t(block_tokens()) *
                      size_t(shape_.k_dim + shape_.v_dim) * sizeof(float);
  return memory;
}

void KvStore::restore_sealed_block(int layer, int head, const uint8_t* block) {
  Head& target = layers_[size_t(layer)].heads[size_t(head)];
  assert(layers_[size_t(layer)].num_tokens == 0);  // sealed blocks come before the open tokens
  uint8_t* slot = pool_.allocate();
  std::memcpy(slot, block, pipeline_.codec->block_bytes(block_shape_));
  target.sealed.push_back(slot);
}

void KvStore::restore_open_tokens(int layer_index, int head, const float* k, const float* v, int n) {
  Layer& layer = layers_[size_t(layer_index)];
  Head& target = layer.heads[size_t(head)];
  assert(n >= 0 && n < block_tokens());
  assert(target.sealed.size() == layer.heads[0].sealed.size());
  if (n > 0) {
    std::memcpy(target.open_k.data(), k, size_t(n) * size_t(shape_.k_dim) * sizeof(float));
    std::memcpy(target.open_v.data(), v, size_t(n) * size_t(shape_.v_dim) * sizeof(float));
  }
  layer.num_tokens = int(target.sealed.size()) * block_tokens() + n;  // the same for every head
}

void KvStore::clear() {
  pool_.clear();
  for (Layer& layer : layers_) {
    layer.num_tokens = 0;
    for (Head& head : layer.heads) head.sealed.clear();
  }
}

}  // namespace slimkv
