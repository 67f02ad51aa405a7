#include "backend/cuda/ipc_memory.h"

#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"

namespace slimkv::cuda {
namespace {

// One block per piece; each thread moves `Word`s (the widest unit every piece's start and length allow).
template <typename Word>
__global__ void copy_pieces_kernel(const uint64_t* dst_addresses, const uint64_t* src_addresses, size_t piece_words) {
  const size_t piece = blockIdx.x;
  Word* to = reinterpret_cast<Word*>(dst_addresses[piece]);
  const Word* from = reinterpret_cast<const Word*>(src_addresses[piece]);
  for (size_t i = threadIdx.x; i < piece_words; i += blockDim.x) to[i] = from[i];
}

template <typename Word>
Status launch_copy_pieces(const uint64_t* dst_addresses, const uint64_t* src_addresses, size_t count, size_t piece_bytes) {
  copy_pieces_kernel<Word><<<unsigned(count), 256>>>(dst_addresses, src_addresses, piece_bytes / sizeof(Word));
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

}  // namespace

Expected<std::string> device_uuid(int gpu) {
  SLIMKV_RETURN_IF_ERROR(check_visible_gpu(gpu));
  cudaDeviceProp properties{};
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&properties, gpu));
  // nvidia-smi's spelling: GPU-8-4-4-4-12 hex digits.
  const auto* b = reinterpret_cast<const unsigned char*>(properties.uuid.bytes);
  char text[64];
  std::snprintf(text, sizeof(text), "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return std::string(text);
}

Expected<std::array<uint8_t, kIpcHandleBytes>> ipc_handle_of(const void* base, int gpu) {
  static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes, "cudaIpcMemHandle_t is 64 bytes");
  SLIMKV_RETURN_IF_ERROR(use_gpu(gpu));
  cudaIpcMemHandle_t handle{};
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&handle, const_cast<void*>(base)));
  std::array<uint8_t, kIpcHandleBytes> bytes{};
  std::memcpy(bytes.data(), &handle, kIpcHandleBytes);
  return bytes;
}

Expected<std::shared_ptr<void>> shared_device_allocation(size_t bytes, const char* what) {
  SLIMKV_ASSIGN_OR_RETURN(void* pointer, device_allocate(bytes == 0 ? 1 : bytes, what));
  return std::shared_ptr<void>(pointer, [gpu = current_device()](void* p) {
    // Freed on its own GPU: a free from a thread on another one would first make a context there. (A
    // context too broken to be chosen cannot free it either: nothing to report to a deleter's caller.)
    if (use_gpu(gpu)) device_free(p);
  });
}

Expected<std::shared_ptr<void>> shared_device_allocation_on(int gpu, size_t bytes, const char* what) {
  SLIMKV_RETURN_IF_ERROR(use_gpu(gpu));
  return shared_device_allocation(bytes, what);
}

Expected<std::shared_ptr<void>> copy_from_ipc_handle(const std::array<uint8_t, kIpcHandleBytes>& handle, uint64_t bytes,
                                                     int gpu) {
  SLIMKV_RETURN_IF_ERROR(use_gpu(gpu));
  SLIMKV_ASSIGN_OR_RETURN(std::shared_ptr<void> copy, shared_device_allocation(bytes, "KV blocks received over CUDA IPC"));
  if (bytes == 0) return copy;
  cudaIpcMemHandle_t ipc{};
  std::memcpy(&ipc, handle.data(), kIpcHandleBytes);
  void* mapped = nullptr;
  const cudaError_t opened = cudaIpcOpenMemHandle(&mapped, ipc, cudaIpcMemLazyEnablePeerAccess);
  if (opened != cudaSuccess) {
    cudaGetLastError();
    return error("opening the sender's CUDA IPC handle: ", cudaGetErrorName(opened), " (", cudaGetErrorString(opened),
                 "): is the sender's process on this GPU and alive?");
  }
  const cudaError_t copied = cudaMemcpy(copy.get(), mapped, bytes, cudaMemcpyDeviceToDevice);
  const cudaError_t closed = cudaIpcCloseMemHandle(mapped);
  SLIMKV_CUDA_RETURN_IF_ERROR(copied);
  SLIMKV_CUDA_RETURN_IF_ERROR(closed);
  return copy;
}

size_t piece_alignment(size_t piece_bytes, const uint64_t* addresses, size_t count) {
  uint64_t bits = piece_bytes;
  for (size_t i = 0; i < count; ++i) bits |= addresses[i];
  for (const size_t alignment : {16, 8, 4}) {
    if (bits % alignment == 0) return alignment;
  }
  return 1;
}

Status enqueue_piece_copies(const uint64_t* dst_addresses, const uint64_t* src_addresses, size_t count, size_t piece_bytes,
                            size_t alignment) {
  if (count == 0 || piece_bytes == 0) return Status::ok();
  if (count > 0x7fffffffu) return error("enqueue_piece_copies: ", count, " pieces in one launch");
  switch (alignment) {
    case 16:
      return launch_copy_pieces<uint4>(dst_addresses, src_addresses, count, piece_bytes);
    case 8:
      return launch_copy_pieces<uint2>(dst_addresses, src_addresses, count, piece_bytes);
    case 4:
      return launch_copy_pieces<uint32_t>(dst_addresses, src_addresses, count, piece_bytes);
    case 1:
      return launch_copy_pieces<uint8_t>(dst_addresses, src_addresses, count, piece_bytes);
  }
  return error("enqueue_piece_copies: alignment ", alignment, ", expected 1, 4, 8 or 16");
}

Status copy_device_pieces(uint8_t* dst, const std::vector<uint64_t>& dst_offsets, const uint8_t* src,
                          const std::vector<uint64_t>& src_offsets, size_t piece_bytes) {
  if (dst_offsets.size() != src_offsets.size()) {
    return error("copy_device_pieces: ", dst_offsets.size(), " destinations for ", src_offsets.size(), " sources");
  }
  if (dst_offsets.empty() || piece_bytes == 0) return Status::ok();
  // One upload of both address tables.
  const size_t count = dst_offsets.size();
  std::vector<uint64_t> addresses(2 * count);
  for (size_t i = 0; i < count; ++i) {
    addresses[i] = reinterpret_cast<uintptr_t>(dst) + dst_offsets[i];
    addresses[count + i] = reinterpret_cast<uintptr_t>(src) + src_offsets[i];
  }
  SLIMKV_ASSIGN_OR_RETURN(auto table, DeviceArray<uint64_t>::allocate(addresses.size(), "piece copy addresses"));
  SLIMKV_RETURN_IF_ERROR(table.upload(addresses.data(), addresses.size()));
  SLIMKV_RETURN_IF_ERROR(enqueue_piece_copies(table.data(), table.data() + count, count, piece_bytes,
                                              piece_alignment(piece_bytes, addresses.data(), addresses.size())));
  return device_synchronize("copying KV blocks on the device");
}

}  // namespace slimkv::cuda
