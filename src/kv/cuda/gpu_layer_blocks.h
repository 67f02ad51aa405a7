// A streamed sequence's sealed blocks handed out layer by layer while a step runs (the GPU's side of
// Engine::stream_sealed_kv, docs/disaggregated.md): right after a layer's attention is enqueued, one
// kernel a page part copies that layer's new blocks from the cache's pools, and an event marks the
// copy's end; a sender waits for that event alone, so the later layers keep computing while the layer's
// blocks travel. The copies go straight into pinned host memory in the transfer format's order (each KV
// head's blocks in a row: write_kv_transfer_blocks's bytes, for a TCP stream), or into GPU memory as
// pages (GpuKvCache::device_page_layout, for NCCL).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/pinned_memory.h"
#include "backend/cuda/reused_arrays.h"
#include "kv/cuda/gpu_kv_cache.h"
#include "slimkv/device_kv_transfer.h"
#include "slimkv/status.h"

namespace slimkv::cuda {

using PinnedPool = ReusedArrays<PinnedArray<uint8_t>>;
using DevicePool = ReusedArrays<DeviceArray<uint8_t>>;

class GpuLayerBlocks {
 public:
  // Blocks [first_block, end_block) of `sequence` in every layer of `kv` (a cache with device pages), for
  // the step under way: called after the cache's begin_step gave the sequence its blocks, before the
  // first layer's enqueue(). Host memory (the copies' address tables, and the blocks unless `device`)
  // comes from `pinned`; with `device`, the blocks go to GPU memory from it. `held_bytes` counts the
  // blocks' memory while this lives.
  static Expected<std::shared_ptr<GpuLayerBlocks>> create(const GpuKvCache& kv, int sequence, int first_block, int end_block,
                                                          PinnedPool& pinned, DevicePool* device,
                                                          std::shared_ptr<std::atomic<uint64_t>> held_bytes);
  ~GpuLayerBlocks();
  GpuLayerBlocks(const GpuLayerBlocks&) = delete;
  GpuLayerBlocks& operator=(const GpuLayerBlocks&) = delete;

  // On the step's thread, once the layer's attention is enqueued: the layer's copies, then its event.
  Status enqueue(int layer);
  // From any thread, after enqueue(layer): waits until the layer's blocks are in place.
  Status wait(int layer) const;
  // The layer's blocks (read after wait(layer)): in the transfer format in host memory (without
  // `device`), or as pages in GPU memory (with it; a transfer of one layer, no open tokens).
  std::span<const uint8_t> layer_bytes(int layer) const;
  std::shared_ptr<const DeviceKvTransfer> layer_pages(int layer) const;
  int first_block() const { return first_block_; }

 private:
  GpuLayerBlocks() = default;
  struct PartCopies {  // one launch: a layer's pieces of one page part
    size_t first_piece = 0, count = 0, piece_bytes = 0, alignment = 1;
  };
  int gpu_ = 0;
  int first_block_ = 0, blocks_ = 0;
  size_t page_bytes_ = 0;
  std::shared_ptr<PinnedArray<uint8_t>> host_;      // [destination addresses][source addresses][blocks, on the host]
  std::shared_ptr<DeviceArray<uint8_t>> on_device_;  // the blocks, with `device`
  const uint64_t* dst_addresses_ = nullptr;
  const uint64_t* src_addresses_ = nullptr;
  const uint8_t* data_ = nullptr;  // the layers' blocks, wherever they go
  size_t layer_data_bytes_ = 0;
  std::vector<std::vector<PartCopies>> copies_;  // per layer
  std::vector<void*> events_;                    // per layer (cudaEvent_t)
  std::shared_ptr<std::atomic<uint64_t>> held_bytes_;
};

}  // namespace slimkv::cuda
