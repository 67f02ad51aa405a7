// A GPU KV cache's sequence in the transfer format (kv/transfer.h): the whole transfer in host memory
// (the TCP path: the cache's device pages gathered on the device, copied to the host a layer at a time
// and written as the transfer's blocks as they are), or with its sealed blocks left in GPU memory as
// those pages (a DeviceKvTransfer: the CUDA IPC path, docs/kv_stream_protocol.md). What the engine's
// CUDA device model and the transport benchmark (bench/cuda/bench_kv_transport_cuda.cc) share.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cuda/pinned_memory.h"
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

}  // namespace slimkv::cuda
