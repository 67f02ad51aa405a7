// `zack` followed by a quantizing codec on the GPU (zack:...+hack:bits=B, zack:...+quant:bits=B; ZACK §5
// with HACK §5.2–5.3): q and k projected onto each (layer, KV head)'s Q–K basis after RoPE
// (zack_head_projection.h), V arriving reduced (the folded W_V, zeros past each head's rank), and the
// reduced K'/V' sealed by the codec at each head's own ranks (quantized_kv_cache.h's HeadDims: a sealed
// block stores no dim past a head's rank). Attention is the quantized path's (run_quantized) with
// per-head dims: decode on the integers (hack, HACK Eq. 4) or dequantized in the kernel (quant); prefill
// over the sealed blocks before the step dequantized into the FP16 tensor-core tiles, the step's own
// tokens and the open blocks exact (prefill=exact). The output is in each head's reduced V space (the
// folded W_O reads it). rot=hadamard (the quantizing codecs' default) turns q', k', v' by each head's H
// at its ranks (kv/rotation.h: chunked where a rank is no power of two) before they are stored or
// attend, and the output back, as the CPU store does: q' and k' through the bases (H·B), v' and the
// output here.
#include "backend/cuda/layer_kernels.h"
#include "kv/cuda/gpu_kv_cache.h"
#include "kv/cuda/quantized_kv_cache.h"
#include "kv/cuda/zack_head_projection.h"

namespace slimkv::cuda {
namespace {

class GpuZackQuantizedKv final : public GpuKvCache {
 public:
  // v_ranks: device [num_layers · num_kv_heads]; v_rotated: device [max_step_tokens, num_kv_heads, head_dim],
  // the step's v turned by H (rot=hadamard; empty: no rotation).
  GpuZackQuantizedKv(const GpuKvShape& shape, std::unique_ptr<CudaQuantizedKvCache> cache,
                     std::unique_ptr<CudaZackHeadProjection> projection, std::unique_ptr<CudaPagedAttention> attention,
                     size_t block_bytes, DeviceArray<int> v_ranks, DeviceArray<uint16_t> v_rotated)
      : shape_(shape),
        cache_(std::move(cache)),
        projection_(std::move(projection)),
        attention_(std::move(attention)),
        block_bytes_(block_bytes),
        v_ranks_(std::move(v_ranks)),
        v_rotated_(std::move(v_rotated)) {}

  const SequenceBlocks& sequences() const override { return cache_->sequences(); }
  Expected<int> add_sequence() override { return cache_->add_sequence(); }
  void remove_sequence(int sequence) override { cache_->remove_sequence(sequence); }
  size_t device_bytes() const override { return cache_->bytes(); }
  size_t bytes_per_block() const override { return block_bytes_; }

  Status check_step(const PagedAttentionBatch& batch) const override {
    return cache_->check_step(batch.sequence_ids, batch.query_counts);
  }
  Status begin_step(const PagedAttentionBatch& batch) override {
    SLIMKV_RETURN_IF_ERROR(cache_->begin_step(batch.sequence_ids, batch.query_counts));
    step_tokens_ = 0;
    for (int n : batch.query_counts) step_tokens_ += n;
    return attention_->plan(batch);
  }
  Status attend(int layer, const uint16_t* q, const uint16_t* k, const uint16_t* v, float scale,
                uint16_t* out) override {
    SLIMKV_ASSIGN_OR_RETURN(const ReducedQueriesAndKeys reduced, projection_->project_queries_and_keys(layer, q, k, step_tokens_));
    SLIMKV_RETURN_IF_ERROR(append_projected(layer, reduced.k, v));
    SLIMKV_RETURN_IF_ERROR(attention_->run_quantized(cache_->view(layer), cache_->sealed_view(layer), reduced.q, scale, out));
    if (!rotates()) return Status::ok();
    // Back from each head's rotated V basis (H is its own inverse), query head h at its KV head's v_rank.
    return rotate_head_prefixes(out, step_tokens_, shape_.num_heads, shape_.head_dim, layer_v_ranks(layer),
                                shape_.num_heads / shape_.num_kv_heads, out);
  }

