// A GPU KV cache's sequence in the transfer format (kv/transfer.h): the whole transfer in host memory
// (the TCP path: the cache's device pages gathered on the device, copied to the host a layer at a time
// and written as the transfer's blocks as they are), or with its sealed blocks left in GPU memory as
// those pages (a DeviceKvTransfer: the CUDA IPC path, docs/kv_stream_protocol.md). What the engine's
// CUDA device model and the transport benchmark (bench/cuda/bench_kv_transport_cuda.cc) share.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cuda/pinned_memory.h"
#include "backend/cuda/reused_arrays.h"
#include "kv/cuda/gpu_kv_cache.h"
#include "kv/kv_factory.h"
#include "kv/store.h"
#include "slimkv/device_kv_transfer.h"
#include "slimkv/status.h"

namespace slimkv::cuda {

// What the host stores of one sequence are made as, and whose KV it is.
struct GpuKvTransferContext {
  KvShape shape;         // of a host store of one sequence (the model's layers, KV heads, dims, context)
  KvPipeline pipeline;   // as the GPU runs it (kv_description)
  std::string model_id;
  // A layer's pinned host staging kept across transfers (grown when a layer needs more): pinning
  // gigabytes is a driver call per transfer otherwise. nullptr: one per transfer. Used by one thread at
  // a time (the device model's).
  PinnedArray<uint8_t>* staging = nullptr;
};

// Whether a transfer (its head: `info`) has the layout a GPU cache's sequence holds: one token count
// in every layer, in blocks of kCudaBlockTokens; else an error naming `source` and the counts.
Status check_gpu_transfer_layout(const KvTransferInfo& info, std::string_view source);

// export_kv / import_kv: the sequence's transfer in host memory (a host tier's through a host store).
Status export_transfer(const GpuKvCache& kv, int sequence, const GpuKvTransferContext& context, std::vector<uint8_t>& out);
// received_crc: as read_kv_transfer's (the CRC its receiver computed as the bytes arrived), or absent.
Status import_transfer(GpuKvCache& kv, int sequence, const GpuKvTransferContext& context,
                       std::span<const uint8_t> transfer, std::string_view source,
                       std::optional<uint32_t> received_crc = std::nullopt);

// export_kv_to_device / import_kv_from_device: the sealed blocks copied device to device into (from)
// a DeviceKvTransfer's pages, the open tokens through a small transfer of their own (without `pages`:
// the layout and open tokens alone). The import checks that transfer as import_transfer would (model,
// spec, shape, CRC) and the pages' declared layout against this cache's before it takes anything.
Status export_to_device(const GpuKvCache& kv, int sequence, const GpuKvTransferContext& context, DeviceKvTransfer& out,
                        bool pages = true);
Status import_from_device(GpuKvCache& kv, int sequence, const GpuKvTransferContext& context,
                          const DeviceKvTransfer& transfer, std::string_view source);

// A transfer's sealed blocks uploaded into GPU memory as a cache's device pages a layer at a time, as
// its layers arrive (the GPU's placement of a staged import, engine/kv_staging.h): each layer laid out
// as pages in pinned memory (copy_kv_store_pages) and copied up on a stream of its own, never the
// steps' (so a decode worker's running batch is not held up); two pinned layers alternate, so that
// laying out one overlaps the upload of the other. Used by one thread at a time (a stream's receiver).
class LayerPagesUpload {
 public:
  // [num_layers, blocks, layout.page_bytes] of GPU memory on the calling thread's GPU (an error naming
  // the bytes when it has no room), and two pinned layers from `pinned` (kept there for the next).
  static Expected<std::unique_ptr<LayerPagesUpload>> create(const KvPageLayout& layout, int num_layers, int blocks,
                                                           ReusedArrays<PinnedArray<uint8_t>>& pinned);
  ~LayerPagesUpload();  // waits for the uploads in flight before their memory goes
  LayerPagesUpload(const LayerPagesUpload&) = delete;
  LayerPagesUpload& operator=(const LayerPagesUpload&) = delete;

  // Layer `layer`'s sealed blocks [first_block, first_block + count) of `store`, within the layer's
  // blocks: laid out (once the upload that last used the pinned buffer has finished) and their upload
  // enqueued; returns without waiting for it.
  Status upload(int layer, int first_block, int count, const KvStore& store);
  // Waits for every upload: the pages (GpuKvCache::export_pages's layout), as DeviceKvTransfer::pages.
  Expected<std::shared_ptr<void>> finish();
  size_t pages_bytes() const { return size_t(num_layers_) * layer_bytes_; }

 private:
  LayerPagesUpload() = default;
  int gpu_ = 0;
  KvPageLayout layout_;
  int num_layers_ = 0, blocks_ = 0;
  size_t layer_bytes_ = 0;
  std::shared_ptr<void> pages_;
  std::shared_ptr<PinnedArray<uint8_t>> pinned_[2];
  void* uploaded_[2] = {nullptr, nullptr};  // cudaEvent_t: each pinned layer's last upload done
  void* stream_ = nullptr;                  // cudaStream_t, non-blocking
  int next_ = 0;                            // the pinned layer the next upload uses
};

}  // namespace slimkv::cuda
