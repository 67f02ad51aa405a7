#include "backend/cuda/pinned_memory.h"

#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

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

const char* host_page_size_name(HostPageSize pages) {
  switch (pages) {
    case HostPageSize::k4K: return "4K";
    case HostPageSize::kTransparentHuge: return "thp";
    case HostPageSize::kHugeTlb: return "hugetlb";
  }
  return "?";
}

Expected<RegisteredHostMemory> RegisteredHostMemory::allocate(size_t bytes, HostPageSize pages, const char* what) {
  constexpr size_t kHuge = size_t(2) << 20;
  const auto failed = [&](const char* step, const std::string& reason) {
    return error("pinning ", bytes, " bytes of host memory on ", host_page_size_name(pages), " pages for ", what,
                 ": ", step, ": ", reason);
  };
  RegisteredHostMemory memory;
  if (bytes == 0) return Expected<RegisteredHostMemory>(std::move(memory));
  memory.bytes_ = bytes;
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  // THP backs only 2 MB-aligned ranges and mmap aligns to 4 KB: map 2 MB more and start at a 2 MB boundary.
  const bool hugetlb = pages == HostPageSize::kHugeTlb;
  memory.mapping_bytes_ = hugetlb ? rounded : rounded + kHuge;
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (hugetlb ? MAP_HUGETLB : 0);
  void* mapping = mmap(nullptr, memory.mapping_bytes_, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (mapping == MAP_FAILED) {
    return failed("mmap", str_cat(std::strerror(errno), hugetlb ? " (are 2 MB pages reserved? vm.nr_hugepages)" : ""));
  }
  memory.mapping_ = mapping;
  const uintptr_t start = (reinterpret_cast<uintptr_t>(mapping) + kHuge - 1) / kHuge * kHuge;
  memory.data_ = hugetlb ? mapping : reinterpret_cast<void*>(start);
  if (!hugetlb) {
    const int advice = pages == HostPageSize::kTransparentHuge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE;
    if (madvise(memory.data_, rounded, advice) != 0) return failed("madvise", std::strerror(errno));
  }
  // Touched before pinning, so that the pages exist (and THP can back them) before the driver locks them.
  std::memset(memory.data_, 0, rounded);
  const cudaError_t status = cudaHostRegister(memory.data_, rounded, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return failed("cudaHostRegister", cudaGetErrorString(status));
  }
  memory.registered_ = true;
  return Expected<RegisteredHostMemory>(std::move(memory));
}

RegisteredHostMemory::~RegisteredHostMemory() {
  if (registered_) cudaHostUnregister(data_);
  if (mapping_ != nullptr) munmap(mapping_, mapping_bytes_);
}

}  // namespace slimkv::cuda
