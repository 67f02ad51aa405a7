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
