// The `zack` stage on the GPU (ZACK §5): every (layer, KV head) at its own K and V ranks in one pool of
// equal blocks (zack_kv_cache.h), q and k projected onto each head's basis after RoPE, attention on the
// reduced dims with heads balanced by rank (attention/cuda/zack_attention.h). The model's W_V / W_O
// come folded (model/zack_projection.h), so values arrive reduced and the output is read reduced.
// `zack...@offload`: the same pool in pinned host memory, each layer's blocks of a step's sequences
// copied into a GPU staging buffer as the step appends (zack_kv_cache.h). Not `@kvpr`: it recomputes
// full-width K/V from X, which would have to be projected per head and written at ZACK's ranks.
// A sequence moves out and in as a host store (KvStore) in the CPU zack stage's form over
// `dense:dtype=f16`: each (layer, KV head) at its ranks, a sealed block K' token-major [64, k_rank] then
// V' [64, v_rank] in FP16, the open tokens the same rows (the pool's dim-major blocks transposed on the
// host). No device pages: blocks differ in size by layer and head, which the pages' one size per head
// (GpuKvCache::PagePool) cannot describe. In the transfer format the store is version 2 (each head's
// dims), as the CPU's zack stage writes it.
#include <algorithm>
#include <vector>

#include "kv/cuda/gpu_kv_cache.h"
#include "kv/cuda/zack_kv_cache.h"
#include "kv/store.h"
#include "util/half.h"

namespace slimkv::cuda {
namespace {

// Tokens [0, n) of one head's `rank` dims: dim-major in a pool block (dims [rank, kCudaBlockTokens]) ↔
// token-major rows [n, rank].
void dims_to_rows(const uint16_t* dims, int rank, int n, uint16_t* rows) {
  for (int t = 0; t < n; ++t) {
    for (int j = 0; j < rank; ++j) rows[size_t(t) * size_t(rank) + size_t(j)] = dims[size_t(j) * kCudaBlockTokens + size_t(t)];
  }
}
void rows_to_dims(const uint16_t* rows, int rank, int n, uint16_t* dims) {
  for (int t = 0; t < n; ++t) {
    for (int j = 0; j < rank; ++j) dims[size_t(j) * kCudaBlockTokens + size_t(t)] = rows[size_t(t) * size_t(rank) + size_t(j)];
  }
}

class GpuZackKv final : public GpuKvCache {
 public:
  GpuZackKv(std::unique_ptr<CudaZackKvCache> cache, std::unique_ptr<CudaZackAttention> attention, ZackSchedules schedules)
      : cache_(std::move(cache)), attention_(std::move(attention)), schedules_(schedules) {}

  const SequenceBlocks& sequences() const override { return cache_->sequences(); }
  Expected<int> add_sequence() override { return cache_->sequences().add_sequence(); }
  void remove_sequence(int sequence) override { cache_->sequences().remove_sequence(sequence); }
  size_t device_bytes() const override { return cache_->device_bytes(); }
  size_t host_bytes() const override { return cache_->host_bytes(); }
  size_t bytes_per_block() const override { return CudaZackKvCache::block_bytes(cache_->shape().k_ranks, cache_->shape().v_ranks); }

  Status check_step(const PagedAttentionBatch& batch) const override {
    SLIMKV_RETURN_IF_ERROR(check_blocks_for_step(sequences(), batch, cache_->on_host() ? "host" : "GPU"));
    return cache_->check_staging(batch.sequence_ids, batch.query_counts);
  }
  Status begin_step(const PagedAttentionBatch& batch) override {
    SLIMKV_RETURN_IF_ERROR(cache_->begin_step(batch.sequence_ids, batch.query_counts));
    return attention_->plan(batch, schedules_);
  }
  Status attend(int layer, const uint16_t* q, const uint16_t* k, const uint16_t* v, float scale,
                uint16_t* out) override {
    SLIMKV_ASSIGN_OR_RETURN(const uint16_t* reduced, cache_->append_and_project_queries(layer, q, k, v));
    return attention_->run(layer, cache_->view(layer), reduced, scale, out);
  }

  Status begin_fill(int sequence, int tokens) override {
    return cache_->begin_step({sequence}, {tokens}, /*stage=*/false);
  }
  Status fill(int layer, const uint16_t* k, const uint16_t* v, const void* /*x*/) override {
    return cache_->append(layer, k, v);
  }

