#include "kv/cuda/kv_slots.h"

#include "backend/cuda/cuda_check.h"
#include "kv/cuda/kv_slots.cuh"

namespace slimkv::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(long long total) { return unsigned((total + kThreads - 1) / kThreads); }

// One thread per 16 bytes (8 halves) of a token's head.
__global__ void write_kv_slots_kernel(const uint4* k, const uint4* v, const int* slots, int n_tokens, int num_kv_heads,
                                      int vectors_per_head, uint4* k_pool, uint4* v_pool) {
  const long long index = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  const long long total = (long long)n_tokens * num_kv_heads * vectors_per_head;
  if (index >= total) return;
  const int vector = int(index % vectors_per_head);
  const int head = int(index / vectors_per_head % num_kv_heads);
  const int token = int(index / vectors_per_head / num_kv_heads);
  write_kv_vector(k, v, slots, token, head, num_kv_heads, vectors_per_head, vector, k_pool, v_pool);
}

__global__ void write_row_slots_kernel(const uint4* rows, const int* slots, int n, int vectors_per_row, uint4* out) {
  const long long index = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (index >= (long long)n * vectors_per_row) return;
  const int row = int(index / vectors_per_row), vector = int(index % vectors_per_row);
  const int slot = slots[row];
  if (slot >= 0) out[size_t(slot) * vectors_per_row + vector] = rows[index];
}

}  // namespace

Status write_kv_slots(const uint16_t* k, const uint16_t* v, const int* slots, int n, int num_kv_heads, int head_dim,
                      uint16_t* k_pool, uint16_t* v_pool) {
  if (n == 0) return Status::ok();
  const int vectors_per_head = head_dim / 8;
  write_kv_slots_kernel<<<blocks_for((long long)n * num_kv_heads * vectors_per_head), kThreads>>>(
      reinterpret_cast<const uint4*>(k), reinterpret_cast<const uint4*>(v), slots, n, num_kv_heads, vectors_per_head,
      reinterpret_cast<uint4*>(k_pool), reinterpret_cast<uint4*>(v_pool));
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status write_row_slots(const void* rows, const int* slots, int n, size_t row_bytes, void* out) {
  if (n == 0) return Status::ok();
  const int vectors_per_row = int(row_bytes / 16);
  write_row_slots_kernel<<<blocks_for((long long)n * vectors_per_row), kThreads>>>(
      static_cast<const uint4*>(rows), slots, n, vectors_per_row, static_cast<uint4*>(out));
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

}  // namespace slimkv::cuda