  Status begin_fill(int sequence, int tokens) override {
    step_tokens_ = tokens;
    return cache_->begin_step({sequence}, {tokens});
  }
  Status fill(int layer, const uint16_t* k, const uint16_t* v, const void* /*x*/) override {
    SLIMKV_ASSIGN_OR_RETURN(const uint16_t* reduced, projection_->project_keys(layer, k, step_tokens_));
    return append_projected(layer, reduced, v);
  }

  // The transfer format's zack blocks are the CPU store's per-head shapes; moving them is not built yet.
  Status export_sequence(int /*sequence*/, KvStore& /*into*/) const override {
    return error("exporting KV of zack followed by a quantizing codec from device 'cuda' is not supported yet");
  }
  Status import_sequence(int /*sequence*/, const KvStore& /*from*/) override {
    return error("importing KV into zack followed by a quantizing codec on device 'cuda' is not supported yet");
  }

 private:
  bool rotates() const { return v_rotated_.size() > 0; }
  const int* layer_v_ranks(int layer) const { return v_ranks_.data() + size_t(layer) * size_t(shape_.num_kv_heads); }

  // k' (projected onto the heads' bases already) and v (reduced already) turned by H under
  // rot=hadamard; both appended and sealed.
  Status append_projected(int layer, const uint16_t* reduced_k, const uint16_t* v) {
    if (rotates()) {
      SLIMKV_RETURN_IF_ERROR(rotate_head_prefixes(v, step_tokens_, shape_.num_kv_heads, shape_.head_dim, layer_v_ranks(layer), 1,
                                                  v_rotated_.data()));
      v = v_rotated_.data();
    }
    return cache_->append(layer, reduced_k, v);
  }

  GpuKvShape shape_;
  std::unique_ptr<CudaQuantizedKvCache> cache_;
  std::unique_ptr<CudaZackHeadProjection> projection_;
  std::unique_ptr<CudaPagedAttention> attention_;
  size_t block_bytes_;
  DeviceArray<int> v_ranks_;
  DeviceArray<uint16_t> v_rotated_;
  int step_tokens_ = 0;  // the step's (or fill's) new tokens
};

}  // namespace

Expected<std::unique_ptr<GpuKvCache>> make_gpu_zack_quantized_kv(const GpuKvShape& shape, const QuantizedKvOptions& quantized,
                                                                 const ZackKvOptions& zack, int num_blocks) {
  const CudaKvShape kv_shape{shape.num_layers,    shape.num_kv_heads,         shape.head_dim, num_blocks,
                             shape.max_sequences, shape.blocks_per_sequence(), shape.max_step_tokens};
  const HeadDims dims{zack.k_ranks, zack.v_ranks};
  SLIMKV_ASSIGN_OR_RETURN(const size_t block_bytes, CudaQuantizedKvCache::sealed_block_bytes(kv_shape, quantized.config, dims));
  SLIMKV_ASSIGN_OR_RETURN(auto cache,
                          CudaQuantizedKvCache::create(kv_shape, quantized.config, quantized.hack, quantized.seed, dims));
  SLIMKV_ASSIGN_OR_RETURN(auto projection,
                          CudaZackHeadProjection::create({shape.num_layers, shape.num_heads, shape.num_kv_heads, shape.head_dim,
                                                          shape.max_step_tokens, zack.k_ranks, zack.qk_bases, zack.rotate}));
  SLIMKV_ASSIGN_OR_RETURN(auto attention,
                          CudaPagedAttention::create({shape.num_heads, shape.num_kv_heads, shape.head_dim,
                                                      shape.max_sequences, shape.max_step_tokens}));
  SLIMKV_ASSIGN_OR_RETURN(auto v_ranks, DeviceArray<int>::allocate(zack.v_ranks.size(), "the ZACK V ranks"));
  SLIMKV_RETURN_IF_ERROR(v_ranks.upload(zack.v_ranks.data(), zack.v_ranks.size()));
  DeviceArray<uint16_t> v_rotated;
  if (zack.rotate) {
    SLIMKV_ASSIGN_OR_RETURN(v_rotated, DeviceArray<uint16_t>::allocate(size_t(shape.max_step_tokens) * size_t(shape.num_kv_heads) *
                                                                           size_t(shape.head_dim), "the rotated values"));
  }
  return std::unique_ptr<GpuKvCache>(new GpuZackQuantizedKv(shape, std::move(cache), std::move(projection), std::move(attention),
                                                            block_bytes, std::move(v_ranks), std::move(v_rotated)));
}

}  // namespace slimkv::cuda
