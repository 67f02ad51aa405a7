#include "backend/cuda/pinned_memory.h"

#include <cuda_runtime.h>
#include <unistd.h>

namespace slimkv::cuda {

Expected<void*> pinned_allocate(size_t bytes, const char* what) {
  const double physical_bytes = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (double(bytes) > physical_bytes) {
    return error("pinning ", bytes, " bytes of host memory for ", what, ": more than this machine's ",
                 size_t(physical_bytes), " bytes of RAM");
  }
  void* pointer = nullptr;
  const cudaError_t status = cudaHostAlloc(&pointer, bytes, cudaHostAllocMapped);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return error("pinning ", bytes, " bytes of host memory for ", what, ": ", cudaGetErrorString(status));
  }
  return pointer;
}

void pinned_free(void* pointer) {
  if (pointer != nullptr) cudaFreeHost(pointer);
}

Expected<std::shared_ptr<PinnedArray<uint8_t>>> PinnedPool::take(size_t bytes, const char* what) {
  PinnedArray<uint8_t> buffer;
  {
    const std::lock_guard lock(mutex_);
    // The smallest free one that holds `bytes`; none: a new one.
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->size() >= bytes && (best == free_.end() || it->size() < best->size())) best = it;
    }
    if (best != free_.end()) {
      buffer = std::move(*best);
      free_.erase(best);
    }
  }
  if (buffer.size() < bytes) {
    SLIMKV_ASSIGN_OR_RETURN(buffer, PinnedArray<uint8_t>::allocate(bytes, what));
  }
  auto held = new PinnedArray<uint8_t>(std::move(buffer));
  return std::shared_ptr<PinnedArray<uint8_t>>(held, [pool = shared_from_this()](PinnedArray<uint8_t>* given_back) {
    {
      const std::lock_guard lock(pool->mutex_);
      pool->free_.push_back(std::move(*given_back));
    }
    delete given_back;
  });
}

}  // namespace slimkv::cuda
