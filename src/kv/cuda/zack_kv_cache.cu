#include "kv/cuda/zack_kv_cache.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ipc_memory.h"

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

// Byte offsets of blocks `block_ids` (of block_bytes each) in a layer's region of the pool, and of the
// same blocks packed back to back.
void block_offsets(const std::vector<int>& block_ids, size_t block_bytes, std::vector<uint64_t>& in_pool,
                   std::vector<uint64_t>& packed) {
  in_pool.clear();
  packed.clear();
  for (size_t i = 0; i < block_ids.size(); ++i) {
    in_pool.push_back(uint64_t(block_ids[i]) * block_bytes);
    packed.push_back(uint64_t(i) * block_bytes);
  }
}

// A device buffer for n blocks of the widest layer: each layer's blocks pass through it packed.
Expected<DeviceArray<uint16_t>> packed_layer_blocks(const std::vector<long long>& block_elements, size_t n) {
  const long long widest = *std::max_element(block_elements.begin(), block_elements.end());
  return DeviceArray<uint16_t>::allocate(n * size_t(widest), "a ZACK sequence's layer of blocks");
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
  if (shape.staging_blocks < 0) return error("CUDA ZACK KV cache: staging_blocks ", shape.staging_blocks, ", expected >= 0");
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
  if (cache->on_host()) {
    SLIMKV_ASSIGN_OR_RETURN(cache->host_pool_, PinnedArray<uint16_t>::allocate(layer_offset, "the ZACK block pool in host memory"));
    cache->pool_data_ = cache->host_pool_.data();
    const long long widest = *std::max_element(cache->block_elements_.begin(), cache->block_elements_.end());
    SLIMKV_ASSIGN_OR_RETURN(cache->staging_, DeviceArray<uint16_t>::allocate(size_t(shape.staging_blocks) * size_t(widest),
                                                                            "the ZACK staging buffer"));
    SLIMKV_ASSIGN_OR_RETURN(cache->staging_tables_, DeviceArray<int>::allocate(table_entries, "the staging block tables"));
    SLIMKV_ASSIGN_OR_RETURN(cache->staging_slots_, DeviceArray<int>::allocate(size_t(shape.max_step_tokens), "the staging slots"));
    cache->host_staging_tables_.assign(table_entries, 0);  // unused entries point at staging block 0: never read
  } else {
    SLIMKV_ASSIGN_OR_RETURN(cache->pool_, DeviceArray<uint16_t>::allocate(layer_offset, "the ZACK block pool"));
    cache->pool_data_ = cache->pool_.data();
  }
  SLIMKV_ASSIGN_OR_RETURN(cache->heads_, DeviceArray<ZackHeadLayout>::allocate(heads, "the ZACK head layouts"));
  SLIMKV_ASSIGN_OR_RETURN(cache->block_tables_, DeviceArray<int>::allocate(table_entries, "the block tables"));
  SLIMKV_ASSIGN_OR_RETURN(cache->step_slots_, DeviceArray<int>::allocate(size_t(shape.max_step_tokens), "the step's slots"));
  SLIMKV_RETURN_IF_ERROR(cache->heads_.upload(cache->host_heads_.data(), heads));
  cache->host_block_tables_.assign(table_entries, 0);  // unused entries point at block 0: never read
  SLIMKV_RETURN_IF_ERROR(cache->block_tables_.upload(cache->host_block_tables_.data(), table_entries));
  return Expected<std::unique_ptr<CudaZackKvCache>>(std::move(cache));
}

Status CudaZackKvCache::check_staging(const std::vector<int>& sequences, const std::vector<int>& new_tokens) const {
  if (!on_host()) return Status::ok();
  long blocks = 0;
  for (size_t i = 0; i < sequences.size() && i < new_tokens.size(); ++i) {
    if (!sequences_.is_live(sequences[i])) return error("CUDA ZACK KV cache step: sequence ", sequences[i], " does not exist");
    blocks += (sequences_.num_tokens(sequences[i]) + new_tokens[i] + kCudaBlockTokens - 1) / kCudaBlockTokens;
  }
  if (blocks > shape_.staging_blocks) {
    return error("the step's sequences hold ", blocks, " blocks of ", kCudaBlockTokens, " tokens per layer, over the ",
                 shape_.staging_blocks, " of the GPU staging buffer of zack@offload (raise the GPU KV budget)");
  }
  return Status::ok();
}

