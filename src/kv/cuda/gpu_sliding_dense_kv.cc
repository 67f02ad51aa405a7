// The `dense` codec on the GPU for a model with sliding-window layers (Gemma 3): FP16 pages as
// gpu_dense_kv.cc, in two pools. The global layers' pool holds every token and is the budget the
// scheduler sees (a sequence's memory per token counts the global layers only); the sliding layers'
// pool gives a sequence's blocks back once every later query's window has passed them (as the CPU
// store's release_outside_window: after the step's last sliding layer has attended), so between steps
// it holds a window's blocks per sequence, during one the step's tokens too, whatever the context,
// and is sized for that once. Attention of a sliding layer masks keys older than its
// window (paged_attention.h). A sequence's KV does not move between workers yet (no device pages).
#include <algorithm>
#include <vector>

#include "kv/cuda/gpu_kv_cache.h"
#include "kv/cuda/paged_kv_cache.h"

namespace slimkv::cuda {
namespace {

// The sliding pool's blocks: each sequence's window (the block it starts in, and one a step may open),
// plus a whole step's new tokens (a block more per sequence for where each one's tokens start), never
// more than every sequence's whole context.
int window_pool_blocks(const GpuKvShape& shape, int window) {
  const int per_sequence = (window - 1) / kCudaBlockTokens + 3;
  const int step = (shape.max_step_tokens + kCudaBlockTokens - 1) / kCudaBlockTokens;
  return std::min(shape.max_sequences * per_sequence + step, shape.max_sequences * shape.blocks_per_sequence());
}

int largest_window(const GpuKvShape& shape) {
  return *std::max_element(shape.layer_windows.begin(), shape.layer_windows.end());
}

int count_layers(const GpuKvShape& shape, bool sliding) {
  return int(std::count_if(shape.layer_windows.begin(), shape.layer_windows.end(),
                           [&](int window) { return (window > 0) == sliding; }));
}

// FP16 K and V of one block of `layers` layers.
size_t fp16_block_bytes(const GpuKvShape& shape, int layers) {
  return size_t(layers) * 2 * size_t(shape.num_kv_heads) * kCudaBlockTokens * size_t(shape.head_dim) * 2;
}

class GpuSlidingDenseKv final : public GpuKvCache {
 public:
  GpuSlidingDenseKv(const GpuKvShape& shape, std::unique_ptr<CudaPagedKvCache> global,
                    std::unique_ptr<CudaPagedKvCache> sliding, std::unique_ptr<CudaPagedAttention> attention)
      : shape_(shape),
        window_(largest_window(shape)),
        global_(std::move(global)),
        sliding_(std::move(sliding)),
        attention_(std::move(attention)) {
    // Each layer's place in its pool, and the last sliding layer (after it, the step's queries are done).
    int global_layers = 0, sliding_layers = 0;
    for (int l = 0; l < shape_.num_layers; ++l) {
      pool_layer_.push_back(shape_.window_of(l) > 0 ? sliding_layers++ : global_layers++);
      if (shape_.window_of(l) > 0) last_sliding_layer_ = l;
    }
  }

  const SequenceBlocks& sequences() const override { return global_->sequences(); }
  // Both pools give out the lowest free id, and sequences come and go in both together.
  Expected<int> add_sequence() override {
    SLIMKV_ASSIGN_OR_RETURN(const int id, global_->sequences().add_sequence());
    SLIMKV_ASSIGN_OR_RETURN(const int same, sliding_->sequences().add_sequence());
    if (same != id) return error("GPU KV cache: the sliding layers' pool gave sequence ", same, " for ", id);
    return id;
  }
  void remove_sequence(int sequence) override {
    global_->sequences().remove_sequence(sequence);
    sliding_->sequences().remove_sequence(sequence);
  }
  size_t device_bytes() const override {
    return size_t(global_->shape().num_blocks) * bytes_per_block() +
           size_t(sliding_->shape().num_blocks) * fp16_block_bytes(shape_, sliding_->shape().num_layers);
  }
  size_t bytes_per_block() const override { return fp16_block_bytes(shape_, global_->shape().num_layers); }
  int window_blocks(int sequence) const override {
    const SequenceBlocks& held = sliding_->sequences();
    return int(held.blocks(sequence).size()) - held.released_blocks(sequence);
  }

