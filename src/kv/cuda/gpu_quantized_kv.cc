// The `hack` and `quant` codecs on the GPU: sealed blocks in the CPU codec's byte layout, FP16 only for
// what is not sealed yet (quantized_kv_cache.h); attention by run_quantized. In the transfer format its
// sealed blocks are the pool's bytes as they are.
#include <vector>

#include "backend/cuda/ipc_memory.h"
#include "kv/cuda/gpu_kv_cache.h"
#include "kv/cuda/kv_store_copy.h"
#include "kv/cuda/quantized_kv_cache.h"
#include "kv/store.h"

namespace slimkv::cuda {
namespace {

class GpuQuantizedKv final : public GpuKvCache {
 public:
  GpuQuantizedKv(const GpuKvShape& shape, std::unique_ptr<CudaQuantizedKvCache> cache,
                 std::unique_ptr<CudaPagedAttention> attention)
      : shape_(shape), cache_(std::move(cache)), attention_(std::move(attention)) {}

  const SequenceBlocks& sequences() const override { return cache_->sequences(); }
  Expected<int> add_sequence() override { return cache_->add_sequence(); }
  void remove_sequence(int sequence) override { cache_->remove_sequence(sequence); }
  size_t device_bytes() const override { return cache_->bytes(); }
  size_t bytes_per_block() const override {
    return size_t(shape_.num_layers) * size_t(shape_.num_kv_heads) * cache_->layout().block_bytes;
  }

  Status check_step(const PagedAttentionBatch& batch) const override {
    return cache_->check_step(batch.sequence_ids, batch.query_counts);
  }
  Status begin_step(const PagedAttentionBatch& batch) override {
    SLIMKV_RETURN_IF_ERROR(cache_->begin_step(batch.sequence_ids, batch.query_counts));
    return attention_->plan(batch);
  }
  Status attend(int layer, const uint16_t* q, const uint16_t* k, const uint16_t* v, float scale,
                uint16_t* out) override {
    SLIMKV_RETURN_IF_ERROR(cache_->append(layer, k, v));
    return attention_->run_quantized(cache_->view(layer), cache_->sealed_view(layer), q, scale, out);
  }

  Status begin_fill(int sequence, int tokens) override { return cache_->begin_step({sequence}, {tokens}); }
  Status fill(int layer, const uint16_t* k, const uint16_t* v, const void* /*x*/) override {
    return cache_->append(layer, k, v);
  }

  DevicePages device_pages() const override { return sealed_device_pages(*cache_); }

  Status import_pages(int sequence, int blocks, const uint8_t* pages, const KvStore& open) override {
    SLIMKV_RETURN_IF_ERROR(import_sealed_pages(*cache_, sequence, blocks, pages, open.num_tokens(0)));
    return append_rows(sequence, open, 0, open.num_tokens(0));
  }

 private:
  Status restore_open_layer(int sequence, int layer, KvStore& into) const override {
    return restore_sealed_open_layer(*cache_, sequence, layer, into);
  }

  // Tokens [first, first + tokens) of `from` appended to the sequence, as steps append them.
  Status append_rows(int sequence, const KvStore& from, int first, int tokens) {
    return append_store_rows(
        from, first, tokens, shape_.max_step_tokens, [&](int n) { return cache_->begin_step({sequence}, {n}); },
        [&](int layer, const uint16_t* k, const uint16_t* v) { return cache_->append(layer, k, v); });
  }

  GpuKvShape shape_;
  std::unique_ptr<CudaQuantizedKvCache> cache_;
  std::unique_ptr<CudaPagedAttention> attention_;
};

}  // namespace

// The codec's bytes as the pool holds them: one part a page, every KV head's block.
GpuKvCache::DevicePages sealed_device_pages(const CudaQuantizedKvCache& cache) {
  const CudaKvShape& shape = cache.shape();
  const size_t block_bytes = cache.layout().block_bytes, page_bytes = size_t(shape.num_kv_heads) * block_bytes;
  return {.num_layers = shape.num_layers,
          .pools = {{cache.sealed_view(0).blocks, size_t(shape.num_blocks) * page_bytes, page_bytes, block_bytes}}};
}

Status import_sealed_pages(CudaQuantizedKvCache& cache, int sequence, int blocks, const uint8_t* pages, int open_tokens) {
  const SequenceBlocks& held = cache.sequences();
  const int needed = held.blocks_to_grow(sequence, blocks * kCudaBlockTokens + open_tokens);
  if (needed > held.free_blocks()) {
    return error("the ", cache.shape().host_memory ? "host" : "GPU", "'s sealed KV pool has no room for the imported sequence: ",
                 needed, " blocks of ", kCudaBlockTokens, " tokens needed, ", held.free_blocks(), " free");
  }
  return cache.restore_sealed(sequence, blocks, pages, /*on_device=*/true);
}

// The tokens after the sequence's last full block (in the FP16 window), as `into`'s open tokens.
Status restore_sealed_open_layer(const CudaQuantizedKvCache& cache, int sequence, int layer, KvStore& into) {
  const int tokens = cache.sequences().num_tokens(sequence), full = tokens / kCudaBlockTokens;
  const int open = tokens - full * kCudaBlockTokens;
  return restore_open_page(cache.view(layer), open > 0 ? cache.window_sequences().blocks(sequence)[size_t(full)] : 0, open,
                           into, layer);
}

Expected<std::unique_ptr<GpuKvCache>> make_gpu_quantized_kv(const GpuKvShape& shape, const QuantizedKvOptions& options,
                                                            int num_blocks) {
  const CudaKvShape kv_shape{shape.num_layers,    shape.num_kv_heads,         shape.head_dim, num_blocks,
                             shape.max_sequences, shape.blocks_per_sequence(), shape.max_step_tokens};
  SLIMKV_ASSIGN_OR_RETURN(auto cache, CudaQuantizedKvCache::create(kv_shape, options.config, options.hack, options.seed));
  SLIMKV_ASSIGN_OR_RETURN(auto attention,
                          CudaPagedAttention::create({shape.num_heads, shape.num_kv_heads, shape.head_dim,
                                                      shape.max_sequences, shape.max_step_tokens}));
  return std::unique_ptr<GpuKvCache>(new GpuQuantizedKv(shape, std::move(cache), std::move(attention)));
}

}  // namespace slimkv::cuda
