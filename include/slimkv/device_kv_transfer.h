// The KV of a sequence with its sealed blocks in GPU memory (Engine::export_kv_to_device,
// import_kv_from_device; kv/cuda/gpu_kv_transfer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace slimkv {

// A sequence's KV with its sealed blocks left in GPU memory (device "cuda", dense/hack/quant KV): what
// the KV stream's CUDA IPC path moves between two workers of one GPU (docs/kv_stream_protocol.md,
// "CUDA IPC"), device to device, never through host memory.
struct DeviceKvTransfer {
  // A transfer (docs/kv_transfer_format.md) of each layer's tokens after its last full block alone
  // (fewer than a block), as if they were a sequence of their own: checked as any transfer is.
  std::vector<uint8_t> open;
  int num_layers = 0;
  int sealed_blocks = 0;     // full blocks per layer before those tokens
  uint64_t page_bytes = 0;   // one block of every KV head, as the GPU cache stores it
  // [num_layers, sealed_blocks, page_bytes] in this process's GPU memory: an allocation of its own
  // (at least a byte), which CUDA IPC can share.
  std::shared_ptr<void> pages;
  uint64_t pages_bytes() const { return uint64_t(num_layers) * uint64_t(sealed_blocks) * page_bytes; }
};

}  // namespace slimkv
