// Pinned host memory mapped into the GPU's address space: with unified addressing, kernels read and
// write it through the host pointer itself, over PCIe (the KV of `pq:...@offload`, kv/cuda/gpu_pq_kv.cc).
#pragma once

#include <cstddef>
#include <utility>

#include "slimkv/status.h"

namespace slimkv::cuda {

// An error names `what` and the bytes (pinning more than the machine's RAM is refused before asking the
// driver, which may take minutes to fail).
Expected<void*> pinned_allocate(size_t bytes, const char* what);
void pinned_free(void* pointer);

// The page size asked of the OS for host memory mapped into the GPU: a kernel reading rows scattered
// over a large pool may be bound by the GPU's translation misses (one per 4 KB page touched), not by
// bytes (bench/cuda/bench_pinned_gather_cuda.cc measures it). Not yet the pools' default.
enum class HostPageSize {
  k4K,                // mmap, madvise(MADV_NOHUGEPAGE): 4 KB pages for sure
  kTransparentHuge,   // mmap 2 MB-aligned, madvise(MADV_HUGEPAGE): 2 MB pages where THP allows
  kHugeTlb,           // mmap(MAP_HUGETLB): 2 MB pages from the reserved pool (vm.nr_hugepages), else an error
};
const char* host_page_size_name(HostPageSize pages);

// Host memory mmap'ed with the asked page size, pinned and mapped with cudaHostRegister (Mapped |
// Portable); freed (unregistered, unmapped) with the object.
class RegisteredHostMemory {
 public:
  // An error names `what`, the bytes and the page size, and what the OS or the driver said.
  static Expected<RegisteredHostMemory> allocate(size_t bytes, HostPageSize pages, const char* what);
  RegisteredHostMemory() = default;
  RegisteredHostMemory(RegisteredHostMemory&& other) noexcept { swap(other); }
  RegisteredHostMemory& operator=(RegisteredHostMemory&& other) noexcept {
    RegisteredHostMemory moved(std::move(other));
    swap(moved);
    return *this;
  }
  RegisteredHostMemory(const RegisteredHostMemory&) = delete;
  RegisteredHostMemory& operator=(const RegisteredHostMemory&) = delete;
  ~RegisteredHostMemory();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void swap(RegisteredHostMemory& other) {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    std::swap(mapping_, other.mapping_);
    std::swap(mapping_bytes_, other.mapping_bytes_);
    std::swap(registered_, other.registered_);
  }
  void* data_ = nullptr;  // 2 MB-aligned, within the mapping
  size_t bytes_ = 0;
  void* mapping_ = nullptr;  // what mmap gave, for munmap
  size_t mapping_bytes_ = 0;
  bool registered_ = false;
};

// An owned pinned, mapped array of n elements of T; moves, never copies.
template <typename T>
class PinnedArray {
 public:
  PinnedArray() = default;
  static Expected<PinnedArray> allocate(size_t n, const char* what) {
    PinnedArray array;
    if (n == 0) return Expected<PinnedArray>(std::move(array));
    SLIMKV_ASSIGN_OR_RETURN(void* pointer, pinned_allocate(n * sizeof(T), what));
    array.data_ = static_cast<T*>(pointer);
    array.size_ = n;
    return Expected<PinnedArray>(std::move(array));
  }
  PinnedArray(PinnedArray&& other) noexcept { swap(other); }
  PinnedArray& operator=(PinnedArray&& other) noexcept {
    PinnedArray moved(std::move(other));
    swap(moved);
    return *this;
  }
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;
  ~PinnedArray() { pinned_free(data_); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }

 private:
  void swap(PinnedArray& other) {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
  }
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace slimkv::cuda
