#include "kv/store.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <stdexcept>

#include "kv/rotation.h"
#include "util/random.h"
#include "util/thread_pool.h"

namespace slimkv {

KvStore::KvStore(const KvShape& shape, const KvPipeline& pipeline)
    : shape_(shape),
      pipeline_(pipeline),
      block_shape_{pipeline.block_tokens, shape.k_dim, shape.v_dim},
      pool_(pipeline.codec->block_bytes(block_shape_)),
      requantizes_open_(pipeline.codec->requantizes_open_block()),
      layers_(size_t(shape.num_layers)),
      selector_((pipeline.selector ? *pipeline.selector : *make_all_selector_factory())
                    .make(shape.num_layers, shape.num_kv_heads, shape.k_dim, pipeline.block_tokens, pipeline.seed)),
      selections_(size_t(shape.num_layers), std::vector<HeadSelection>(size_t(shape.num_kv_heads))) {
  if (pipeline.offload) {
    const size_t max_blocks = size_t(shape.num_layers) * size_t(shape.num_kv_heads) *
                              size_t((shape.max_tokens + block_tokens() - 1) / block_tokens());
    const int cache_blocks =
        std::max(1, pipeline.offload->cache_tokens / block_tokens()) * shape.num_layers * shape.num_kv_heads;
    auto tier = OffloadTier::open(*pipeline.offload, cache_blocks, pool_.block_bytes(), max_blocks);
    // make_kv_pipeline made a file in that directory already; failing now is the disk filling up.
    if (!tier) throw std::runtime_error(tier.status().message());
    offload_ = std::move(*tier);
  }
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
        uint8_t* block = seal_destination();
        pipeline_.codec->seal(block_shape_, head.open_k.data(), head.open_v.data(),
                              block_seed(layer_index, g, int(head.sealed.size())), block);
        head.sealed.push_back(keep_sealed(block));
        selector_->on_seal(layer_index, g, head.open_k.data());
      }
    }
  }
  if (n > 1) selector_->on_prefill(layer_index);
}

const std::vector<HeadSelection>& KvStore::select(int layer, const float* q, int n, int num_heads, ThreadPool& pool) {
  std::vector<HeadSelection>& selection = selections_[size_t(layer)];
  if (n > 1) {  // prefill attends to everything (PQCache selects while decoding)
    for (HeadSelection& head : selection) head = {true, {}};
    stage_blocks(layer, selection);
    return selection;
  }
  thread_local std::vector<float> rotated;
  if (pipeline_.hadamard) {  // keys are kept rotated: score with rotated queries (q·k is unchanged)
    rotated.assign(q, q + size_t(num_heads) * size_t(shape_.k_dim));
    for (int h = 0; h < num_heads; ++h) hadamard_rotate(rotated.data() + size_t(h) * shape_.k_dim, shape_.k_dim);
    q = rotated.data();
  }
  selector_->select(layer, q, num_heads, num_tokens(layer), num_sealed_blocks(layer) * block_tokens(), pool, selection);
  stage_blocks(layer, selection);
  return selection;
}

void KvStore::stage_blocks(int layer, const std::vector<HeadSelection>& selection) {
  if (!offload_) return;
  thread_local std::vector<int64_t> ids;
  ids.clear();
  const int sealed = num_sealed_blocks(layer);
  for (int g = 0; g < shape_.num_kv_heads; ++g) {
    const Head& head = head_of(layer, g);
    const HeadSelection& chosen = selection[size_t(g)];
    int last = -1;  // blocks with a selected token, once each (tokens ascend)
    for (int b = 0; chosen.all && b < sealed; ++b) ids.push_back(offload_->id_of(head.sealed[size_t(b)]));
    for (size_t i = 0; !chosen.all && i < chosen.tokens.size(); ++i) {
      const int b = chosen.tokens[i] / block_tokens();
      if (b >= sealed) break;
      if (b != last) ids.push_back(offload_->id_of(head.sealed[size_t(b)]));
      last = b;
    }
  }
  offload_->stage(ids);
}

KvMemory KvStore::memory() const {
  KvMemory memory;
  memory.sealed_blocks = offload_ ? size_t(offload_->blocks()) : pool_.blocks_in_use();  // in RAM or on disk
  memory.sealed_bytes = memory.sealed_blocks * pool_.block_bytes();
  memory.sealed_tokens = layers_.empty() ? 0 : size_t(num_sealed_blocks(0)) * size_t(block_tokens());
  memory.sealed_in_slow_tier = offload_ != nullptr;
  memory.cache_bytes = offload_ ? offload_->cache_bytes() : 0;
  memory.open_bytes = size_t(shape_.num_layers) * size_t(shape_.num_kv_heads) * size_t(block_tokens()) *
                      size_t(shape_.k_dim + shape_.v_dim) * sizeof(float);
  return memory;
}

void KvStore::restore_sealed_block(int layer, int head, const uint8_t* block) {
  Head& target = layers_[size_t(layer)].heads[size_t(head)];
  assert(layers_[size_t(layer)].num_tokens == 0);  // sealed blocks come before the open tokens
  uint8_t* slot = seal_destination();
  std::memcpy(slot, block, pipeline_.codec->block_bytes(block_shape_));
  target.sealed.push_back(keep_sealed(slot));
  thread_local std::vector<float> k, v;  // the selector indexes the keys as sealed
  k.resize(size_t(block_tokens()) * size_t(shape_.k_dim));
  v.resize(size_t(block_tokens()) * size_t(shape_.v_dim));
  pipeline_.codec->decode(block_shape_, block, k.data(), v.data());
  selector_->on_seal(layer, head, k.data());
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
  if (offload_) offload_->clear();
  selector_->clear();
  for (Layer& layer : layers_) {
    layer.num_tokens = 0;
    for (Head& head : layer.heads) head.sealed.clear();
  }
}

}  // namespace slimkv
