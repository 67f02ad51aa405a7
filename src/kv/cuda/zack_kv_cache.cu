#include "kv/cuda/zack_kv_cache.h"

#include <cuda_fp16.h>

#include <utility>

#include "backend/cuda/cuda_check.h"

namespace slimkv::cuda {
namespace {

constexpr int kMaxHeadDim = 128;

// Token t's k' (first k_rank dims) and v (first v_rank dims) into its slot;
// grid (n tokens, num_kv_heads), head_dim threads.
__global__ void write_zack_slots_kernel(const __half* k, const __half* v, const int* slots, int num_kv_heads,
                                        int head_dim, const ZackHeadLayout* layout, long long block_elements,
                                        __half* pool) {
  const int t = blockIdx.x, g = blockIdx.y, j = threadIdx.x;
  const int slot = slots[t];
  if (slot < 0) return;
  const ZackHeadLayout head = layout[g];
  __half* block = pool + size_t(slot / kCudaBlockTokens) * size_t(block_elements);
  const int offset = slot % kCudaBlockTokens;
  const size_t row = (size_t(t) * num_kv_heads + g) * head_dim;
  if (j < head.k_rank) block[head.k_offset + j * kCudaBlockTokens + offset] = k[row + j];
  if (j < head.v_rank) block[head.v_offset + j * kCudaBlockTokens + offset] = v[row + j];
}

}  // namespace

size_t CudaZackKvCache::block_bytes(const std::vector<int>& k_ranks, const std::vector<int>& v_ranks) {
  size_t elements = 0;
  for (size_t i = 0; i < k_ranks.size(); ++i) elements += size_t(k_ranks[i] + v_ranks[i]);
  return elements * kCudaBlockTokens * 2;
}

Expected<std::unique_ptr<CudaZackKvCache>> CudaZackKvCache::create(const ZackKvShape& shape) {
  const size_t heads = size_t(shape.num_layers) * size_t(shape.num_kv_heads);
  if (shape.num_layers <= 0 || shape.num_kv_heads <= 0 || shape.num_heads % shape.num_kv_heads != 0 ||
      shape.num_blocks <= 0 || shape.max_sequences <= 0 || shape.max_blocks_per_sequence <= 0 ||
      shape.max_step_tokens <= 0 || shape.head_dim <= 0 || shape.head_dim > kMaxHeadDim || shape.head_dim % 2 != 0) {
    return error("CUDA ZACK KV cache: every size must be positive, query heads a multiple of KV heads, head_dim even ",
                 "and at most ", kMaxHeadDim, " (layers ", shape.num_layers, ", heads ", shape.num_heads, "/",
                 shape.num_kv_heads, ", head_dim ", shape.head_dim, ", blocks ", shape.num_blocks, ", sequences ",
                 shape.max_sequences, ", blocks per sequence ", shape.max_blocks_per_sequence, ", step tokens ",
                 shape.max_step_tokens, ")");
  }
  if (shape.k_ranks.size() != heads || shape.v_ranks.size() != heads) {
    return error("CUDA ZACK KV cache: ", shape.k_ranks.size(), " K and ", shape.v_ranks.size(),
                 " V ranks, expected one per layer and KV head (", heads, ")");
  }
  std::unique_ptr<CudaZackKvCache> cache(new CudaZackKvCache(shape));
  SLIMKV_ASSIGN_OR_RETURN(cache->projection_,
                          CudaZackHeadProjection::create({shape.num_layers, shape.num_heads, shape.num_kv_heads, shape.head_dim,
                                                          shape.max_step_tokens, shape.k_ranks, shape.qk_bases}));
  size_t layer_offset = 0;
  for (int l = 0; l < shape.num_layers; ++l) {
    int at = 0;  // elements of the block so far
    for (int g = 0; g < shape.num_kv_heads; ++g) {
      const size_t i = size_t(l) * shape.num_kv_heads + size_t(g);
      const int k_rank = shape.k_ranks[i], v_rank = shape.v_ranks[i];
      if (k_rank < 1 || k_rank > shape.head_dim || v_rank < 1 || v_rank > shape.head_dim) {
        return error("CUDA ZACK KV cache: layer ", l, " KV head ", g, " has ranks ", k_rank, "/", v_rank,
                     ", expected 1..", shape.head_dim);
      }
      ZackHeadLayout head{at, k_rank, at + k_rank * kCudaBlockTokens, v_rank};
      at = head.v_offset + v_rank * kCudaBlockTokens;
      cache->host_heads_.push_back(head);
    }
    cache->block_elements_.push_back(at);
    cache->layer_offsets_.push_back(layer_offset);
    layer_offset += size_t(at) * size_t(shape.num_blocks);
  }
  const size_t table_entries = size_t(shape.max_sequences) * shape.max_blocks_per_sequence;
  SLIMKV_ASSIGN_OR_RETURN(cache->pool_, DeviceArray<uint16_t>::allocate(layer_offset, "the ZACK block pool"));
  SLIMKV_ASSIGN_OR_RETURN(cache->heads_, DeviceArray<ZackHeadLayout>::allocate(heads, "the ZACK head layouts"));
  SLIMKV_ASSIGN_OR_RETURN(cache->block_tables_, DeviceArray<int>::allocate(table_entries, "the block tables"));
  SLIMKV_ASSIGN_OR_RETURN(cache->step_slots_, DeviceArray<int>::allocate(size_t(shape.max_step_tokens), "the step's slots"));
  SLIMKV_RETURN_IF_ERROR(cache->heads_.upload(cache->host_heads_.data(), heads));
  cache->host_block_tables_.assign(table_entries, 0);  // unused entries point at block 0: never read
  SLIMKV_RETURN_IF_ERROR(cache->block_tables_.upload(cache->host_block_tables_.data(), table_entries));
  return Expected<std::unique_ptr<CudaZackKvCache>>(std::move(cache));
}

Status CudaZackKvCache::begin_step(const std::vector<int>& sequences, const std::vector<int>& new_tokens) {
  SLIMKV_RETURN_IF_ERROR(
      grow_for_step(sequences_, sequences, new_tokens, shape_.max_step_tokens, host_block_tables_, host_step_slots_));
  SLIMKV_RETURN_IF_ERROR(block_tables_.upload(host_block_tables_.data(), host_block_tables_.size()));
  return step_slots_.upload(host_step_slots_.data(), host_step_slots_.size());
}

Expected<const uint16_t*> CudaZackKvCache::project_queries(int layer, const uint16_t* q) {
  return projection_->project_queries(layer, q, int(host_step_slots_.size()));
}

Status CudaZackKvCache::append(int layer, const uint16_t* k, const uint16_t* v) {
  const int n = int(host_step_slots_.size());
  if (n == 0) return Status::ok();
  SLIMKV_ASSIGN_OR_RETURN(const uint16_t* reduced, projection_->project_keys(layer, k, n));
  const size_t first = size_t(layer) * shape_.num_kv_heads;
  write_zack_slots_kernel<<<dim3(unsigned(n), unsigned(shape_.num_kv_heads)), shape_.head_dim>>>(
      reinterpret_cast<const __half*>(reduced), reinterpret_cast<const __half*>(v), step_slots_.data(),
      shape_.num_kv_heads, shape_.head_dim, heads_.data() + first, block_elements_[size_t(layer)],
      reinterpret_cast<__half*>(pool_.data() + layer_offsets_[size_t(layer)]));
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

ZackKvView CudaZackKvCache::view(int layer) const {
  return ZackKvView{pool_.data() + layer_offsets_[size_t(layer)], block_elements_[size_t(layer)],
                    heads_.data() + size_t(layer) * shape_.num_kv_heads, block_tables_.data(),
                    shape_.max_blocks_per_sequence, shape_.num_kv_heads};
}

}  // namespace slimkv::cuda
