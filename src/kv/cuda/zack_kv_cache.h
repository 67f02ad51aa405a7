// ZACK's KV on the GPU (ZACK §5.1–5.2): a paged pool whose blocks keep every (layer, KV head) at its own K
// and V ranks, and the projection of q and k onto each head's Q–K basis after RoPE.
//
//   layer l, block b: [block_elements(l)] FP16, KV head g at heads(l)[g] (kv_views.h ZackHeadLayout):
//                     K' dim-major [k_rank, 64], then V' dim-major [v_rank, 64]
//   block table of sequence s: [max_blocks_per_sequence] block indices, shared by every layer
//
// Blocks are all the same size, whatever the ranks, so one pool and one block table serve every layer
// and head, with no padding (a block holds exactly its heads' ranks).
// V arrives reduced already (the folded W_V, model/zack_projection.h, padded to head_dim with zeros):
// its first v_rank dims are stored. K is projected here: k' = B_g[:k_rank] · k.
//
// `@offload` (staging_blocks > 0): the pool lives in pinned host memory, and a step's append of each
// layer first copies the blocks the step's sequences held into a GPU staging buffer (one layer's, the
// copies on the stream the kernels run on), then writes the new tokens into both; attention reads the
// staging buffer through block tables naming its blocks. A step moves ZACK's bytes (the ranks'), not
// FP16's; the copies do not overlap the layer's compute yet.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "attention/cuda/kv_views.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/pinned_memory.h"
#include "kv/cuda/sequence_blocks.h"
#include "kv/cuda/zack_head_projection.h"

namespace slimkv::cuda {

struct ZackKvShape {
  int num_layers = 0;
  int num_heads = 0;     // query heads (project_queries)
  int num_kv_heads = 0;
  int head_dim = 0;      // even, at most 128
  int num_blocks = 0;
  int max_sequences = 0;
  int max_blocks_per_sequence = 0;
  int max_step_tokens = 0;
  std::vector<int> k_ranks, v_ranks;  // [num_layers · num_kv_heads], 1..head_dim
  // FP32, for each (layer, KV head) in order: its Q–K basis B_g[:k_rank] [k_rank, head_dim] (row-major).
  std::vector<float> qk_bases;
  // 0: the pool in GPU memory; > 0: in pinned host memory, with a GPU staging buffer of this many blocks
  // (of the widest layer) for the blocks of a step's sequences.
  int staging_blocks = 0;
};

class CudaZackKvCache {
 public:
  static Expected<std::unique_ptr<CudaZackKvCache>> create(const ZackKvShape& shape);
  // FP16 bytes of one block of every layer and head at these ranks (sizes the pool before creating it).
  static size_t block_bytes(const std::vector<int>& k_ranks, const std::vector<int>& v_ranks);

  const ZackKvShape& shape() const { return shape_; }
  SequenceBlocks& sequences() { return sequences_; }
  const SequenceBlocks& sequences() const { return sequences_; }
  bool on_host() const { return shape_.staging_blocks > 0; }
  size_t device_bytes() const { return pool_.bytes() + staging_.bytes(); }
  size_t host_bytes() const { return host_pool_.bytes(); }

  // As CudaPagedKvCache::begin_step: room for the new tokens, their slots, the tables uploaded. On the
  // host (`stage`): the staging buffer's blocks, tables and copies planned; without, append writes the
  // host pool only (contexts built without attention).
  Status begin_step(const std::vector<int>& sequences, const std::vector<int>& new_tokens, bool stage = true);
  // On the host: an error when the sequences, grown by new_tokens, hold more blocks than the staging
  // buffer (nothing on the GPU). Changes nothing.
  Status check_staging(const std::vector<int>& sequences, const std::vector<int>& new_tokens) const;
  // q FP16 [step tokens, num_heads, head_dim] after RoPE → each head's B_g[:k_rank] · q in the first
  // k_rank entries of the returned rows (device, same shape, the rest 0; valid until the next call).
  Expected<const uint16_t*> project_queries(int layer, const uint16_t* q);
  // Writes the step's k (FP16 [step tokens, num_kv_heads, head_dim] after RoPE, projected here) and v (the
  // folded W_V's: the first v_rank dims of each head) of `layer` into the step's slots. On the host, a
  // staged step first copies the layer's held blocks into the staging buffer, and the new tokens go to both.
  Status append(int layer, const uint16_t* k, const uint16_t* v);
  // append, and q's projection as project_queries gives it, both projections in one launch (a step's
  // attention: one kernel fewer a layer).
  Expected<const uint16_t*> append_and_project_queries(int layer, const uint16_t* q, const uint16_t* k, const uint16_t* v);