  // Every block the sequence holds brought to the host, each head's full blocks transposed into `dense`
  // blocks, its open block's first tokens into FP32 rows.
  Status export_sequence(int sequence, KvStore& into) const override {
    SLIMKV_RETURN_IF_ERROR(check_store_dims(into.shape(), "exporting into"));
    const int tokens = sequences().num_tokens(sequence), full = tokens / kCudaBlockTokens;
    const int open = tokens - full * kCudaBlockTokens;
    std::vector<std::vector<uint16_t>> blocks;  // [layer][held block, block_elements]
    SLIMKV_RETURN_IF_ERROR(cache_->download_blocks(sequences().blocks(sequence), blocks));
    into.clear();
    std::vector<uint16_t> dense, k_rows, v_rows;
    std::vector<float> k_open, v_open;
    const int heads = cache_->shape().num_kv_heads;
    for (int l = 0; l < cache_->shape().num_layers; ++l) {
      const size_t block_elements = size_t(cache_->block_elements(l));
      for (int g = 0; g < heads; ++g) {
        const ZackHeadLayout& head = cache_->head_layout(l, g);
        const size_t k_elements = size_t(kCudaBlockTokens) * size_t(head.k_rank);
        dense.resize(k_elements + size_t(kCudaBlockTokens) * size_t(head.v_rank));
        for (int b = 0; b < full; ++b) {
          const uint16_t* block = blocks[size_t(l)].data() + size_t(b) * block_elements;
          dims_to_rows(block + head.k_offset, head.k_rank, kCudaBlockTokens, dense.data());
          dims_to_rows(block + head.v_offset, head.v_rank, kCudaBlockTokens, dense.data() + k_elements);
          into.restore_sealed_block(l, g, reinterpret_cast<const uint8_t*>(dense.data()));
        }
      }
      for (int g = 0; g < heads; ++g) {
        const ZackHeadLayout& head = cache_->head_layout(l, g);
        k_rows.resize(size_t(open) * size_t(head.k_rank));
        v_rows.resize(size_t(open) * size_t(head.v_rank));
        if (open > 0) {
          const uint16_t* block = blocks[size_t(l)].data() + size_t(full) * block_elements;
          dims_to_rows(block + head.k_offset, head.k_rank, open, k_rows.data());
          dims_to_rows(block + head.v_offset, head.v_rank, open, v_rows.data());
        }
        k_open.resize(k_rows.size());
        v_open.resize(v_rows.size());
        std::transform(k_rows.begin(), k_rows.end(), k_open.begin(), fp16_to_float);
        std::transform(v_rows.begin(), v_rows.end(), v_open.begin(), fp16_to_float);
        into.restore_open_tokens(l, g, k_open.data(), v_open.data(), open);
      }
    }
    return Status::ok();
  }

