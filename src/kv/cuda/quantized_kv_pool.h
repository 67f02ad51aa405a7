// Sealed `hack` / `quant` KV blocks on the GPU (HACK §5.2–5.3, §6): per layer a pool
// [num_blocks, num_kv_heads, block_bytes] of blocks in exactly the CPU codec's byte layout
// (tensor/quantized_block.h), so a sequence moves between backends, and over the transfer format,
// unchanged. It is indexed by the block indices of the FP16 CudaPagedKvCache, which holds each
// sequence's open block (HACK's requantization elimination: the partial block is never quantized)
// and from which a block is sealed once full. (The FP16 pool is still allocated for every block:
// only the open blocks need it, which is left for when the engine runs quantized KV on the GPU.)
#pragma once

#include <cstdint>

#include "backend/cuda/device_memory.h"
#include "kv/cuda/paged_kv_cache.h"
#include "tensor/quantized_block.h"

namespace slimkv::cuda {

// A layout's size and section offsets as the kernels take them.
QuantizedBlockOffsets quantized_block_offsets(const QuantizedBlockLayout& layout);

// Where the heads of a layer's sealed blocks lie when their dims differ (ZACK's ranks): the head layouts
// (device [num_kv_heads]) and the bytes of a block of every head.
struct SealedHeadBlocks {
  const QuantizedHeadLayout* heads = nullptr;
  long long block_stride = 0;
};

// Seals full FP16 blocks of kCudaBlockTokens tokens into `hack` / `quant` blocks of config's bits and
// rounding, with the seeds block_seal_seed(seed, layer, head, block ordinal), as the CPU store seals
// them. The GPU kernels read the stored sums and keep the open block exact: store_sums and
// keep_open_exact must be on.
class QuantizedBlockSealer {
 public:
  static Expected<QuantizedBlockSealer> create(const QuantizationConfig& config, bool hack, uint64_t seed,
                                               int num_kv_heads, int head_dim);
  // Seals n blocks of `layer`: list (device) holds, per block, (its FP16 block in fp16, its block in
  // `blocks` [.., num_kv_heads, block_bytes], its ordinal in its sequence).
  Status seal(int layer, const PagedKvView& fp16, const int* list, int n, uint8_t* blocks) const;
  // A step's new K/V rows (FP16 [n, num_kv_heads, head_dim], device), their slots in the FP16 pool
  // (write_kv_slots's) and, per block to seal (list's order), (the offset in the block of its first
  // row of the step, that row): the block's tokens from that offset on are the step's next rows.
  struct StepRows {
    const uint16_t* k = nullptr;
    const uint16_t* v = nullptr;
    const int* slots = nullptr;
    int n = 0;
    const int* block_rows = nullptr;
  };
  // Writes the step's rows into fp16's pool and seals the n blocks of list in the same launch (HACK
  // quantizes the new KV as it is produced, §5.3): a block's rows of this step are quantized from
  // `rows`, the rest from the pool, so no kernel waits for another and the rows are read once.
  // heads: ZACK's heads at their own dims (quantized_kv_cache.h); none: every head the layout's.
  Status append_and_seal(int layer, const PagedKvView& fp16, const StepRows& rows, const int* list, int n, uint8_t* blocks,
                         const SealedHeadBlocks& heads = SealedHeadBlocks()) const;
  QuantizedKvView view(const uint8_t* blocks, const int* block_tables, int table_shift = 0) const;
  const QuantizedBlockLayout& layout() const { return layout_; }

 private:
  QuantizedBlockSealer(const QuantizedBlockLayout& layout, bool hack, uint64_t seed, int num_kv_heads)
      : layout_(layout), hack_(hack), seed_(seed), num_kv_heads_(num_kv_heads) {}
  QuantizedBlockLayout layout_;
  bool hack_;
  uint64_t seed_;
  int num_kv_heads_;
};

}  // namespace slimkv::cuda
