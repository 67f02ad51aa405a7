#include "kv/cuda/paged_kv_cache.h"

#include <utility>

#include "kv/cuda/kv_slots.h"

namespace slimkv::cuda {

size_t CudaPagedKvCache::layer_elements() const {
  return size_t(shape_.num_blocks) * shape_.num_kv_heads * kCudaBlockTokens * shape_.head_dim;
}

Expected<std::unique_ptr<CudaPagedKvCache>> CudaPagedKvCache::create(const CudaKvShape& shape) {
  if (shape.num_layers <= 0 || shape.num_kv_heads <= 0 || shape.num_blocks <= 0 || shape.max_sequences <= 0 ||
      shape.max_blocks_per_sequence <= 0 || shape.max_step_tokens <= 0) {
    return error("CUDA KV cache: every size must be positive (layers ", shape.num_layers, ", kv heads ",
                 shape.num_kv_heads, ", blocks ", shape.num_blocks, ", sequences ", shape.max_sequences,
                 ", blocks per sequence ", shape.max_blocks_per_sequence, ", step tokens ", shape.max_step_tokens, ")");
  }
  if (shape.head_dim % 8 != 0) return error("CUDA KV cache: head_dim ", shape.head_dim, " is not a multiple of 8");
  std::unique_ptr<CudaPagedKvCache> cache(new CudaPagedKvCache(shape));
  const size_t pool_elements = size_t(shape.num_layers) * cache->layer_elements();
  if (shape.host_memory) {
    SLIMKV_ASSIGN_OR_RETURN(cache->host_k_pool_, PinnedArray<uint16_t>::allocate(pool_elements, "the K block pool"));
    SLIMKV_ASSIGN_OR_RETURN(cache->host_v_pool_, PinnedArray<uint16_t>::allocate(pool_elements, "the V block pool"));
    cache->k_ = cache->host_k_pool_.data();
    cache->v_ = cache->host_v_pool_.data();
  } else {
    SLIMKV_ASSIGN_OR_RETURN(cache->k_pool_, DeviceArray<uint16_t>::allocate(pool_elements, "the K block pool"));
    SLIMKV_ASSIGN_OR_RETURN(cache->v_pool_, DeviceArray<uint16_t>::allocate(pool_elements, "the V block pool"));
    cache->k_ = cache->k_pool_.data();
    cache->v_ = cache->v_pool_.data();
  }
  const size_t table_entries = size_t(shape.max_sequences) * shape.max_blocks_per_sequence;
  SLIMKV_ASSIGN_OR_RETURN(cache->block_tables_, DeviceArray<int>::allocate(table_entries, "the block tables"));
  SLIMKV_ASSIGN_OR_RETURN(cache->step_slots_, DeviceArray<int>::allocate(size_t(shape.max_step_tokens), "the step's slots"));
  cache->host_block_tables_.assign(table_entries, 0);  // unused entries point at block 0: never read
  SLIMKV_RETURN_IF_ERROR(cache->block_tables_.upload(cache->host_block_tables_.data(), table_entries));
  return Expected<std::unique_ptr<CudaPagedKvCache>>(std::move(cache));
}

Status CudaPagedKvCache::begin_step(const std::vector<int>& sequences, const std::vector<int>& new_tokens) {
  SLIMKV_RETURN_IF_ERROR(
      grow_for_step(sequences_, sequences, new_tokens, shape_.max_step_tokens, host_block_tables_, host_step_slots_));
  SLIMKV_RETURN_IF_ERROR(block_tables_.upload(host_block_tables_.data(), host_block_tables_.size()));
  return step_slots_.upload(host_step_slots_.data(), host_step_slots_.size());
}

Status CudaPagedKvCache::append(int layer, const uint16_t* k, const uint16_t* v) {
  const int n_tokens = int(host_step_slots_.size());
  if (n_tokens == 0) return Status::ok();
  const size_t offset = size_t(layer) * layer_elements();
  return write_kv_slots(k, v, step_slots_.data(), n_tokens, shape_.num_kv_heads, shape_.head_dim, k_ + offset, v_ + offset);
}

PagedKvView CudaPagedKvCache::view(int layer) const {
  const size_t offset = size_t(layer) * layer_elements();
  return PagedKvView{k_ + offset, v_ + offset, block_tables_.data(),
                     shape_.max_blocks_per_sequence, shape_.num_kv_heads, shape_.head_dim};
}

}  // namespace slimkv::cuda