  // The blocks taken as steps take them (a step at most max_step_tokens tokens), then every layer's
  // filled on the host and uploaded at once: the stored K' is already projected, so it cannot go
  // through append, which projects k.
  Status import_sequence(int sequence, const KvStore& from) override {
    SLIMKV_RETURN_IF_ERROR(check_store_dims(from.shape(), "importing from"));
    const int tokens = from.num_tokens(0), full = tokens / kCudaBlockTokens;
    const int open = tokens - full * kCudaBlockTokens;
    const ZackKvShape& shape = cache_->shape();
    if (from.block_tokens() != kCudaBlockTokens) {
      return error("importing into the GPU's zack cache: blocks of ", from.block_tokens(), " tokens, expected ", kCudaBlockTokens);
    }
    for (int l = 0; l < shape.num_layers; ++l) {
      if (from.num_tokens(l) != tokens || from.num_sealed_blocks(l) != full) {
        return error("importing into the GPU's zack cache: layer ", l, " holds ", from.num_tokens(l), " tokens in ",
                     from.num_sealed_blocks(l), " sealed blocks, layer 0 ", tokens, " tokens; expected one count in every ",
                     "layer, every full block sealed");
      }
    }
    const int needed = sequences().blocks_to_grow(sequence, tokens);
    if (needed > sequences().free_blocks()) {
      return error("the ", cache_->on_host() ? "host" : "GPU", " KV cache has no room for the imported sequence: ", needed,
                   " blocks of ", kCudaBlockTokens, " tokens needed, ", sequences().free_blocks(), " free");
    }
    for (int done = 0; done < tokens; done += shape.max_step_tokens) {
      SLIMKV_RETURN_IF_ERROR(cache_->begin_step({sequence}, {std::min(shape.max_step_tokens, tokens - done)}, /*stage=*/false));
    }
    const std::vector<int>& ids = sequences().blocks(sequence);
    std::vector<std::vector<uint16_t>> blocks(size_t(shape.num_layers));  // [layer][held block, block_elements]
    std::vector<uint16_t> k_rows, v_rows;
    std::vector<float> k_open, v_open;
    for (int l = 0; l < shape.num_layers; ++l) {
      const size_t block_elements = size_t(cache_->block_elements(l));
      blocks[size_t(l)].assign(ids.size() * block_elements, 0);
      for (int g = 0; g < shape.num_kv_heads; ++g) {
        const ZackHeadLayout& head = cache_->head_layout(l, g);
        const size_t k_elements = size_t(kCudaBlockTokens) * size_t(head.k_rank);
        const size_t dense_bytes = (k_elements + size_t(kCudaBlockTokens) * size_t(head.v_rank)) * 2;
        if (from.block_bytes(l, g) != dense_bytes) {
          return error("importing into the GPU's zack cache: layer ", l, " KV head ", g, " has sealed blocks of ",
                       from.block_bytes(l, g), " bytes, expected ", dense_bytes, " (FP16 K' and V' at ranks ", head.k_rank,
                       "/", head.v_rank, ")");
        }
        for (int b = 0; b < full; ++b) {
          const auto* dense = reinterpret_cast<const uint16_t*>(from.sealed_block(l, g, b));
          uint16_t* block = blocks[size_t(l)].data() + size_t(b) * block_elements;
          rows_to_dims(dense, head.k_rank, kCudaBlockTokens, block + head.k_offset);
          rows_to_dims(dense + k_elements, head.v_rank, kCudaBlockTokens, block + head.v_offset);
        }
        if (open == 0) continue;
        k_open.resize(size_t(open) * size_t(head.k_rank));
        v_open.resize(size_t(open) * size_t(head.v_rank));
        from.widen_open(l, g, open, k_open.data(), v_open.data());
        k_rows.resize(k_open.size());
        v_rows.resize(v_open.size());
        std::transform(k_open.begin(), k_open.end(), k_rows.begin(), float_to_fp16);  // exact: they were FP16
        std::transform(v_open.begin(), v_open.end(), v_rows.begin(), float_to_fp16);
        uint16_t* block = blocks[size_t(l)].data() + size_t(full) * block_elements;
        rows_to_dims(k_rows.data(), head.k_rank, open, block + head.k_offset);
        rows_to_dims(v_rows.data(), head.v_rank, open, block + head.v_offset);
      }
    }
    return cache_->upload_blocks(ids, blocks);
  }

 private:
  // Whether a host store of the sequence holds each (layer, KV head) at this cache's ranks.
  Status check_store_dims(const KvShape& store, const char* what) const {
    const ZackKvShape& shape = cache_->shape();
    if (store.num_layers != shape.num_layers || store.num_kv_heads != shape.num_kv_heads) {
      return error(what, " a host KV store of ", store.num_layers, " layers and ", store.num_kv_heads,
                   " KV heads: the GPU's zack cache has ", shape.num_layers, " and ", shape.num_kv_heads);
    }
    for (int l = 0; l < shape.num_layers; ++l) {
      for (int g = 0; g < shape.num_kv_heads; ++g) {
        const ZackHeadLayout& head = cache_->head_layout(l, g);
        if (store.k_dim_of(l, g) != head.k_rank || store.v_dim_of(l, g) != head.v_rank) {
          return error(what, " a host KV store whose layer ", l, " KV head ", g, " holds ", store.k_dim_of(l, g), "/",
                       store.v_dim_of(l, g), " K/V dims: the GPU's zack cache stores ranks ", head.k_rank, "/",
                       head.v_rank, " there (the store's shape must carry ZACK's per-head dims)");
        }
      }
    }
    return Status::ok();
  }