Status CudaZackKvCache::begin_step(const std::vector<int>& sequences, const std::vector<int>& new_tokens, bool stage) {
  staged_ = false;
  if (stage) SLIMKV_RETURN_IF_ERROR(check_staging(sequences, new_tokens));
  SLIMKV_RETURN_IF_ERROR(
      grow_for_step(sequences_, sequences, new_tokens, shape_.max_step_tokens, host_block_tables_, host_step_slots_));
  SLIMKV_RETURN_IF_ERROR(block_tables_.upload(host_block_tables_.data(), host_block_tables_.size()));
  SLIMKV_RETURN_IF_ERROR(step_slots_.upload(host_step_slots_.data(), host_step_slots_.size()));
  if (!on_host() || !stage) return Status::ok();
  SLIMKV_RETURN_IF_ERROR(plan_staging(sequences, new_tokens));
  staged_ = true;
  return Status::ok();
}

// Each sequence's blocks take the next staging blocks in step order; the blocks holding tokens from
// before the step are copied (runs of consecutive pool blocks in one copy), the new tokens' slots follow
// the order of the pool's (grow_for_step: sequence by sequence, position by position).
Status CudaZackKvCache::plan_staging(const std::vector<int>& sequences, const std::vector<int>& new_tokens) {
  const size_t stride = size_t(shape_.max_blocks_per_sequence);
  host_staging_slots_.clear();
  staging_runs_.clear();
  int next = 0;  // the first staging block of the sequence
  for (size_t i = 0; i < sequences.size(); ++i) {
    const std::vector<int>& blocks = sequences_.blocks(sequences[i]);
    const int total = sequences_.num_tokens(sequences[i]), before = total - new_tokens[i];
    const int held_blocks = (before + kCudaBlockTokens - 1) / kCudaBlockTokens;
    for (size_t j = 0; j < blocks.size(); ++j) host_staging_tables_[size_t(sequences[i]) * stride + j] = next + int(j);
    for (int j = 0; j < held_blocks; ++j) {
      StagingRun* last = staging_runs_.empty() ? nullptr : &staging_runs_.back();
      if (last && last->pool_block + last->count == blocks[size_t(j)] && last->staging_block + last->count == next + j) {
        ++last->count;
      } else {
        staging_runs_.push_back({blocks[size_t(j)], next + j, 1});
      }
    }
    for (int position = before; position < total; ++position) {
      host_staging_slots_.push_back((next + position / kCudaBlockTokens) * kCudaBlockTokens + position % kCudaBlockTokens);
    }
    next += int(blocks.size());
  }
  if (next > shape_.staging_blocks || host_staging_slots_.size() != host_step_slots_.size()) {
    return error("CUDA ZACK KV cache: the step's staging plan holds ", next, " blocks (of ", shape_.staging_blocks, ") and ",
                 host_staging_slots_.size(), " new tokens (the pool's: ", host_step_slots_.size(), ")");
  }
  SLIMKV_RETURN_IF_ERROR(staging_tables_.upload(host_staging_tables_.data(), host_staging_tables_.size()));
  return staging_slots_.upload(host_staging_slots_.data(), host_staging_slots_.size());
}

// On the legacy default stream, as the kernels: after the layer before's attention read the staging
// buffer, before this layer's new tokens are written into it.
Status CudaZackKvCache::stage(int layer) {
  const size_t elements = size_t(block_elements_[size_t(layer)]);
  const uint16_t* pool = pool_data_ + layer_offsets_[size_t(layer)];
  for (const StagingRun& run : staging_runs_) {
    SLIMKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging_.data() + size_t(run.staging_block) * elements,
                                                pool + size_t(run.pool_block) * elements,
                                                size_t(run.count) * elements * sizeof(uint16_t), cudaMemcpyHostToDevice, 0));
  }
  return Status::ok();
}

Expected<const uint16_t*> CudaZackKvCache::project_queries(int layer, const uint16_t* q) {
  return projection_->project_queries(layer, q, int(host_step_slots_.size()));
}

Status CudaZackKvCache::append(int layer, const uint16_t* k, const uint16_t* v) {
  const int n = int(host_step_slots_.size());
  if (n == 0) return Status::ok();
  SLIMKV_ASSIGN_OR_RETURN(const uint16_t* reduced, projection_->project_keys(layer, k, n));
  return write(layer, reduced, v);
}

Expected<const uint16_t*> CudaZackKvCache::append_and_project_queries(int layer, const uint16_t* q, const uint16_t* k,
                                                                      const uint16_t* v) {
  const int n = int(host_step_slots_.size());
  SLIMKV_ASSIGN_OR_RETURN(const ReducedQueriesAndKeys reduced, projection_->project_queries_and_keys(layer, q, k, n));
  if (n > 0) SLIMKV_RETURN_IF_ERROR(write(layer, reduced.k, v));
  return reduced.q;
}

