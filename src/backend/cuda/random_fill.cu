#include "backend/cuda/random_fill.h"

#include <cuda_fp16.h>

#include "backend/cuda/cuda_check.h"

namespace slimkv::cuda {
namespace {

// SplitMix64's finalizer: a well-mixed 64-bit hash of the counter.
__device__ inline uint64_t mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void fill_random_fp16_kernel(__half* out, size_t n, uint64_t seed, float amplitude) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t bits = mix(seed * 0x9e3779b97f4a7c15ull + i);
    const float unit = float(bits >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
    out[i] = __float2half((2.0f * unit - 1.0f) * amplitude);
  }
}

}  // namespace

Status fill_random_fp16(uint16_t* device, size_t n, uint64_t seed, float amplitude) {
  if (n == 0) return Status::ok();
  fill_random_fp16_kernel<<<1024, 256>>>(reinterpret_cast<__half*>(device), n, seed, amplitude);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

}  // namespace slimkv::cuda
