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

}  // namespace slimkv::cuda
