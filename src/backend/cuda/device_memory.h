// Device memory and the question "is a GPU usable here", behind a header that needs no CUDA headers,
// so that host code (tests, the engine) compiled by the C++ compiler can hold and fill GPU buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "slimkv/status.h"

namespace slimkv::cuda {

// Ok when a CUDA device can run this build's kernels; otherwise what is missing (no driver, no
// device, a device older than the build's architectures), for `--device cuda` and for test skips.
Status device_usable();

// The number of CUDA devices this process sees (0 when none or no driver).
int device_count();

// Ok when visible GPU `gpu` (`--device cuda:N`) exists; otherwise how many this process sees (and
// CUDA_VISIBLE_DEVICES when it is set), so that a bad index is refused before anything is loaded.
Status check_visible_gpu(int gpu);

// The calling thread's current GPU (cudaGetDevice).
int current_device();

// Makes visible GPU `gpu` the calling thread's current device. The current device is per thread
// (cudaSetDevice), so every entry into an engine's GPU work from a thread that may not have chosen it
// (the server's threads, the KV stream's receivers, the last owner freeing a buffer) calls this first.
// Nothing is given back after: a thread's device is only ever the one its next entry sets, and going
// back to a device the thread never used would make a context on it (on cuda:1, one on GPU 0).
Status use_gpu(int gpu);

// The number of streaming multiprocessors of the current device (sizes split-K grids).
int multiprocessor_count();

// Bytes of device memory free now (sizes the KV block pool).
Expected<size_t> device_free_memory();

// Allocation, copies and errors: every CUDA call is checked and turned into a Status naming the call.
Expected<void*> device_allocate(size_t bytes, const char* what);
void device_free(void* pointer);
Status copy_to_device(void* device, const void* host, size_t bytes);
Status copy_to_host(void* host, const void* device, size_t bytes);
Status device_fill_bytes(void* device, int value, size_t bytes);
Status device_synchronize(const char* what);  // also reports errors of kernels launched before

// An owned device array of n elements of T (trivially copyable); moves, never copies.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  static Expected<DeviceArray> allocate(size_t n, const char* what) {
    DeviceArray array;
    if (n == 0) return Expected<DeviceArray>(std::move(array));
    SLIMKV_ASSIGN_OR_RETURN(void* pointer, device_allocate(n * sizeof(T), what));
    array.data_ = static_cast<T*>(pointer);
    array.size_ = n;
    return Expected<DeviceArray>(std::move(array));
  }
  DeviceArray(DeviceArray&& other) noexcept { swap(other); }
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    DeviceArray moved(std::move(other));
    swap(moved);
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { device_free(data_); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }

  Status upload(const T* host, size_t n) { return copy_to_device(data_, host, n * sizeof(T)); }
  Status download(T* host, size_t n) const { return copy_to_host(host, data_, n * sizeof(T)); }

 private:
  void swap(DeviceArray& other) {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
  }
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace slimkv::cuda
