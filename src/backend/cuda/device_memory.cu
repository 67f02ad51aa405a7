#include "backend/cuda/device_memory.h"

#include <cstdlib>
#include <string>
#include <thread>

#include "backend/cuda/cuda_check.h"

namespace slimkv::cuda {
namespace {
// An empty kernel: whether it loads tells whether the build's code runs on the device.
__global__ void device_usable_probe() {}
}  // namespace

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

Status check_visible_gpu(int gpu) {
  const int count = device_count();
  if (gpu >= 0 && gpu < count) return Status::ok();
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string mask = visible != nullptr ? str_cat(" (CUDA_VISIBLE_DEVICES=", visible, ")") : std::string();
  if (count == 0) {
    const Status why = device_usable();  // no driver, or none visible: its reason
    return error("device 'cuda:", gpu, "': this process sees no GPU", mask, why ? std::string() : str_cat(" (", why.message(), ")"));
  }
  return error("device 'cuda:", gpu, "': this process sees ", count, count == 1 ? " GPU" : " GPUs", mask,
               ": expected cuda:0", count == 1 ? std::string() : str_cat(" to cuda:", count - 1));
}

int current_device() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return device;
}

Status use_gpu(int gpu) {
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(gpu));
  return Status::ok();
}

Status device_usable() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    return error("no usable CUDA device: ", cudaGetErrorString(status), " (is the NVIDIA driver loaded?)");
  }
  if (count == 0) return error("no usable CUDA device: the driver reports none");
  // A kernel of this build must load on the device (the build's architectures vs the device's).
  cudaFuncAttributes attributes{};
  const cudaError_t load = cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(&device_usable_probe));
  if (load == cudaErrorNoKernelImageForDevice || load == cudaErrorInvalidDeviceFunction) {
    cudaDeviceProp properties{};
    cudaGetDeviceProperties(&properties, current_device());
    return error("CUDA device ", properties.name, " (sm_", properties.major, properties.minor,
                 ") cannot run this build's kernels: ", cudaGetErrorString(load),
                 " (rebuild with CMAKE_CUDA_ARCHITECTURES naming it)");
  }
  if (load != cudaSuccess) return error("the CUDA context is unusable: ", cudaGetErrorString(load));
  return Status::ok();
}

int multiprocessor_count() {
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 1;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 1;
  return count;
}

Expected<size_t> device_free_memory() {
  size_t free_bytes = 0, total_bytes = 0;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
}

Expected<void*> device_allocate(size_t bytes, const char* what) {
  void* pointer = nullptr;
  const cudaError_t status = cudaMalloc(&pointer, bytes);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls do not report it
    return error("allocating ", bytes, " bytes of GPU memory for ", what, ": ", cudaGetErrorString(status));
  }
  return pointer;
}

void device_free(void* pointer) {
  if (pointer != nullptr) cudaFree(pointer);
}

namespace {

// Waits until the work enqueued so far on the default stream is done. A synchronous cudaMemcpy waits
// for that work itself, but holds a lock of the driver meanwhile that every other thread's CUDA calls
// then wait for: a KV sender's NCCL issues stalled for whole prefill steps (traced: 103 of its 106
// calls over 1 ms ended as the compute thread's cudaMemcpy did). Polling an event holds it only per poll.
Status wait_for_default_stream() {
  cudaEvent_t done = nullptr;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  cudaError_t state = cudaEventRecord(done);
  if (state == cudaSuccess) {
    while ((state = cudaEventQuery(done)) == cudaErrorNotReady) std::this_thread::yield();
  }
  cudaEventDestroy(done);
  SLIMKV_CUDA_RETURN_IF_ERROR(state);
  return Status::ok();
}

}  // namespace

Status copy_to_device(void* device, const void* host, size_t bytes) {
  if (bytes == 0) return Status::ok();
  SLIMKV_RETURN_IF_ERROR(wait_for_default_stream());
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
  return Status::ok();
}

Status copy_to_host(void* host, const void* device, size_t bytes) {
  if (bytes == 0) return Status::ok();
  SLIMKV_RETURN_IF_ERROR(wait_for_default_stream());
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost));
  return Status::ok();
}

Status device_fill_bytes(void* device, int value, size_t bytes) {
  if (bytes == 0) return Status::ok();
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaMemset(device, value, bytes));
  return Status::ok();
}

Status device_synchronize(const char* what) {
  const cudaError_t status = cudaDeviceSynchronize();
  if (status != cudaSuccess) return error(what, ": ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
  return Status::ok();
}

}  // namespace slimkv::cuda
