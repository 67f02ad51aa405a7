// The `dense` codec on the GPU: every token's K/V in FP16 pages (paged_kv_cache.h), attention by the
// paged FP16 kernels. In the transfer format its sealed blocks are `dense:dtype=f16` blocks.
#include <algorithm>
#include <vector>

#include "backend/cuda/ipc_memory.h"
#include "kv/cuda/gpu_kv_cache.h"
#include "kv/cuda/kv_store_copy.h"
#include "kv/cuda/paged_kv_cache.h"
#include "kv/store.h"

namespace slimkv::cuda {
namespace {

class GpuDenseKv final : public GpuKvCache {
 public:
  GpuDenseKv(const GpuKvShape& shape, std::unique_ptr<CudaPagedKvCache> cache,
             std::unique_ptr<CudaPagedAttention> attention)
      : shape_(shape), cache_(std::move(cache)), attention_(std::move(attention)) {}

  const SequenceBlocks& sequences() const override { return cache_->sequences(); }
  Expected<int> add_sequence() override { return cache_->sequences().add_sequence(); }
  void remove_sequence(int sequence) override { cache_->sequences().remove_sequence(sequence); }
  size_t device_bytes() const override { return size_t(cache_->shape().num_blocks) * bytes_per_block(); }
  size_t bytes_per_block() const override {
    return size_t(shape_.num_layers) * size_t(shape_.num_kv_heads) * 2 * kCudaBlockTokens * size_t(shape_.head_dim) * 2;
  }

  Status check_step(const PagedAttentionBatch& batch) const override {
    return check_blocks_for_step(sequences(), batch, "GPU");
  }
  Status begin_step(const PagedAttentionBatch& batch) override {
    SLIMKV_RETURN_IF_ERROR(cache_->begin_step(batch.sequence_ids, batch.query_counts));
    return attention_->plan(batch);
  }
  Status attend(int layer, const uint16_t* q, const uint16_t* k, const uint16_t* v, float scale,
                uint16_t* out) override {
    SLIMKV_RETURN_IF_ERROR(cache_->append(layer, k, v));
    return attention_->run(cache_->view(layer), q, scale, out);
  }

  Status begin_fill(int sequence, int tokens) override { return cache_->begin_step({sequence}, {tokens}); }
  Status fill(int layer, const uint16_t* k, const uint16_t* v, const void* /*x*/) override {
    return cache_->append(layer, k, v);
  }

  // Device pages: [K of every head | V of every head] of one block, FP16; a head's K [64, d] then its V
  // [64, d] is its `dense:dtype=f16` block.
  DevicePages device_pages() const override {
    const size_t head_half = half_page_bytes() / size_t(shape_.num_kv_heads);
    return {.num_layers = shape_.num_layers,
            .pools = {{reinterpret_cast<const uint8_t*>(cache_->view(0).k), layer_bytes(), half_page_bytes(), head_half},
                      {reinterpret_cast<const uint8_t*>(cache_->view(0).v), layer_bytes(), half_page_bytes(), head_half}}};
  }

  Status import_pages(int sequence, int blocks, const uint8_t* pages, const KvStore& open) override {
    const int sealed_tokens = blocks * kCudaBlockTokens, tokens = sealed_tokens + open.num_tokens(0);
    const int needed = sequences().blocks_to_grow(sequence, tokens);
    if (needed > sequences().free_blocks()) {
      return error("the GPU KV cache has no room for the imported sequence: ", needed, " blocks of ", kCudaBlockTokens,
                   " tokens needed, ", sequences().free_blocks(), " free");
    }
    // The blocks are taken as steps take them (a step at most max_step_tokens), then filled at once.
    for (int done = 0; done < sealed_tokens; done += shape_.max_step_tokens) {
      SLIMKV_RETURN_IF_ERROR(cache_->begin_step({sequence}, {std::min(shape_.max_step_tokens, sealed_tokens - done)}));
    }
    auto* k = reinterpret_cast<uint8_t*>(cache_->layer_k(0));
    auto* v = reinterpret_cast<uint8_t*>(cache_->layer_v(0));
    const std::vector<uint64_t> pool = pool_offsets(shape_.num_layers, sequences().blocks(sequence), blocks, layer_bytes(), half_page_bytes());
    SLIMKV_RETURN_IF_ERROR(copy_device_pieces(k, pool, pages, page_offsets(shape_.num_layers, blocks, device_page_bytes(), 0), half_page_bytes()));
    SLIMKV_RETURN_IF_ERROR(copy_device_pieces(v, pool, pages, page_offsets(shape_.num_layers, blocks, device_page_bytes(), half_page_bytes()),
                                              half_page_bytes()));
    return append_rows(sequence, open, 0, open.num_tokens(0));
  }

 private:
  // One block of one layer, K (or V) of every KV head.
  size_t half_page_bytes() const { return size_t(shape_.num_kv_heads) * kCudaBlockTokens * size_t(shape_.head_dim) * 2; }
  size_t layer_bytes() const { return size_t(cache_->shape().num_blocks) * half_page_bytes(); }

  // The layer's tokens after the sequence's last full block, as `into`'s open tokens of the layer.
  Status restore_open_layer(int sequence, int layer, KvStore& into) const override {
    const int tokens = sequences().num_tokens(sequence), full = tokens / kCudaBlockTokens;
    const int open = tokens - full * kCudaBlockTokens;
    return restore_open_page(cache_->view(layer), open > 0 ? sequences().blocks(sequence)[size_t(full)] : 0, open, into, layer);
  }

  // Tokens [first, first + tokens) of `from` appended to the sequence, as steps append them.
  Status append_rows(int sequence, const KvStore& from, int first, int tokens) {
    return append_store_rows(
        from, first, tokens, shape_.max_step_tokens, [&](int n) { return cache_->begin_step({sequence}, {n}); },
        [&](int layer, const uint16_t* k, const uint16_t* v) { return cache_->append(layer, k, v); });
  }

  GpuKvShape shape_;
  std::unique_ptr<CudaPagedKvCache> cache_;
  std::unique_ptr<CudaPagedAttention> attention_;
};

}  // namespace

Expected<std::unique_ptr<GpuKvCache>> make_gpu_dense_kv(const GpuKvShape& shape, int num_blocks) {
  const CudaKvShape kv_shape{shape.num_layers,    shape.num_kv_heads,         shape.head_dim, num_blocks,
                             shape.max_sequences, shape.blocks_per_sequence(), shape.max_step_tokens};
  SLIMKV_ASSIGN_OR_RETURN(auto cache, CudaPagedKvCache::create(kv_shape));
  SLIMKV_ASSIGN_OR_RETURN(auto attention,
                          CudaPagedAttention::create({shape.num_heads, shape.num_kv_heads, shape.head_dim,
                                                      shape.max_sequences, shape.max_step_tokens}));
  return std::unique_ptr<GpuKvCache>(new GpuDenseKv(shape, std::move(cache), std::move(attention)));
}

}  // namespace slimkv::cuda
