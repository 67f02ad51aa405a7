#include "backend/cuda/paged_kv_cache.h"

#include <cuda_fp16.h>

#include <utility>

#include "backend/cuda/cuda_check.h"

namespace slimkv::cuda {
namespace {

// One thread per 16 bytes (8 halves) of a token's head: k/v [n_tokens, num_kv_heads, head_dim] go to
// slot slots[token] of the pool [num_blocks, num_kv_heads, kCudaBlockTokens, head_dim].
__global__ void write_kv_slots(const uint4* k, const uint4* v, const int* slots, int n_tokens, int num_kv_heads,
                               int vectors_per_head, uint4* k_pool, uint4* v_pool) {
  const long long index = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  const long long total = (long long)n_tokens * num_kv_heads * vectors_per_head;
  if (index >= total) return;
  const int vector = int(index % vectors_per_head);
  const int head = int(index / vectors_per_head % num_kv_heads);
  const int token = int(index / vectors_per_head / num_kv_heads);
  const int slot = slots[token];
  const int block = slot / kCudaBlockTokens, offset = slot % kCudaBlockTokens;
  const size_t destination = ((size_t(block) * num_kv_heads + head) * kCudaBlockTokens + offset) * vectors_per_head + vector;
  k_pool[destination] = k[index];
  v_pool[destination] = v[index];
}

}  // namespace

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
  SLIMKV_ASSIGN_OR_RETURN(cache->k_pool_, DeviceArray<uint16_t>::allocate(pool_elements, "the K block pool"));
  SLIMKV_ASSIGN_OR_RETURN(cache->v_pool_, DeviceArray<uint16_t>::allocate(pool_elements, "the V block pool"));
  const size_t table_entries = size_t(shape.max_sequences) * shape.max_blocks_per_sequence;
  SLIMKV_ASSIGN_OR_RETURN(cache->block_tables_, DeviceArray<int>::allocate(table_entries, "the block tables"));
  SLIMKV_ASSIGN_OR_RETURN(cache->step_slots_, DeviceArray<int>::allocate(size_t(shape.max_step_tokens), "the step's slots"));
  cache->host_block_tables_.assign(table_entries, 0);  // unused entries point at block 0: never read
  SLIMKV_RETURN_IF_ERROR(cache->block_tables_.upload(cache->host_block_tables_.data(), table_entries));
  cache->sequences_.resize(size_t(shape.max_sequences));
  for (int block = shape.num_blocks - 1; block >= 0; --block) cache->free_blocks_.push_back(block);
  return Expected<std::unique_ptr<CudaPagedKvCache>>(std::move(cache));
}

Expected<int> CudaPagedKvCache::add_sequence() {
  for (size_t id = 0; id < sequences_.size(); ++id) {
    if (!sequences_[id].live) {
      sequences_[id] = Sequence{true, 0, {}};
      return int(id);
    }
  }
  return error("CUDA KV cache: all ", shape_.max_sequences, " sequence slots are in use");
}

void CudaPagedKvCache::remove_sequence(int sequence) {
  Sequence& s = sequences_[size_t(sequence)];
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) free_blocks_.push_back(*it);
  s = Sequence{};
}

Status CudaPagedKvCache::begin_step(const std::vector<int>& sequences, const std::vector<int>& new_tokens) {
  if (sequences.size() != new_tokens.size()) {
    return error("CUDA KV cache step: ", sequences.size(), " sequences but ", new_tokens.size(), " token counts");
  }
  host_step_slots_.clear();
  for (size_t i = 0; i < sequences.size(); ++i) {
    if (sequences[i] < 0 || sequences[i] >= shape_.max_sequences || !sequences_[size_t(sequences[i])].live) {
      return error("CUDA KV cache step: sequence ", sequences[i], " does not exist");
    }
    Sequence& s = sequences_[size_t(sequences[i])];
    const int total = s.num_tokens + new_tokens[i];
    const int blocks_needed = (total + kCudaBlockTokens - 1) / kCudaBlockTokens;
    if (blocks_needed > shape_.max_blocks_per_sequence) {
      return error("CUDA KV cache step: sequence ", sequences[i], " would hold ", total, " tokens, over the ",
                   shape_.max_blocks_per_sequence * kCudaBlockTokens, " its block table allows");
    }
    while (int(s.blocks.size()) < blocks_needed) {
      if (free_blocks_.empty()) return error("CUDA KV cache step: the pool's ", shape_.num_blocks, " blocks are all in use");
      s.blocks.push_back(free_blocks_.back());
      free_blocks_.pop_back();
      host_block_tables_[size_t(sequences[i]) * shape_.max_blocks_per_sequence + s.blocks.size() - 1] = s.blocks.back();
    }
    for (int position = s.num_tokens; position < total; ++position) {
      host_step_slots_.push_back(s.blocks[size_t(position / kCudaBlockTokens)] * kCudaBlockTokens +
                                 position % kCudaBlockTokens);
    }
    s.num_tokens = total;
  }
  if (int(host_step_slots_.size()) > shape_.max_step_tokens) {
    return error("CUDA KV cache step: ", host_step_slots_.size(), " new tokens, over max_step_tokens ",
                 shape_.max_step_tokens);
  }
  SLIMKV_RETURN_IF_ERROR(block_tables_.upload(host_block_tables_.data(), host_block_tables_.size()));
  return step_slots_.upload(host_step_slots_.data(), host_step_slots_.size());
}

Status CudaPagedKvCache::append(int layer, const uint16_t* k, const uint16_t* v) {
  const int n_tokens = int(host_step_slots_.size());
  if (n_tokens == 0) return Status::ok();
  const int vectors_per_head = shape_.head_dim / 8;
  const long long total = (long long)n_tokens * shape_.num_kv_heads * vectors_per_head;
  const int threads = 256;
  const size_t offset = size_t(layer) * layer_elements();
  write_kv_slots<<<unsigned((total + threads - 1) / threads), threads>>>(
      reinterpret_cast<const uint4*>(k), reinterpret_cast<const uint4*>(v), step_slots_.data(), n_tokens,
      shape_.num_kv_heads, vectors_per_head, reinterpret_cast<uint4*>(k_pool_.data() + offset),
      reinterpret_cast<uint4*>(v_pool_.data() + offset));
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

PagedKvView CudaPagedKvCache::view(int layer) const {
  const size_t offset = size_t(layer) * layer_elements();
  return PagedKvView{k_pool_.data() + offset, v_pool_.data() + offset, block_tables_.data(),
                     shape_.max_blocks_per_sequence, shape_.num_kv_heads, shape_.head_dim};
}

}  // namespace slimkv::cuda