  Status check_step(const PagedAttentionBatch& batch) const override {
    SLIMKV_RETURN_IF_ERROR(check_blocks_for_step(sequences(), batch, "GPU"));
    const SequenceBlocks& held = sliding_->sequences();
    int needed = 0;
    for (size_t i = 0; i < batch.sequence_ids.size(); ++i) {
      const int s = batch.sequence_ids[i];
      needed += held.blocks_to_grow(s, batch.kv_lens[i]) - std::max(0, outside_window(held.num_tokens(s)) - held.released_blocks(s));
    }
    if (needed > held.free_blocks()) {
      return error("the GPU KV cache's sliding-window pool is full: the step needs ", needed, " more blocks of ",
                   kCudaBlockTokens, " tokens, ", held.free_blocks(), " are free (of ", held.num_blocks(),
                   "; it holds each sequence's window and one step)");
    }
    return Status::ok();
  }
  Status begin_step(const PagedAttentionBatch& batch) override {
    SLIMKV_RETURN_IF_ERROR(grow(batch.sequence_ids, batch.query_counts));
    step_sequences_ = batch.sequence_ids;
    return attention_->plan(batch);
  }
  // Blocks given back after the last sliding layer's attention is launched are reused only by later
  // steps' appends, which the stream runs after it.
  Status attend(int layer, const uint16_t* q, const uint16_t* k, const uint16_t* v, float scale,
                uint16_t* out) override {
    CudaPagedKvCache& pool = pool_of(layer);
    SLIMKV_RETURN_IF_ERROR(pool.append(pool_layer_[size_t(layer)], k, v));
    SLIMKV_RETURN_IF_ERROR(
        attention_->run(pool.view(pool_layer_[size_t(layer)]), q, scale, out, shape_.window_of(layer)));
    if (layer == last_sliding_layer_) release_outside_window(step_sequences_);
    return Status::ok();
  }

  Status begin_fill(int sequence, int tokens) override { return grow({sequence}, {tokens}); }
  Status fill(int layer, const uint16_t* k, const uint16_t* v, const void* /*x*/) override {
    return pool_of(layer).append(pool_layer_[size_t(layer)], k, v);
  }

 private:
  CudaPagedKvCache& pool_of(int layer) { return shape_.window_of(layer) > 0 ? *sliding_ : *global_; }

  // The leading blocks of a sequence of `tokens` tokens that no later query sees: a query at position
  // p >= tokens sees tokens p - window + 1 onwards.
  int outside_window(int tokens) const { return std::max(0, tokens - window_ + 1) / kCudaBlockTokens; }

  // Gives back the sequences' sliding blocks that no query after their last token sees.
  void release_outside_window(const std::vector<int>& sequences) {
    SequenceBlocks& held = sliding_->sequences();
    for (int s : sequences) {
      if (held.is_live(s)) held.release_leading(s, outside_window(held.num_tokens(s)));
    }
  }

  // Grows both pools (first giving back what a fill, which attends nowhere, left behind).
  Status grow(const std::vector<int>& sequences, const std::vector<int>& new_tokens) {
    release_outside_window(sequences);
    SLIMKV_RETURN_IF_ERROR(global_->begin_step(sequences, new_tokens));
    return sliding_->begin_step(sequences, new_tokens);
  }

  GpuKvShape shape_;
  int window_;  // the longest sliding window: what the sliding pool keeps
  std::unique_ptr<CudaPagedKvCache> global_, sliding_;
  std::unique_ptr<CudaPagedAttention> attention_;
  std::vector<int> pool_layer_;  // [num_layers]: the layer's index in its pool
  int last_sliding_layer_ = -1;
  std::vector<int> step_sequences_;  // the planned step's
};

}  // namespace

size_t sliding_window_pool_bytes(const GpuKvShape& shape) {
  return size_t(window_pool_blocks(shape, largest_window(shape))) * fp16_block_bytes(shape, count_layers(shape, true));
}

size_t global_layers_block_bytes(const GpuKvShape& shape) { return fp16_block_bytes(shape, count_layers(shape, false)); }

Expected<std::unique_ptr<GpuKvCache>> make_gpu_sliding_dense_kv(const GpuKvShape& shape, int num_blocks) {
  if (int(shape.layer_windows.size()) != shape.num_layers) {
    return error("GPU KV cache: ", shape.layer_windows.size(), " layer windows for ", shape.num_layers, " layers");
  }
  const int global_layers = count_layers(shape, false), sliding_layers = count_layers(shape, true);
  if (global_layers == 0) {
    return error("GPU KV cache: every layer is a sliding-window layer; the GPU keeps the sliding layers beside "
                 "global ones only (use --device cpu)");
  }
  const auto pool_shape = [&](int layers, int blocks) {
    return CudaKvShape{layers, shape.num_kv_heads, shape.head_dim, blocks, shape.max_sequences,
                       shape.blocks_per_sequence(), shape.max_step_tokens};
  };
  SLIMKV_ASSIGN_OR_RETURN(auto global, CudaPagedKvCache::create(pool_shape(global_layers, num_blocks)));
  SLIMKV_ASSIGN_OR_RETURN(auto sliding, CudaPagedKvCache::create(pool_shape(
                                            sliding_layers, window_pool_blocks(shape, largest_window(shape)))));
  SLIMKV_ASSIGN_OR_RETURN(auto attention,
                          CudaPagedAttention::create({shape.num_heads, shape.num_kv_heads, shape.head_dim,
                                                      shape.max_sequences, shape.max_step_tokens}));
  return std::unique_ptr<GpuKvCache>(
      new GpuSlidingDenseKv(shape, std::move(global), std::move(sliding), std::move(attention)));
}

}  // namespace slimkv::cuda
