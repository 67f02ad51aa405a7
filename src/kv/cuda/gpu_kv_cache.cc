#include "kv/cuda/gpu_kv_cache.h"

#include <algorithm>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/ipc_memory.h"
#include "kv/cuda/quantized_kv_cache.h"
#include "kv/cuda/zack_kv_cache.h"
#include "kv/store.h"

namespace slimkv::cuda {

KvprCostModel kvpr_cost_model(int hidden, int kv_dim, DType x_dtype, double kv_bytes_per_token,
                              double link_bytes_per_s, double gemm_flops_per_s) {
  return KvprCostModel{link_bytes_per_s,
                       gemm_flops_per_s,
                       double(size_t(hidden) * dtype_size_bytes(x_dtype)),
                       kv_bytes_per_token,
                       2.0 * double(hidden) * 2.0 * double(kv_dim),
                       KvprCostModel::Overlap::kPipelined};
}

bool GpuKvShape::has_windows() const {
  return std::any_of(layer_windows.begin(), layer_windows.end(), [](int window) { return window > 0; });
}

Status check_blocks_for_step(const SequenceBlocks& held, const PagedAttentionBatch& batch, const char* cache) {
  size_t needed = 0;
  for (size_t i = 0; i < batch.sequence_ids.size(); ++i) {
    needed += size_t(held.blocks_to_grow(batch.sequence_ids[i], batch.kv_lens[i]));
  }
  if (needed > size_t(held.free_blocks())) {
    return error("the ", cache, " KV cache is full: the step needs ", needed, " more blocks of ", kCudaBlockTokens,
                 " tokens, ", held.free_blocks(), " are free (of ", held.num_blocks(), ")");
  }
  return Status::ok();
}

KvPageLayout GpuKvCache::device_page_layout() const {
  KvPageLayout layout;
  for (const PagePool& pool : device_pages().pools) {
    layout.piece_offsets.push_back(layout.page_bytes);
    layout.piece_bytes.push_back(pool.head_bytes);
    layout.page_bytes += pool.block_bytes;
  }
  return layout;
}

// Each pool's part of every (layer, block) copied to its place in the pages, one kernel a pool.
Status GpuKvCache::export_pages(int sequence, int blocks, uint8_t* out) const {
  const DevicePages pages = device_pages();
  const std::vector<PagePool>& pools = pages.pools;
  // Caches without device pages (a host tier, PQ's, ZACK's) move sequences through the host alone.
  if (pools.empty()) {
    return error("this GPU KV cache has no device pages to share (a host tier, pq or zack): its KV moves through host memory");
  }
  if (blocks > sequences().num_tokens(sequence) / kCudaBlockTokens) {
    return error("exporting ", blocks, " blocks of a sequence of ", sequences().num_tokens(sequence), " tokens");
  }
  const KvPageLayout layout = device_page_layout();
  const int layers = pages.num_layers;
  for (size_t p = 0; p < pools.size(); ++p) {
    SLIMKV_RETURN_IF_ERROR(copy_device_pieces(out, page_offsets(layers, blocks, layout.page_bytes, layout.piece_offsets[p]),
                                              pools[p].base,
                                              pool_offsets(layers, sequences().blocks(sequence), blocks, pools[p].layer_bytes,
                                                           pools[p].block_bytes),
                                              pools[p].block_bytes));
  }
  return Status::ok();
}
Status GpuKvCache::import_pages(int, int, const uint8_t*, const KvStore&) {
  return error("this GPU KV cache has no device pages to fill (a host tier, pq or zack): its KV moves through host memory");
}
// A cache with device pages never gets here: gpu_kv_transfer.cc moves its sequences as pages.
Status GpuKvCache::export_sequence(int, KvStore&) const {
  return error("this GPU KV cache keeps its sequences in device pages: export them with export_pages");
}
Status GpuKvCache::import_sequence(int, const KvStore&) {
  return error("this GPU KV cache keeps its sequences in device pages: import them with import_pages");
}
Status GpuKvCache::export_open_tokens(int sequence, KvStore& into) const {
  into.clear();
  for (int l = 0; l < into.shape().num_layers; ++l) SLIMKV_RETURN_IF_ERROR(restore_open_layer(sequence, l, into));
  return Status::ok();
}
Status GpuKvCache::restore_open_layer(int, int, KvStore&) const {
  return error("this GPU KV cache has no device pages (a host tier, pq or zack): its KV moves through host memory");
}

std::vector<uint64_t> page_offsets(int num_layers, int blocks, size_t page_bytes, size_t part_offset) {
  std::vector<uint64_t> offsets;
  offsets.reserve(size_t(num_layers) * size_t(blocks));
  for (int l = 0; l < num_layers; ++l) {
    for (int b = 0; b < blocks; ++b) offsets.push_back((uint64_t(l) * uint64_t(blocks) + uint64_t(b)) * page_bytes + part_offset);
  }
  return offsets;
}

std::vector<uint64_t> pool_offsets(int num_layers, const std::vector<int>& block_ids, int blocks, size_t layer_bytes,
                                   size_t block_bytes) {
  std::vector<uint64_t> offsets;
  offsets.reserve(size_t(num_layers) * size_t(blocks));
  for (int l = 0; l < num_layers; ++l) {
    for (int b = 0; b < blocks; ++b) offsets.push_back(uint64_t(l) * layer_bytes + uint64_t(block_ids[size_t(b)]) * block_bytes);
  }
  return offsets;
}

Expected<std::unique_ptr<GpuKvCache>> make_gpu_kv_cache(const GpuKvShape& shape, const GpuKvOptions& options,
                                                        KvProjection* projection) {
  if (shape.max_sequences < 1 || shape.max_step_tokens < shape.max_sequences) {
    return error("GPU KV cache: max_sequences ", shape.max_sequences, " and max_step_tokens ", shape.max_step_tokens,
                 " must be positive, max_step_tokens >= max_sequences");
  }
  if (shape.has_windows() && (options.quantized || options.zack || options.tier || options.pq)) {
    return error("GPU KV cache: sliding-window layers run with the dense codec only on device 'cuda' yet (not with ",
                 options.quantized ? "a quantizing codec" : options.zack ? "zack" : options.tier ? "a host tier" : "pq", ")");
  }
  if (options.zack && options.quantized && options.tier) {
    return error("GPU KV cache: zack followed by a quantizing codec with a host tier does not run on device 'cuda' yet");
  }
  if (options.pq) {
    if (options.zack || options.tier) {
      return error("GPU KV cache: pq with zack or a host tier does not run on device 'cuda' yet");
    }
    return make_gpu_pq_kv(shape, *options.pq, options.quantized, options.kv_cache_bytes);
  }
  if (options.zack && options.tier) return make_gpu_zack_host_kv(shape, *options.zack, *options.tier, options.kv_cache_bytes);
  if (options.tier) return make_gpu_host_tier_kv(shape, options, projection);

  // The block pool: what was asked for, or the full contexts of every sequence within 90% of what is
  // free. Quantized KV: the FP16 window (sized by the step, not the context) first, sealed blocks in the rest.
  const CudaKvShape kv_shape{shape.num_layers,    shape.num_kv_heads,         shape.head_dim, 0,
                             shape.max_sequences, shape.blocks_per_sequence(), shape.max_step_tokens};
  const size_t fp16_block_bytes =
      size_t(shape.num_layers) * 2 * size_t(shape.num_kv_heads) * kCudaBlockTokens * size_t(shape.head_dim) * 2;
  size_t block_bytes = fp16_block_bytes, window_bytes = 0;
  const HeadDims zack_dims = options.zack ? HeadDims{options.zack->k_ranks, options.zack->v_ranks} : HeadDims{};
  if (const auto& q = options.quantized) {  // zack before it: each head's block at its ranks
    SLIMKV_ASSIGN_OR_RETURN(block_bytes, CudaQuantizedKvCache::sealed_block_bytes(kv_shape, q->config, zack_dims));
    window_bytes = size_t(CudaQuantizedKvCache::window_blocks(kv_shape)) * fp16_block_bytes;
  } else if (const auto& z = options.zack) {
    block_bytes = CudaZackKvCache::block_bytes(z->k_ranks, z->v_ranks);
  }
  if (shape.has_windows()) {  // the budget counts the global layers; the sliding ones keep their windows apart
    block_bytes = global_layers_block_bytes(shape);
    window_bytes = sliding_window_pool_bytes(shape);
  }
  size_t budget = options.kv_cache_bytes;
  if (budget == 0) {
    SLIMKV_ASSIGN_OR_RETURN(size_t free_bytes, device_free_memory());
    budget = free_bytes / 10 * 9;
  }
  const size_t fitting = budget > window_bytes ? (budget - window_bytes) / block_bytes : 0;
  const size_t blocks =
      options.kv_cache_bytes > 0
          ? fitting
          : std::min(size_t(shape.max_sequences) * size_t(shape.blocks_per_sequence()), fitting);
  if (blocks == 0) {
    return error("CUDA model: no room for a single KV block of ", block_bytes, " bytes (kv_cache_bytes ",
                 options.kv_cache_bytes, ", of which the quantized KV's FP16 window or the sliding layers' windows take ",
                 window_bytes, ")");
  }
  const int num_blocks = int(std::min<size_t>(blocks, 1u << 30));
  if (options.quantized && options.zack) return make_gpu_zack_quantized_kv(shape, *options.quantized, *options.zack, num_blocks);
  if (const auto& q = options.quantized) return make_gpu_quantized_kv(shape, *q, num_blocks);
  if (const auto& z = options.zack) return make_gpu_zack_kv(shape, *z, num_blocks);
  if (shape.has_windows()) return make_gpu_sliding_dense_kv(shape, num_blocks);
  return make_gpu_dense_kv(shape, num_blocks);
}

}  // namespace slimkv::cuda