  std::unique_ptr<CudaZackKvCache> cache_;
  std::unique_ptr<CudaZackAttention> attention_;
  ZackSchedules schedules_;
};

// A zack cache of num_blocks blocks, in GPU memory, or in host memory with staging_blocks of GPU staging.
Expected<std::unique_ptr<GpuKvCache>> make_zack_kv(const GpuKvShape& shape, const ZackKvOptions& options, int num_blocks,
                                                   int staging_blocks) {
  ZackKvShape zack{shape.num_layers, shape.num_heads, shape.num_kv_heads, shape.head_dim, num_blocks, shape.max_sequences,
                   shape.blocks_per_sequence(), shape.max_step_tokens, options.k_ranks, options.v_ranks, options.qk_bases};
  zack.staging_blocks = staging_blocks;
  SLIMKV_ASSIGN_OR_RETURN(auto cache, CudaZackKvCache::create(zack));
  SLIMKV_ASSIGN_OR_RETURN(auto attention,
                          CudaZackAttention::create({shape.num_layers, shape.num_heads, shape.num_kv_heads, shape.head_dim,
                                                     shape.max_sequences, shape.max_step_tokens, options.k_ranks,
                                                     options.v_ranks}));
  return std::unique_ptr<GpuKvCache>(new GpuZackKv(std::move(cache), std::move(attention), options.schedules));
}

}  // namespace

Expected<std::unique_ptr<GpuKvCache>> make_gpu_zack_kv(const GpuKvShape& shape, const ZackKvOptions& options,
                                                       int num_blocks) {
  return make_zack_kv(shape, options, num_blocks, 0);
}

// The host pool: tier.host_bytes of blocks, or room for every sequence's full context; the staging
// buffer: kv_cache_bytes of blocks of the widest layer, or the same room within 80% of the GPU's free
// memory (as the dense host tier's two buffers).
Expected<std::unique_ptr<GpuKvCache>> make_gpu_zack_host_kv(const GpuKvShape& shape, const ZackKvOptions& options,
                                                            const KvTierOptions& tier, size_t kv_cache_bytes) {
  if (tier.recompute) {
    return error("GPU KV cache: zack with the kvpr tier does not run on device 'cuda': kvpr recomputes full-width K/V ",
                 "from X, which ZACK would have to project per head and store at its ranks (use zack...@offload)");
  }
  size_t widest_layer_bytes = 0;
  for (int l = 0; l < shape.num_layers; ++l) {
    size_t layer_bytes = 0;
    for (int g = 0; g < shape.num_kv_heads; ++g) {
      const size_t i = size_t(l) * size_t(shape.num_kv_heads) + size_t(g);
      if (i < options.k_ranks.size() && i < options.v_ranks.size()) {
        layer_bytes += size_t(options.k_ranks[i] + options.v_ranks[i]) * kCudaBlockTokens * 2;
      }
    }
    widest_layer_bytes = std::max(widest_layer_bytes, layer_bytes);
  }
  const size_t block_bytes = CudaZackKvCache::block_bytes(options.k_ranks, options.v_ranks);
  const size_t full_contexts = size_t(shape.max_sequences) * size_t(shape.blocks_per_sequence());
  const size_t host_blocks = tier.host_bytes > 0 ? tier.host_bytes / std::max<size_t>(1, block_bytes) : full_contexts;
  size_t staging_blocks = full_contexts;
  if (kv_cache_bytes > 0) {
    staging_blocks = kv_cache_bytes / std::max<size_t>(1, widest_layer_bytes);
  } else {
    SLIMKV_ASSIGN_OR_RETURN(size_t free_bytes, device_free_memory());
    staging_blocks = std::min(staging_blocks, free_bytes / 10 * 8 / std::max<size_t>(1, widest_layer_bytes));
  }
  if (host_blocks == 0 || staging_blocks == 0) {
    return error("CUDA model: zack@offload has no room (host pool ", tier.host_bytes, " bytes, GPU KV budget ",
                 kv_cache_bytes, " bytes: a block of 64 tokens takes ", block_bytes, " bytes of host memory, ",
                 widest_layer_bytes, " of GPU staging)");
  }
  return make_zack_kv(shape, options, int(std::min<size_t>(host_blocks, 1u << 30)),
                      int(std::min<size_t>(staging_blocks, 1u << 30)));
}

}  // namespace slimkv::cuda
