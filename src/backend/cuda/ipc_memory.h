// Device memory shared between processes of one GPU (CUDA IPC: cudaIpcGetMemHandle /
// cudaIpcOpenMemHandle), and device-to-device copies of many equal pieces, behind a header that needs no
// CUDA headers. The KV stream's CUDA IPC path (docs/kv_stream_protocol.md, "CUDA IPC") is built on it:
// a prefill worker shares a sequence's sealed blocks, a decode worker copies them into its own memory.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "slimkv/status.h"

namespace slimkv::cuda {

// Visible GPU `gpu`'s UUID ("GPU-" and hex digits, as nvidia-smi -L prints it): two processes that report
// the same one share a GPU, and CUDA IPC can join them (whatever index each gives it).
Expected<std::string> device_uuid(int gpu);

// A handle (cudaIpcMemHandle_t, 64 opaque bytes) another process of the same GPU opens to reach the
// allocation `base` on visible GPU `gpu` (a device_allocate result, never an address inside one).
inline constexpr size_t kIpcHandleBytes = 64;
Expected<std::array<uint8_t, kIpcHandleBytes>> ipc_handle_of(const void* base, int gpu);

// Opens `handle` (of another process), copies its first `bytes` into a new allocation of this process
// on visible GPU `gpu`, closes the handle again and returns the copy (freed when the last owner lets
// go). The copy is device to device: nothing passes through host memory.
Expected<std::shared_ptr<void>> copy_from_ipc_handle(const std::array<uint8_t, kIpcHandleBytes>& handle, uint64_t bytes,
                                                     int gpu);

// An owned allocation on the calling thread's current GPU as a shared_ptr, freed on that GPU when the
// last owner lets go, whichever thread that is.
Expected<std::shared_ptr<void>> shared_device_allocation(size_t bytes, const char* what);
// The same on visible GPU `gpu` (a thread of the KV stream's receiver, which chose none).
Expected<std::shared_ptr<void>> shared_device_allocation_on(int gpu, size_t bytes, const char* what);

// dst + dst_offsets[i] ← src + src_offsets[i], piece_bytes each, for every i, device to device in one
// kernel (a sequence's blocks lie where its block table says, not in a row). Offsets: host arrays of
// equal length; pieces must not overlap. Waits for the copy.
Status copy_device_pieces(uint8_t* dst, const std::vector<uint64_t>& dst_offsets, const uint8_t* src,
                          const std::vector<uint64_t>& src_offsets, size_t piece_bytes);

// The same enqueued on the calling thread's stream without waiting (the caller orders and waits by
// events): piece i from src_addresses[i] to dst_addresses[i], `count` pieces of piece_bytes, addresses
// of device memory or of mapped pinned host memory (kernels reach both by the same pointers), the two
// tables themselves in memory the device reads. `alignment`: piece_alignment of the pieces.
Status enqueue_piece_copies(const uint64_t* dst_addresses, const uint64_t* src_addresses, size_t count, size_t piece_bytes,
                            size_t alignment);
// The widest word (16, 8, 4 or 1 bytes) that piece_bytes and every address are multiples of.
size_t piece_alignment(size_t piece_bytes, const uint64_t* addresses, size_t count);

}  // namespace slimkv::cuda
