// The KV store on the GPU with the `hack` codec or the `quant` baseline (HACK §5.2–5.3): every full
// block of kCudaBlockTokens tokens is sealed into a pool of quantized blocks (the CPU codec's byte
// layout, kv/cuda/quantized_kv_pool.h), and FP16 is kept only for what is not sealed yet: each
// sequence's open block (HACK's requantization elimination) and, during a step, the blocks the step
// fills. So the KV's GPU memory is the sealed bytes (≈ 0.14 of FP16's at 2 bits) plus a small FP16
// pool whose size depends on the step, not the context:
//
//   sealed pool (layer l): [sealed blocks, num_kv_heads, block_bytes]; sequence s's block j at
//       sealed_tables[s][j] (one is reserved for the open block, so that sealing it needs no block)
//   FP16 window pool (a CudaPagedKvCache): blocks j >= floor(tokens held before the step / 64) of each
//       sequence; older ones are given back at the next step (they are sealed by then)
//
// A step: begin_step(sequences, new_tokens) gives back the FP16 blocks that are sealed, makes room in
// both pools and plans which blocks the step fills; append(layer, k, v) writes the new K/V into the
// FP16 window and seals the blocks they fill. Attention then reads sealed blocks for what lies before
// the step (decode: before the open block) and the FP16 window for the rest (prefill=exact: a prefill
// step's queries read their own tokens as computed, attention/cuda/paged_attention.h).
//
// shape.host_memory (`pq:...+hack@offload`, gpu_pq_kv.cc): the sealed pool in pinned host memory mapped
// into the GPU, of which a selection reads only its tokens' codes and scales over PCIe; the FP16 window
// stays in GPU memory.
//
// ZACK followed by the codec (zack:...+hack / +quant, gpu_zack_quantized_kv.cc): every (layer, KV head)
// has its own K and V dims (its ranks), given as HeadDims. A sealed block of a layer then holds each
// head's block at the head's dims, back to back (QuantizedHeadLayout), so no dim beyond a head's rank is
// stored sealed (the layout's own sections round to 64 bytes); the FP16 window keeps head_dim-wide rows
// whose dims past the ranks are zero (it holds a step's and the open blocks' tokens only).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "kv/cuda/paged_kv_cache.h"
#include "kv/cuda/quantized_kv_pool.h"

namespace slimkv::cuda {

// Each (layer, KV head)'s K and V dims, [num_layers · num_kv_heads] each, multiples of 4 up to head_dim
// (ZACK's ranks); empty: every head head_dim wide.
struct HeadDims {
  std::vector<int> k_dims, v_dims;
  bool empty() const { return k_dims.empty(); }
};

class CudaQuantizedKvCache {
 public:
  // shape.num_blocks sealed blocks; the FP16 window pool takes window_blocks(shape) blocks.
  static Expected<std::unique_ptr<CudaQuantizedKvCache>> create(const CudaKvShape& shape, const QuantizationConfig& config,
                                                                bool hack, uint64_t seed, const HeadDims& dims = {});
  // FP16 blocks that hold every window: a step of n_i new tokens of sequence i spans at most
  // floor(n_i / 64) + 2 blocks from the block it starts in, and every other sequence keeps one.
  static int window_blocks(const CudaKvShape& shape) {
    return shape.max_step_tokens / kCudaBlockTokens + 2 * shape.max_sequences;
  }
  // GPU bytes of one sealed block of every layer and KV head, for sizing the pool.
  static Expected<size_t> sealed_block_bytes(const CudaKvShape& shape, const QuantizationConfig& config,
                                             const HeadDims& dims = {});

  const CudaKvShape& shape() const { return shape_; }
  // The sequences (ids, tokens) and their sealed blocks.
  const SequenceBlocks& sequences() const { return sealed_; }
  Expected<int> add_sequence();
  void remove_sequence(int sequence);

