// The `zack` stage on the GPU (ZACK §5): every (layer, KV head) at its own K and V ranks in one pool of
// equal blocks (zack_kv_cache.h), q and k projected onto each head's basis after RoPE, attention on the
// reduced dims with heads balanced by rank (attention/cuda/zack_attention.h). The model's W_V / W_O
// come folded (model/zack_projection.h), so values arrive reduced and the output is read reduced.
#include "kv/cuda/gpu_kv_cache.h"
#include "kv/cuda/zack_kv_cache.h"

namespace slimkv::cuda {
namespace {

class GpuZackKv final : public GpuKvCache {
 public:
  GpuZackKv(std::unique_ptr<CudaZackKvCache> cache, std::unique_ptr<CudaZackAttention> attention, ZackSchedule schedule)
      : cache_(std::move(cache)), attention_(std::move(attention)), schedule_(schedule) {}

  const SequenceBlocks& sequences() const override { return cache_->sequences(); }
  Expected<int> add_sequence() override { return cache_->sequences().add_sequence(); }
  void remove_sequence(int sequence) override { cache_->sequences().remove_sequence(sequence); }
  size_t device_bytes() const override { return cache_->device_bytes(); }
  size_t bytes_per_block() const override { return CudaZackKvCache::block_bytes(cache_->shape().k_ranks, cache_->shape().v_ranks); }

  Status check_step(const PagedAttentionBatch& batch) const override {
    return check_blocks_for_step(sequences(), batch, "GPU");
  }
  Status begin_step(const PagedAttentionBatch& batch) override {
    SLIMKV_RETURN_IF_ERROR(cache_->begin_step(batch.sequence_ids, batch.query_counts));
    return attention_->plan(batch, schedule_);
  }
  Status attend(int layer, const uint16_t* q, const uint16_t* k, const uint16_t* v, float scale,
                uint16_t* out) override {
    SLIMKV_RETURN_IF_ERROR(cache_->append(layer, k, v));
    SLIMKV_ASSIGN_OR_RETURN(const uint16_t* reduced, cache_->project_queries(layer, q));
    return attention_->run(layer, cache_->view(layer), reduced, scale, out);
  }

  Status begin_fill(int sequence, int tokens) override { return cache_->begin_step({sequence}, {tokens}); }
  Status fill(int layer, const uint16_t* k, const uint16_t* v, const void* /*x*/) override {
    return cache_->append(layer, k, v);
  }

  // The transfer format's zack blocks are the CPU store's per-head shapes; moving them is not built yet.
  Status export_sequence(int /*sequence*/, KvStore& /*into*/) const override {
    return error("exporting KV of the zack stage from device 'cuda' is not supported yet");
  }
  Status import_sequence(int /*sequence*/, const KvStore& /*from*/) override {
    return error("importing KV into the zack stage on device 'cuda' is not supported yet");
  }

 private:
  std::unique_ptr<CudaZackKvCache> cache_;
  std::unique_ptr<CudaZackAttention> attention_;
  ZackSchedule schedule_;
};

}  // namespace

Expected<std::unique_ptr<GpuKvCache>> make_gpu_zack_kv(const GpuKvShape& shape, const ZackKvOptions& options,
                                                       int num_blocks) {
  SLIMKV_ASSIGN_OR_RETURN(auto cache, CudaZackKvCache::create({shape.num_layers, shape.num_heads, shape.num_kv_heads,
                                                               shape.head_dim, num_blocks, shape.max_sequences,
                                                               shape.blocks_per_sequence(), shape.max_step_tokens,
                                                               options.k_ranks, options.v_ranks, options.qk_bases}));
  SLIMKV_ASSIGN_OR_RETURN(auto attention,
                          CudaZackAttention::create({shape.num_layers, shape.num_heads, shape.num_kv_heads, shape.head_dim,
                                                     shape.max_sequences, shape.max_step_tokens, options.k_ranks,
                                                     options.v_ranks}));
  return std::unique_ptr<GpuKvCache>(new GpuZackKv(std::move(cache), std::move(attention), options.schedule));
}

}  // namespace slimkv::cuda