  ZackKvView view(int layer) const;

  // Moving a sequence out and in (GpuZackKv::export_sequence, import_sequence). The pool's layout of a
  // (layer, KV head), and a layer's block in FP16 elements:
  const ZackHeadLayout& head_layout(int layer, int head) const {
    return host_heads_[size_t(layer) * size_t(shape_.num_kv_heads) + size_t(head)];
  }
  long long block_elements(int layer) const { return block_elements_[size_t(layer)]; }
  // Blocks `block_ids` of every layer as the pool holds them, into host blocks[l] [block_ids.size(),
  // block_elements(l)] (one gather on the device and one copy per layer; waits for the copies).
  Status download_blocks(const std::vector<int>& block_ids, std::vector<std::vector<uint16_t>>& blocks) const;
  // The reverse: blocks[l] [block_ids.size(), block_elements(l)] into those blocks of every layer.
  Status upload_blocks(const std::vector<int>& block_ids, const std::vector<std::vector<uint16_t>>& blocks);

 private:
  explicit CudaZackKvCache(const ZackKvShape& shape)
      : shape_(shape), sequences_(shape.num_blocks, shape.max_sequences, shape.max_blocks_per_sequence) {}

  // Pool blocks [pool_block, + count) copied to staging blocks [staging_block, + count), in every layer.
  struct StagingRun {
    int pool_block = 0, staging_block = 0, count = 0;
  };
  // The step's staging (on the host): its block tables, the new tokens' slots and the held blocks' copies.
  Status plan_staging(const std::vector<int>& sequences, const std::vector<int>& new_tokens);
  Status stage(int layer);
  // append's writes of the projected keys and v into the step's slots (and, staged, the staging buffer's).
  Status write(int layer, const uint16_t* reduced_k, const uint16_t* v);

  ZackKvShape shape_;
  std::vector<ZackHeadLayout> host_heads_;   // [num_layers, num_kv_heads]
  std::vector<long long> block_elements_;    // [num_layers]
  std::vector<size_t> layer_offsets_;        // [num_layers]: elements before the layer's region of the pool
  DeviceArray<uint16_t> pool_;               // in GPU memory, or empty
  PinnedArray<uint16_t> host_pool_;          // on the host (mapped: kernels write it through its pointer), or empty
  uint16_t* pool_data_ = nullptr;            // whichever of the two holds the pool
  DeviceArray<uint16_t> staging_;            // on the host: [staging_blocks, the widest block_elements]
  DeviceArray<int> staging_tables_;          // [max_sequences, max_blocks_per_sequence]: staging blocks
  DeviceArray<int> staging_slots_;           // [max_step_tokens]: the new tokens' slots in staging
  std::vector<int> host_staging_tables_, host_staging_slots_;
  std::vector<StagingRun> staging_runs_;
  bool staged_ = false;                      // the step begun copies and writes the staging buffer
  DeviceArray<ZackHeadLayout> heads_;
  DeviceArray<int> block_tables_;            // [max_sequences, max_blocks_per_sequence]
  DeviceArray<int> step_slots_;              // [max_step_tokens]
  std::unique_ptr<CudaZackHeadProjection> projection_;  // q and k onto the heads' bases
  std::vector<int> host_block_tables_, host_step_slots_;
  SequenceBlocks sequences_;
};

}  // namespace slimkv::cuda