  // An error naming the pool that cannot hold new_tokens[i] more tokens of sequences[i] (begin_step's
  // check, changing nothing).
  Status check_step(const std::vector<int>& sequences, const std::vector<int>& new_tokens) const;
  Status begin_step(const std::vector<int>& sequences, const std::vector<int>& new_tokens);
  // Writes the step's new K/V of `layer` (FP16 [step tokens, num_kv_heads, head_dim], begin_step's
  // order) and seals the blocks they fill, in one launch (QuantizedBlockSealer::append_and_seal).
  Status append(int layer, const uint16_t* k, const uint16_t* v);

  // Restoring a sequence (GpuKvCache::import_sequence; heads of one size only): the empty `sequence` takes `blocks` full sealed
  // blocks, sealed [num_layers, blocks, num_kv_heads, block_bytes] (host; device memory when `on_device`:
  // the CUDA IPC path, copied in one kernel), with no FP16 behind them; its open tokens then come by
  // begin_step and append, as new tokens do.
  Status restore_sealed(int sequence, int blocks, const uint8_t* sealed, bool on_device = false);

  PagedKvView view(int layer) const { return window_->view(layer); }
  // The FP16 window's blocks of each sequence (those before the open block given back: kReleased).
  const SequenceBlocks& window_sequences() const { return window_->sequences(); }
  QuantizedKvView sealed_view(int layer) const;
  const QuantizedBlockLayout& layout() const { return sealer_.layout(); }
  size_t bytes() const;  // GPU memory of both pools (the window's alone with shape.host_memory)
  size_t host_bytes() const { return host_pool_.bytes(); }

 private:
  CudaQuantizedKvCache(const CudaKvShape& shape, const QuantizedBlockSealer& sealer)
      : shape_(shape), sealer_(sealer), sealed_(shape.num_blocks, shape.max_sequences, shape.max_blocks_per_sequence) {}
  // Bytes of one sealed block of every KV head of `layer`, and where the layer's pool starts.
  size_t block_stride(int layer) const {
    return heads_differ() ? block_strides_[size_t(layer)] : size_t(shape_.num_kv_heads) * sealer_.layout().block_bytes;
  }
  size_t layer_offset(int layer) const { return heads_differ() ? layer_offsets_[size_t(layer)] : size_t(layer) * layer_bytes(); }
  size_t layer_bytes() const { return size_t(shape_.num_blocks) * shape_.num_kv_heads * sealer_.layout().block_bytes; }
  bool heads_differ() const { return !block_strides_.empty(); }
  // HeadDims: each head's layout (head_layouts_), the layers' block strides and offsets in the pool.
  Status lay_out_heads(const QuantizationConfig& config, const HeadDims& dims);
  // FP16 blocks the window pool would need for the step beyond what it holds, after giving back the sealed ones.
  int window_blocks_to_grow(const std::vector<int>& sequences, const std::vector<int>& new_tokens) const;

  CudaKvShape shape_;
  QuantizedBlockSealer sealer_;
  SequenceBlocks sealed_;
  std::unique_ptr<CudaPagedKvCache> window_;  // the FP16 blocks not sealed yet (same sequence ids)
  DeviceArray<uint8_t> pool_;                 // [num_layers, num_blocks, num_kv_heads, block_bytes]
  PinnedArray<uint8_t> host_pool_;            // the same, shape.host_memory
  uint8_t* pool_data_ = nullptr;              // the pool in use
  DeviceArray<int> sealed_tables_;            // [max_sequences, max_blocks_per_sequence]
  std::vector<int> host_sealed_tables_;
  // The step's blocks to seal: (FP16 block, sealed block, ordinal in its sequence); the same in every layer.
  DeviceArray<int> seal_list_;
  DeviceArray<int> block_rows_;  // per block to seal: (offset of its first step row, that row)
  int seal_count_ = 0;
  // HeadDims (none: every head the sealer's layout): [num_layers, num_kv_heads] head layouts, and per layer
  // the bytes of a block of every head and the layer's first byte in the pool.
  DeviceArray<QuantizedHeadLayout> head_layouts_;
  std::vector<size_t> block_strides_, layer_offsets_;
  int max_head_block_bytes_ = 0;
};

}  // namespace slimkv::cuda
