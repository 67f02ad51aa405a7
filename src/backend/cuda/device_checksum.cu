#include "backend/cuda/device_checksum.h"

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"

namespace slimkv::cuda {
namespace {

// splitmix64's finalizer (Steele, Lea, Flood: "Fast splittable pseudorandom number generators", 2014).
__host__ __device__ inline uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Word i's term: the word mixed with a key of its position (the key mixed too, so that neighbouring
// positions' keys differ in every bit).
__device__ inline uint64_t word_term(uint64_t word, uint64_t index) { return mix64(word ^ mix64(index + 0x9e3779b97f4a7c15ull)); }

constexpr int kThreads = 256;

// Each thread sums a grid-strided share of the full words; a block's sum goes to `sum` by one atomic.
__global__ void checksum_words(const uint64_t* words, size_t count, unsigned long long* sum) {
  uint64_t local = 0;
  for (size_t i = size_t(blockIdx.x) * kThreads + threadIdx.x; i < count; i += size_t(gridDim.x) * kThreads) {
    local += word_term(words[i], i);
  }
  for (int offset = 16; offset > 0; offset /= 2) local += __shfl_down_sync(0xffffffffu, local, offset);
  __shared__ uint64_t warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = local;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t block = 0;
    for (int w = 0; w < kThreads / 32; ++w) block += warp_sums[w];
    atomicAdd(sum, static_cast<unsigned long long>(block));
  }
}

// The last partial word (fewer than 8 bytes), zero-padded, as word `index`.
__global__ void checksum_tail(const uint8_t* tail, size_t tail_bytes, uint64_t index, unsigned long long* sum) {
  uint64_t word = 0;
  for (size_t b = 0; b < tail_bytes; ++b) word |= uint64_t(tail[b]) << (8 * b);
  atomicAdd(sum, static_cast<unsigned long long>(word_term(word, index)));
}

}  // namespace

Expected<uint64_t> device_checksum(const void* device, size_t bytes) {
  if (reinterpret_cast<uintptr_t>(device) % 8 != 0) {
    return error("device_checksum: the data at ", device, " is not 8-byte aligned (expected an allocation's base)");
  }
  SLIMKV_ASSIGN_OR_RETURN(auto sum, DeviceArray<unsigned long long>::allocate(1, "a checksum"));
  SLIMKV_RETURN_IF_ERROR(device_fill_bytes(sum.data(), 0, sizeof(unsigned long long)));
  const size_t words = bytes / 8, tail_bytes = bytes % 8;
  if (words > 0) {
    // Enough blocks to fill the GPU several times over; each thread then walks its share.
    const size_t wanted = (words + kThreads - 1) / kThreads;
    const unsigned blocks = unsigned(wanted < size_t(multiprocessor_count()) * 16 ? wanted : size_t(multiprocessor_count()) * 16);
    checksum_words<<<blocks, kThreads>>>(static_cast<const uint64_t*>(device), words, sum.data());
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  }
  if (tail_bytes > 0) {
    checksum_tail<<<1, 1>>>(static_cast<const uint8_t*>(device) + words * 8, tail_bytes, words, sum.data());
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  }
  unsigned long long total = 0;
  SLIMKV_RETURN_IF_ERROR(sum.download(&total, 1));
  return uint64_t(total) + mix64(uint64_t(bytes));
}

}  // namespace slimkv::cuda