Status CudaZackKvCache::write(int layer, const uint16_t* reduced_k, const uint16_t* v) {
  const int n = int(host_step_slots_.size());
  const size_t first = size_t(layer) * shape_.num_kv_heads;
  if (staged_) SLIMKV_RETURN_IF_ERROR(stage(layer));
  const auto write_slots = [&](const int* slots, uint16_t* blocks) -> Status {
    write_zack_slots_kernel<<<dim3(unsigned(n), unsigned(shape_.num_kv_heads)), shape_.head_dim>>>(
        reinterpret_cast<const __half*>(reduced_k), reinterpret_cast<const __half*>(v), slots, shape_.num_kv_heads,
        shape_.head_dim, heads_.data() + first, block_elements_[size_t(layer)], reinterpret_cast<__half*>(blocks));
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
    return Status::ok();
  };
  SLIMKV_RETURN_IF_ERROR(write_slots(step_slots_.data(), pool_data_ + layer_offsets_[size_t(layer)]));
  if (staged_) SLIMKV_RETURN_IF_ERROR(write_slots(staging_slots_.data(), staging_.data()));
  return Status::ok();
}

ZackKvView CudaZackKvCache::view(int layer) const {
  const ZackHeadLayout* heads = heads_.data() + size_t(layer) * shape_.num_kv_heads;
  if (on_host()) {
    return ZackKvView{staging_.data(), block_elements_[size_t(layer)], heads, staging_tables_.data(),
                      shape_.max_blocks_per_sequence, shape_.num_kv_heads};
  }
  return ZackKvView{pool_data_ + layer_offsets_[size_t(layer)], block_elements_[size_t(layer)], heads,
                    block_tables_.data(), shape_.max_blocks_per_sequence, shape_.num_kv_heads};
}

// Each layer's blocks gathered on the device into one packed buffer (sized for the widest layer, reused),
// then one copy to the host.
Status CudaZackKvCache::download_blocks(const std::vector<int>& block_ids,
                                        std::vector<std::vector<uint16_t>>& blocks) const {
  blocks.assign(size_t(shape_.num_layers), {});
  if (block_ids.empty()) return Status::ok();
  const size_t n = block_ids.size();
  SLIMKV_ASSIGN_OR_RETURN(auto packed, packed_layer_blocks(block_elements_, n));
  std::vector<uint64_t> in_pool, in_packed;
  for (int l = 0; l < shape_.num_layers; ++l) {
    const size_t elements = size_t(block_elements_[size_t(l)]);
    block_offsets(block_ids, elements * 2, in_pool, in_packed);
    SLIMKV_RETURN_IF_ERROR(copy_device_pieces(reinterpret_cast<uint8_t*>(packed.data()), in_packed,
                                              reinterpret_cast<const uint8_t*>(pool_data_ + layer_offsets_[size_t(l)]),
                                              in_pool, elements * 2));
    blocks[size_t(l)].resize(n * elements);
    SLIMKV_RETURN_IF_ERROR(packed.download(blocks[size_t(l)].data(), n * elements));
  }
  return Status::ok();
}

Status CudaZackKvCache::upload_blocks(const std::vector<int>& block_ids, const std::vector<std::vector<uint16_t>>& blocks) {
  if (blocks.size() != size_t(shape_.num_layers)) {
    return error("CUDA ZACK KV cache: blocks of ", blocks.size(), " layers to upload, expected ", shape_.num_layers);
  }
  if (block_ids.empty()) return Status::ok();
  const size_t n = block_ids.size();
  SLIMKV_ASSIGN_OR_RETURN(auto packed, packed_layer_blocks(block_elements_, n));
  std::vector<uint64_t> in_pool, in_packed;
  for (int l = 0; l < shape_.num_layers; ++l) {
    const size_t elements = size_t(block_elements_[size_t(l)]);
    if (blocks[size_t(l)].size() != n * elements) {
      return error("CUDA ZACK KV cache: layer ", l, " has ", blocks[size_t(l)].size(), " elements to upload, expected ",
                   n * elements, " (", n, " blocks of ", elements, ")");
    }
    SLIMKV_RETURN_IF_ERROR(packed.upload(blocks[size_t(l)].data(), n * elements));
    block_offsets(block_ids, elements * 2, in_pool, in_packed);
    SLIMKV_RETURN_IF_ERROR(copy_device_pieces(reinterpret_cast<uint8_t*>(pool_data_ + layer_offsets_[size_t(l)]), in_pool,
                                              reinterpret_cast<const uint8_t*>(packed.data()), in_packed, elements * 2));
  }
  return Status::ok();
}

}  // namespace slimkv::cuda
