// The KV store on the GPU with the `dense` codec (ARCHITECTURE.md "paged KV store"): a pool of
// FP16 blocks of kCudaBlockTokens tokens preallocated once, and for every sequence a block table
// naming its blocks in order. A block index addresses the same slot of every layer's pool (one table
// serves all layers, as the tokens of a sequence are the same in each layer).
//
//   layer l pool, K (V alike): [num_blocks, num_kv_heads, kCudaBlockTokens, head_dim] FP16
//   block table of sequence s: [max_blocks_per_sequence] block indices (first num_blocks(s) used)
//
// A step appends tokens to several sequences at once (batched decode, or prefill chunks):
// begin_step() makes room and records each new token's slot, then append() writes one layer's new
// K/V, in begin_step's order, into those slots.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/pinned_memory.h"
#include "kv/cuda/sequence_blocks.h"

namespace slimkv::cuda {

struct CudaKvShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;                 // 16, 32, 64, 128 or 256 (the attention kernels' instantiations)
  int num_blocks = 0;               // the pool, shared by all sequences
  int max_sequences = 0;
  int max_blocks_per_sequence = 0;  // the longest context, in blocks
  int max_step_tokens = 0;          // tokens appended in one step, over all sequences
  // The pools in pinned host memory mapped into the GPU (`pq:...@offload`: kernels read only the tokens
  // they select, over PCIe); else GPU memory.
  bool host_memory = false;
};

class CudaPagedKvCache {
 public:
  static Expected<std::unique_ptr<CudaPagedKvCache>> create(const CudaKvShape& shape);

  const CudaKvShape& shape() const { return shape_; }

  // The sequences and their blocks (indices into the pool); a sequence's id indexes the block tables.
  SequenceBlocks& sequences() { return sequences_; }
  const SequenceBlocks& sequences() const { return sequences_; }

  // Makes room for new_tokens[i] more tokens of sequences[i] (taking blocks from the pool), records
  // the slot of each new token and uploads the tables. Errors when the pool or a table is full.
  Status begin_step(const std::vector<int>& sequences, const std::vector<int>& new_tokens);
  // Writes the step's new K/V of `layer`: k, v FP16 device arrays [step tokens, num_kv_heads, head_dim],
  // the tokens in begin_step's order (sequence by sequence).
  Status append(int layer, const uint16_t* k, const uint16_t* v);
  // The step's slots (device, begin_step's order) and how many: for writers other than append.
  const int* step_slots() const { return step_slots_.data(); }
  int step_tokens() const { return int(host_step_slots_.size()); }

  PagedKvView view(int layer) const;
  // Layer `layer`'s pools, writable (K, V alike: [num_blocks, num_kv_heads, kCudaBlockTokens, head_dim]
  // FP16): for whole blocks copied in on the device (GpuKvCache::import_pages), after begin_step grew
  // the sequence into them.
  uint16_t* layer_k(int layer) { return k_ + size_t(layer) * layer_elements(); }
  uint16_t* layer_v(int layer) { return v_ + size_t(layer) * layer_elements(); }

 private:
  explicit CudaPagedKvCache(const CudaKvShape& shape)
      : shape_(shape), sequences_(shape.num_blocks, shape.max_sequences, shape.max_blocks_per_sequence) {}
  size_t layer_elements() const;

  CudaKvShape shape_;
  DeviceArray<uint16_t> k_pool_, v_pool_;   // [num_layers] × layer_elements()
  PinnedArray<uint16_t> host_k_pool_, host_v_pool_;  // the same, host_memory
  uint16_t* k_ = nullptr;                   // the pools in use
  uint16_t* v_ = nullptr;
  DeviceArray<int> block_tables_;           // [max_sequences, max_blocks_per_sequence]
  DeviceArray<int> step_slots_;             // [max_step_tokens]: block index · kCudaBlockTokens + offset
  std::vector<int> host_block_tables_;
  std::vector<int> host_step_slots_;
  SequenceBlocks sequences_;
};

}  // namespace slimkv::cuda
