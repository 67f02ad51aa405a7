#include "kv/store.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <stdexcept>

#include "backend/cpu/vec_ops.h"
#include "kv/rotation.h"
#include "util/half.h"
#include "util/random.h"
#include "util/thread_pool.h"

namespace slimkv {

int KvShape::layer_k_dims(int layer) const {
  int dims = 0;
  for (int g = 0; g < num_kv_heads; ++g) dims += k_dim_of(layer, g);
  return dims;
}

bool KvShape::any_window() const {
  return std::any_of(window_tokens.begin(), window_tokens.end(), [](int w) { return w > 0; });
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
      open_dtype_(pipeline.codec->open_block_dtype()),
      layers_(size_t(shape.num_layers)),
      selector_((pipeline.selector ? *pipeline.selector : *make_all_selector_factory())
                    .make(shape.num_layers, shape.num_kv_heads, shape.k_dim, pipeline.block_tokens, pipeline.seed)),
      selections_(size_t(shape.num_layers), std::vector<HeadSelection>(size_t(shape.num_kv_heads))) {
  for (int l = 0; l < shape.num_layers; ++l) {
    layers_[size_t(l)].heads.resize(size_t(shape.num_kv_heads));
    for (int g = 0; g < shape.num_kv_heads; ++g) {
      Head& head = layers_[size_t(l)].heads[size_t(g)];
      head.block_shape = {pipeline.block_tokens, shape.k_dim_of(l, g), shape.v_dim_of(l, g)};
      head.codec = &pipeline.codec_of(l, g);
      head.block_bytes = head.codec->block_bytes(head.block_shape);
      head.pool = &pools_.try_emplace(head.block_bytes, head.block_bytes).first->second;
      const size_t element = dtype_size_bytes(open_dtype_);
      const size_t open_rows = size_t(block_tokens() + pipeline.recent_tokens);
      head.open_k.assign(open_rows * size_t(head.block_shape.k_dim) * element, 0);
      head.open_v.assign(open_rows * size_t(head.block_shape.v_dim) * element, 0);
      const size_t sink_rows = shape.window_of(l) == 0 ? size_t(pipeline.sink_tokens) : 0;
      head.sink_k.assign(sink_rows * size_t(head.block_shape.k_dim) * element, 0);
      head.sink_v.assign(sink_rows * size_t(head.block_shape.v_dim) * element, 0);
    }
  }
  if (pipeline.offload) {
    const size_t max_blocks = size_t(shape.num_layers) * size_t(shape.num_kv_heads) *
                              size_t((shape.max_tokens + block_tokens() - 1) / block_tokens());
    const int cache_blocks =
        std::max(1, pipeline.offload->cache_tokens / block_tokens()) * shape.num_layers * shape.num_kv_heads;
    // The slow tier's slots are of one size: the largest head's blocks (ZACK's heads differ; a smaller
    // head's block fills the start of its slot).
    size_t slot_bytes = 0;
    for (const Layer& layer : layers_) {
      for (const Head& head : layer.heads) slot_bytes = std::max(slot_bytes, head.block_bytes);
    }
    auto tier = OffloadTier::open(*pipeline.offload, cache_blocks, slot_bytes, max_blocks);
    // make_kv_pipeline made a file in that directory already; failing now is the disk filling up.
    if (!tier) throw std::runtime_error(tier.status().message());
    offload_ = std::move(*tier);
  }
}

int KvStore::num_sealed_blocks(int layer) const { return int(layers_[size_t(layer)].heads[0].sealed.size()); }

void KvStore::widen_open(const Head& head, int n, float* k, float* v) const {
  widen_to_f32(head.open_k.data(), open_dtype_, k, size_t(n) * size_t(head.block_shape.k_dim));
  widen_to_f32(head.open_v.data(), open_dtype_, v, size_t(n) * size_t(head.block_shape.v_dim));
}

void KvStore::narrow_to_open_dtype(const float* in, size_t count, uint8_t* out) const {
  if (open_dtype_ == DType::kF32) {
    std::memcpy(out, in, count * sizeof(float));
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    const uint16_t half = float_to_fp16(in[i]);
    std::memcpy(out + i * sizeof(half), &half, sizeof(half));
  }
}

void KvStore::narrow_open(const float* k, const float* v, int first, int n, Head& head) const {
  const size_t element = dtype_size_bytes(open_dtype_);
  const size_t k_dim = size_t(head.block_shape.k_dim), v_dim = size_t(head.block_shape.v_dim);
  narrow_to_open_dtype(k, size_t(n) * k_dim, head.open_k.data() + size_t(first) * k_dim * element);
  narrow_to_open_dtype(v, size_t(n) * v_dim, head.open_v.data() + size_t(first) * v_dim * element);
}

void KvStore::widen_sinks(int layer, int head, float* k, float* v) const {
  const Head& source = head_of(layer, head);
  const size_t n = size_t(sink_tokens(layer));
  widen_to_f32(source.sink_k.data(), open_dtype_, k, n * size_t(source.block_shape.k_dim));
  widen_to_f32(source.sink_v.data(), open_dtype_, v, n * size_t(source.block_shape.v_dim));
}

uint64_t KvStore::block_seed(int layer, int head, int index) const {
  return block_seal_seed(pipeline_.seed, layer, head, index);  // as the GPU cache derives it
}

void KvStore::append(int layer_index, const float* k, const float* v, int n) {
  Layer& layer = layers_[size_t(layer_index)];
  assert(layer.num_tokens + n <= shape_.max_tokens);
  const size_t k_row = size_t(shape_.layer_k_dims(layer_index)), v_row = size_t(shape_.layer_v_dims(layer_index));
  // FP32 rows for the codec (the open block widened) and for rotating a new token before it is narrowed.
  thread_local std::vector<float> open_k, open_v;
  open_k.resize(size_t(block_tokens()) * size_t(shape_.k_dim));
  open_v.resize(size_t(block_tokens()) * size_t(shape_.v_dim));
  const bool keep_chunk = pipeline_.exact_prefill && n > 1;
  if (keep_chunk) {
    chunk_ = {layer_index, layer.num_tokens, n, std::move(chunk_.k), std::move(chunk_.v)};
    chunk_.k.resize(layer.heads.size());
    chunk_.v.resize(layer.heads.size());
    for (size_t g = 0; g < layer.heads.size(); ++g) {
      chunk_.k[g].resize(size_t(n) * size_t(layer.heads[g].block_shape.k_dim));
      chunk_.v[g].resize(size_t(n) * size_t(layer.heads[g].block_shape.v_dim));
    }
  } else if (chunk_.layer == layer_index) {
    chunk_.layer = -1;
  }
  for (int t = 0; t < n; ++t) {
    const int slot = layer.num_tokens - int(layer.heads[0].sealed.size()) * block_tokens();
    size_t k_offset = 0, v_offset = 0;  // of head g within the token's row
    for (Head& head : layer.heads) {
      const size_t k_dim = size_t(head.block_shape.k_dim), v_dim = size_t(head.block_shape.v_dim);
      std::memcpy(open_k.data(), k + size_t(t) * k_row + k_offset, k_dim * sizeof(float));
      std::memcpy(open_v.data(), v + size_t(t) * v_row + v_offset, v_dim * sizeof(float));
      k_offset += k_dim;
      v_offset += v_dim;
      if (pipeline_.hadamard) {
        hadamard_rotate(open_k.data(), int(k_dim));
        hadamard_rotate(open_v.data(), int(v_dim));
      }
      if (keep_chunk) {
        const size_t g = size_t(&head - layer.heads.data());
        std::memcpy(chunk_.k[g].data() + size_t(t) * k_dim, open_k.data(), k_dim * sizeof(float));
        std::memcpy(chunk_.v[g].data() + size_t(t) * v_dim, open_v.data(), v_dim * sizeof(float));
      }
      narrow_open(open_k.data(), open_v.data(), slot, 1, head);
    }
    if (requantizes_open_) {  // the HACK/RQE ablation: the partial block is kept quantized
      for (int g = 0; g < shape_.num_kv_heads; ++g) {
        Head& head = layer.heads[size_t(g)];
        widen_open(head, slot + 1, open_k.data(), open_v.data());
        head.codec->requantize_open_block(head.block_shape, open_k.data(), open_v.data(), slot, slot + 1,
                                          block_seed(layer_index, g, int(head.sealed.size())) ^ uint64_t(slot));
        narrow_open(open_k.data(), open_v.data(), 0, slot + 1, head);
      }
    }
    ++layer.num_tokens;
    // The open part is full (a block, and the recent window behind it): seal its oldest block.
    if (slot + 1 == block_tokens() + pipeline_.recent_tokens) seal_oldest(layer_index, open_k, open_v);
  }
  if (n > 1 && shape_.window_of(layer_index) == 0) selector_->on_prefill(layer_index);
}

void KvStore::seal_oldest(int layer_index, std::vector<float>& k, std::vector<float>& v) {
  Layer& layer = layers_[size_t(layer_index)];
  // Sinks are kept once, from block 0, where this layer keeps them (not in sliding-window layers).
  const int sinks = layer.heads[0].sealed.empty() && !layer.heads[0].sink_k.empty() ? pipeline_.sink_tokens : 0;
  const size_t element = dtype_size_bytes(open_dtype_);
  for (int g = 0; g < shape_.num_kv_heads; ++g) {
    Head& head = layer.heads[size_t(g)];
    const size_t k_dim = size_t(head.block_shape.k_dim), v_dim = size_t(head.block_shape.v_dim);
    widen_open(head, block_tokens(), k.data(), v.data());
    if (sinks > 0) {  // block 0: its first tokens stay in FP16, as the open block held them
      std::memcpy(head.sink_k.data(), head.open_k.data(), head.sink_k.size());
      std::memcpy(head.sink_v.data(), head.open_v.data(), head.sink_v.size());
      // ...and leave the block's quantization ranges (sink tokens are where outliers are: in the
      // ranges they would coarsen the grid of every token sharing them). Attention never reads these
      // rows; copies of the first other token keep the ranges the rest of the block has.
      for (int t = 0; t < sinks && sinks < block_tokens(); ++t) {
        std::memcpy(k.data() + size_t(t) * k_dim, k.data() + size_t(sinks) * k_dim, k_dim * sizeof(float));
        std::memcpy(v.data() + size_t(t) * v_dim, v.data() + size_t(sinks) * v_dim, v_dim * sizeof(float));
      }
    }
    uint8_t* block = seal_destination(head);
    head.codec->seal(head.block_shape, k.data(), v.data(), block_seed(layer_index, g, int(head.sealed.size())), block);
    head.sealed.push_back(keep_sealed(block));
    // A sliding layer's window is its selection: the selector indexes only the other layers.
    if (shape_.window_of(layer_index) == 0) selector_->on_seal(layer_index, g, k.data());
    if (pipeline_.recent_tokens > 0) {  // the recent window moves to the front of the open part
      const size_t sealed_k = size_t(block_tokens()) * k_dim * element, sealed_v = size_t(block_tokens()) * v_dim * element;
      std::memmove(head.open_k.data(), head.open_k.data() + sealed_k, head.open_k.size() - sealed_k);
      std::memmove(head.open_v.data(), head.open_v.data() + sealed_v, head.open_v.size() - sealed_v);
    }
  }
}

void KvStore::release_outside_window(int layer_index) {
  const int window = shape_.window_of(layer_index);
  if (window == 0) return;
  Layer& layer = layers_[size_t(layer_index)];
  // The next query, at position num_tokens, sees tokens from num_tokens - window + 1 on.
  const int first_needed = layer.num_tokens - window + 1;
  const int sealed = int(layer.heads[0].sealed.size());
  for (; layer.first_live_block < sealed && (layer.first_live_block + 1) * block_tokens() <= first_needed;
       ++layer.first_live_block) {
    for (Head& head : layer.heads) {
      // The fast tier only: make_kv_pipeline's callers refuse slow tiers for sliding-window models.
      head.pool->release(const_cast<uint8_t*>(head.sealed[size_t(layer.first_live_block)]));
      head.sealed[size_t(layer.first_live_block)] = nullptr;
    }
  }
}

void KvStore::prefetch_sealed_tokens(int layer, int head, const int* tokens, int n, bool keys, bool values) const {
  const BlockShape& shape = block_shape(layer, head);
  thread_local std::vector<int> rows;
  for (int i = 0; i < n;) {  // one block at a time
    const int block = tokens[i] / block_tokens();
    rows.clear();
    for (; i < n && tokens[i] / block_tokens() == block; ++i) rows.push_back(tokens[i] - block * block_tokens());
    codec(layer, head).prefetch_tokens(shape, sealed_block(layer, head, block), rows.data(), int(rows.size()), keys, values);
  }
}

KvStore::ExactChunk KvStore::exact_chunk(int layer, int head) const {
  if (chunk_.layer != layer) return {};
  return {chunk_.first_token, chunk_.n, chunk_.k[size_t(head)].data(), chunk_.v[size_t(head)].data()};
}

namespace {

// A selector's exact scores of sealed tokens, by their keys decoded from the blocks as the store holds
// them: offloaded, from the cache or where they lie in the slow tier (those reads count as tier traffic).
class StoreSealedKeys final : public SealedKeys {
 public:
  StoreSealedKeys(const KvStore& store, const OffloadTier* offload) : store_(store), offload_(offload) {}
  void score(int layer, int head, const float* q, int rows, const int* tokens, int n, float* scores) const override {
    const BlockShape& shape = store_.block_shape(layer, head);
    const int block_tokens = store_.block_tokens();
    const size_t k_dim = size_t(shape.k_dim);
    constexpr int ahead = KvStore::kPrefetchTokens;
    thread_local std::vector<int> block_rows;
    thread_local std::vector<float> k;  // one block's chosen keys [block_rows, k_dim]: stays in cache
    k.resize(size_t(block_tokens) * k_dim);
    store_.prefetch_sealed_tokens(layer, head, tokens, std::min(n, ahead), true, false);
    for (int i = 0; i < n;) {  // the tokens of one block at a time
      const int block = tokens[i] / block_tokens, first = i;
      block_rows.clear();
      for (; i < n && tokens[i] / block_tokens == block; ++i) block_rows.push_back(tokens[i] - block * block_tokens);
      const int prefetch_end = std::min(n, i + ahead);  // the keys `ahead` tokens past this block's
      if (first + ahead < prefetch_end) {
        store_.prefetch_sealed_tokens(layer, head, tokens + first + ahead, prefetch_end - first - ahead, true, false);
      }
      const uint8_t* data = store_.sealed_block(layer, head, block);
      if (offload_ && offload_->in_slow_tier(data)) {
        offload_->count_direct_read(store_.codec(layer, head).token_read_bytes(shape, int(block_rows.size()), true, false));
      }
      store_.codec(layer, head).decode_tokens(shape, data, block_rows.data(), int(block_rows.size()), k.data(), nullptr);
      dots(q, rows, k.data(), int(block_rows.size()), k_dim, scores);
      scores += block_rows.size() * size_t(rows);
    }
  }

 private:
  const KvStore& store_;
  const OffloadTier* offload_;  // null: the fast tier
};

}  // namespace

const std::vector<HeadSelection>& KvStore::select(int layer, const float* q, int n, int num_heads, ThreadPool& pool) {
  std::vector<HeadSelection>& selection = selections_[size_t(layer)];
  if (n > 1 || shape_.window_of(layer) > 0) {  // prefill attends to everything (PQCache selects while
                                                // decoding); a sliding layer to its window
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
  const StoreSealedKeys sealed_keys(*this, offload_.get());
  selector_->select(layer, q, num_heads, num_tokens(layer), num_sealed_blocks(layer) * block_tokens(), sealed_keys,
                    pool, selection);
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
  for (const auto& [unused, pool] : pools_) {
    memory.sealed_blocks += pool.blocks_in_use();
    memory.sealed_bytes += pool.bytes_in_use();
  }
  if (offload_) {  // sealed blocks are in the slow tier, each in a slot of one size
    memory.sealed_blocks = size_t(offload_->blocks());
    memory.sealed_bytes = memory.sealed_blocks * offload_->block_bytes();
    memory.sealed_in_slow_tier = true;
    memory.cache_bytes = offload_->cache_bytes();
  }
  // Tokens sealed in the layers that keep them all: a sliding layer's freed blocks are not held.
  for (int l = 0; l < shape_.num_layers; ++l) {
    if (shape_.window_of(l) > 0) continue;
    memory.sealed_tokens = size_t(num_sealed_blocks(l)) * size_t(block_tokens());
    break;
  }
  for (int l = 0; l < shape_.num_layers; ++l) {
    if (shape_.window_of(l) == 0) continue;
    const Layer& layer = layers_[size_t(l)];
    for (const Head& head : layer.heads) {
      memory.window_sealed_bytes += (head.sealed.size() - size_t(layer.first_live_block)) * head.pool->block_bytes();
    }
  }
  for (const Layer& layer : layers_) {
    for (const Head& head : layer.heads) {
      memory.open_bytes += head.open_k.size() + head.open_v.size() + head.sink_k.size() + head.sink_v.size();
    }
  }
  memory.selector_bytes = selector_->memory_bytes();
  memory.tier = tier_stats();
  return memory;
}

void KvStore::restore_sealed_block(int layer, int head, const uint8_t* block) {
  Head& target = layers_[size_t(layer)].heads[size_t(head)];
  uint8_t* slot = seal_destination(target);
  std::memcpy(slot, block, target.block_bytes);
  keep_restored_block(layer, head, slot);
}

uint8_t* KvStore::restore_slot(int layer, int head) {
  if (offload_) return nullptr;
  assert(layers_[size_t(layer)].num_tokens == 0);  // sealed blocks come before the open tokens
  return layers_[size_t(layer)].heads[size_t(head)].pool->allocate();
}

void KvStore::keep_restored_block(int layer, int head, uint8_t* slot) {
  Head& target = layers_[size_t(layer)].heads[size_t(head)];
  assert(layers_[size_t(layer)].num_tokens == 0);  // sealed blocks come before the open tokens
  target.sealed.push_back(keep_sealed(slot));
  if (!selector_->reads_sealed_keys()) return;
  thread_local std::vector<float> k, v;  // the selector indexes the keys as sealed
  k.resize(size_t(block_tokens()) * size_t(target.block_shape.k_dim));
  v.resize(size_t(block_tokens()) * size_t(target.block_shape.v_dim));
  target.codec->decode(target.block_shape, slot, k.data(), v.data());
  selector_->on_seal(layer, head, k.data());
}

void KvStore::restore_sink_tokens(int layer, int head, const float* k, const float* v) {
  Head& target = layers_[size_t(layer)].heads[size_t(head)];
  assert(!target.sealed.empty() && !target.sink_k.empty());  // block 0 is sealed in a full-attention layer
  const size_t n = size_t(pipeline_.sink_tokens);
  narrow_to_open_dtype(k, n * size_t(target.block_shape.k_dim), target.sink_k.data());
  narrow_to_open_dtype(v, n * size_t(target.block_shape.v_dim), target.sink_v.data());
}

void KvStore::restore_open_tokens(int layer_index, int head, const float* k, const float* v, int n) {
  Layer& layer = layers_[size_t(layer_index)];
  Head& target = layer.heads[size_t(head)];
  assert(n >= 0 && n < block_tokens() + pipeline_.recent_tokens);
  assert(target.sealed.size() == layer.heads[0].sealed.size());
  if (n > 0) narrow_open(k, v, 0, n, target);
  layer.num_tokens = int(target.sealed.size()) * block_tokens() + n;  // the same for every head
}

void KvStore::clear() {
  for (auto& [unused, pool] : pools_) pool.clear();
  if (offload_) offload_->clear();
  selector_->clear();
  chunk_.layer = -1;
  for (Layer& layer : layers_) {
    layer.num_tokens = 0;
    layer.first_live_block = 0;
    for (Head& head : layer.heads) head.sealed.clear();
  }
}

}  // namespace slimkv
