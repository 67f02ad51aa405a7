#include "kv/cuda/pq_token_cache.h"

#include <algorithm>
#include <climits>

#include "backend/cuda/cuda_check.h"
#include "kv/cuda/pq_token_cache.cuh"

namespace slimkv::cuda {
namespace {

constexpr int kThreads = 1024;

__host__ __device__ int power_of_two_at_least(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

// The shared memory of the policy: each slot's sort key (primary, secondary) and its index.
size_t sort_bytes(int slots) {
  return size_t(power_of_two_at_least(slots)) * (sizeof(unsigned long long) + sizeof(unsigned) + sizeof(unsigned short));
}

// The exclusive prefix sum of `value` over the block (blockDim.x a multiple of 32), and the block's total.
__device__ int block_exclusive_sum(int value, int* total) {
  __shared__ int warp_sums[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  int inclusive = value;
  for (int offset = 1; offset < 32; offset *= 2) {
    const int before = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += before;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int sum = lane < warps ? warp_sums[lane] : 0;
    for (int offset = 1; offset < 32; offset *= 2) {
      const int before = __shfl_up_sync(0xffffffffu, sum, offset);
      if (lane >= offset) sum += before;
    }
    warp_sums[lane] = sum;
  }
  __syncthreads();
  const int exclusive = (warp > 0 ? warp_sums[warp - 1] : 0) + inclusive - value;
  *total = warp_sums[warps - 1];
  __syncthreads();  // warp_sums is reused by the next call
  return exclusive;
}

// Sorts n (a power of two) keys (primary, secondary) ascending, order[] moving with them: a bitonic sort.
__device__ void sort_keys(unsigned* primary, unsigned long long* secondary, unsigned short* order, int n) {
  for (int k = 2; k <= n; k *= 2) {
    for (int j = k / 2; j > 0; j /= 2) {
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int other = i ^ j;
        if (other <= i) continue;
        const bool greater = primary[i] > primary[other] || (primary[i] == primary[other] && secondary[i] > secondary[other]);
        if (greater == ((i & k) == 0)) {
          const unsigned p = primary[i];
          primary[i] = primary[other];
          primary[other] = p;
          const unsigned long long s = secondary[i];
          secondary[i] = secondary[other];
          secondary[other] = s;
          const unsigned short o = order[i];
          order[i] = order[other];
          order[other] = o;
        }
      }
      __syncthreads();
    }
  }
}

// grid (kv heads, rows): one (sequence, layer, KV head)'s step of the policy, then the fill of its misses.
__global__ void __launch_bounds__(kThreads) update_kernel(PqCacheUpdate u) {
  extern __shared__ unsigned long long shared[];
  __shared__ unsigned long long block_hits, block_filled;
  const PqTokenCacheView& c = u.view;
  const int pow2 = power_of_two_at_least(c.slots);
  unsigned long long* secondary = shared;
  unsigned* primary = reinterpret_cast<unsigned*>(secondary + pow2);
  unsigned short* order = reinterpret_cast<unsigned short*>(primary + pow2);
  const PqSelectRow r = u.rows[blockIdx.y];
  const int g = blockIdx.x, n = r.selected, d = c.head_dim;
  const long long unit = pq_cache_unit(c, r.sequence, g);
  int* token_slots = c.token_slots + unit * c.max_tokens;
  int* slot_tokens = c.slot_tokens + unit * c.slots;
  unsigned* uses = c.slot_uses + unit * c.slots;
  unsigned long long* stamps = c.slot_stamps + unit * c.slots;
  const int* tokens = c.step_tokens + ((long long)blockIdx.y * c.num_kv_heads + g) * c.tokens_stride;
  const unsigned long long step_bits = c.step << 33;
  if (threadIdx.x == 0) block_hits = block_filled = 0;
  // 1. Hits stamp their slots (which pins them for this step).
  unsigned long long hits = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int slot = token_slots[tokens[i]];
    if (slot < 0) continue;
    stamps[slot] = step_bits | unsigned(i);
    uses[slot] += 1;
    ++hits;
  }
  __syncthreads();
  // 2. The slots a miss may take, in the policy's order: empty ones first (lowest first), then LRU's
  // oldest stamp, or LFU's fewest uses and then oldest stamp; slots used in this step last (never taken).
  for (int j = threadIdx.x; j < pow2; j += blockDim.x) {
    unsigned p = UINT_MAX;
    unsigned long long s = ULLONG_MAX;
    if (j < c.slots) {
      if (slot_tokens[j] < 0) {
        p = 0;
        s = unsigned(j);
      } else if ((stamps[j] >> 33) != c.step) {
        p = c.lfu ? uses[j] : 1u;
        s = stamps[j];
      }
    }
    primary[j] = p;
    secondary[j] = s;
    order[j] = (unsigned short)j;
  }
  __syncthreads();
  sort_keys(primary, secondary, order, pow2);
  // 3. The i-th miss (ascending) takes the i-th of them, and its K/V row from the compact buffer.
  unsigned long long filled = 0;
  int misses_before = 0;
  for (int first = 0; first < n; first += blockDim.x) {
    const int i = first + int(threadIdx.x);
    const int token = i < n ? tokens[i] : -1;
    const bool miss = i < n && token_slots[token] < 0;
    int chunk_misses = 0;
    const int rank = misses_before + block_exclusive_sum(miss ? 1 : 0, &chunk_misses);
    if (miss && rank < pow2 && primary[rank] != UINT_MAX) {
      const int slot = order[rank];
      const int evicted = slot_tokens[slot];
      if (evicted >= 0) token_slots[evicted] = -1;
      token_slots[token] = slot;
      slot_tokens[slot] = token;
      uses[slot] = 1;
      stamps[slot] = step_bits | (1ull << 32) | unsigned(i);
      const long long block = (long long)blockIdx.y * u.out_blocks_per_row + i / kCudaBlockTokens;
      const long long from = ((block * c.num_kv_heads + g) * kCudaBlockTokens + i % kCudaBlockTokens) * d;
      const long long to = (unit * c.slots + slot) * d;
      const uint4* k_in = reinterpret_cast<const uint4*>(u.compact_k + from);
      const uint4* v_in = reinterpret_cast<const uint4*>(u.compact_v + from);
      uint4* k_out = reinterpret_cast<uint4*>(c.k + to);
      uint4* v_out = reinterpret_cast<uint4*>(c.v + to);
      for (int e = 0; e < d / 8; ++e) {
        k_out[e] = k_in[e];
        v_out[e] = v_in[e];
      }
      ++filled;
    }
    misses_before += chunk_misses;
  }
  atomicAdd(&block_hits, hits);
  atomicAdd(&block_filled, filled);
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicAdd(&c.counters[0], (unsigned long long)n);
    atomicAdd(&c.counters[1], block_hits);
    atomicAdd(&c.counters[2], block_filled);
  }
}

}  // namespace

Status pq_cache_update(const PqCacheUpdate& u, void* stream) {
  if (u.num_rows == 0) return Status::ok();
  const dim3 grid(unsigned(u.view.num_kv_heads), unsigned(u.num_rows));
  update_kernel<<<grid, kThreads, sort_bytes(u.view.slots), static_cast<cudaStream_t>(stream)>>>(u);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Expected<std::unique_ptr<CudaPqTokenCache>> CudaPqTokenCache::create(const PqTokenCacheShape& shape, CachePolicy policy) {
  if (shape.slots < 1 || shape.slots > kPqCacheMaxSlots) {
    return error("pq on device 'cuda': cache=", shape.slots, ": the GPU cache of selected tokens holds 1 to ",
                 kPqCacheMaxSlots, " tokens per layer and KV head (cache=0: none)");
  }
  if (shape.head_dim % 8 != 0) return error("pq's GPU cache: head_dim ", shape.head_dim, " is not a multiple of 8");
  std::unique_ptr<CudaPqTokenCache> cache(new CudaPqTokenCache(shape, policy));
  const size_t units = cache->units(), slots = units * size_t(shape.slots);
  SLIMKV_ASSIGN_OR_RETURN(cache->token_slots_, DeviceArray<int>::allocate(units * size_t(shape.max_tokens), "the GPU cache's token map"));
  SLIMKV_ASSIGN_OR_RETURN(cache->slot_tokens_, DeviceArray<int>::allocate(slots, "the GPU cache's slots"));
  SLIMKV_ASSIGN_OR_RETURN(cache->slot_uses_, DeviceArray<unsigned>::allocate(slots, "the GPU cache's use counts"));
  SLIMKV_ASSIGN_OR_RETURN(cache->slot_stamps_, DeviceArray<unsigned long long>::allocate(slots, "the GPU cache's stamps"));
  SLIMKV_ASSIGN_OR_RETURN(cache->k_, DeviceArray<uint16_t>::allocate(slots * size_t(shape.head_dim), "the GPU cache's keys"));
  SLIMKV_ASSIGN_OR_RETURN(cache->v_, DeviceArray<uint16_t>::allocate(slots * size_t(shape.head_dim), "the GPU cache's values"));
  SLIMKV_ASSIGN_OR_RETURN(cache->counters_, DeviceArray<unsigned long long>::allocate(3, "the GPU cache's counters"));
  SLIMKV_ASSIGN_OR_RETURN(cache->step_tokens_,
                          DeviceArray<int>::allocate(size_t(shape.max_sequences) * size_t(shape.num_kv_heads) *
                                                         size_t(std::max(1, shape.max_selected)),
                                                     "the selection's tokens"));
  for (int s = 0; s < shape.max_sequences; ++s) SLIMKV_RETURN_IF_ERROR(cache->reset_sequence(s));
  SLIMKV_RETURN_IF_ERROR(device_fill_bytes(cache->counters_.data(), 0, cache->counters_.bytes()));
  // The largest any cache may ask for: caches of other sizes may live in the same process.
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(update_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   int(sort_bytes(kPqCacheMaxSlots))));
  cudaStream_t stream = nullptr;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cache->stream_ = stream;
  cudaEvent_t gathered = nullptr, updated = nullptr;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&gathered, cudaEventDisableTiming));
  cache->gathered_ = gathered;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&updated, cudaEventDisableTiming));
  cache->updated_ = updated;
  return Expected<std::unique_ptr<CudaPqTokenCache>>(std::move(cache));
}

CudaPqTokenCache::~CudaPqTokenCache() {
  if (stream_ != nullptr) cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  if (gathered_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(gathered_));
  if (updated_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(updated_));
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

Status CudaPqTokenCache::reset_sequence(int sequence) {
  if (stream_ != nullptr) SLIMKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  // The sequence's (layer, KV head) triples are consecutive: -1 (all bits set) for the maps, 0 for the rest.
  const size_t per_sequence = size_t(shape_.num_layers) * size_t(shape_.num_kv_heads);
  const size_t first = size_t(sequence) * per_sequence, slots = size_t(shape_.slots), tokens = size_t(shape_.max_tokens);
  SLIMKV_RETURN_IF_ERROR(device_fill_bytes(token_slots_.data() + first * tokens, 0xff, per_sequence * tokens * sizeof(int)));
  SLIMKV_RETURN_IF_ERROR(device_fill_bytes(slot_tokens_.data() + first * slots, 0xff, per_sequence * slots * sizeof(int)));
  SLIMKV_RETURN_IF_ERROR(device_fill_bytes(slot_uses_.data() + first * slots, 0, per_sequence * slots * sizeof(unsigned)));
  return device_fill_bytes(slot_stamps_.data() + first * slots, 0, per_sequence * slots * sizeof(unsigned long long));
}

Status CudaPqTokenCache::begin_step() {
  // The last step's last update may still read the rows and buffers the new step is about to rewrite
  // (it is long done by now: the step's sampling waited for the GPU after it was queued).
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  ++step_;
  return device_fill_bytes(counters_.data(), 0, counters_.bytes());
}

Status CudaPqTokenCache::wait_for_update() {
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(cudaStream_t{}, static_cast<cudaEvent_t>(updated_), 0));
  return Status::ok();
}

PqTokenCacheView CudaPqTokenCache::view(int layer) {
  PqTokenCacheView v;
  v.token_slots = token_slots_.data();
  v.slot_tokens = slot_tokens_.data();
  v.slot_uses = slot_uses_.data();
  v.slot_stamps = slot_stamps_.data();
  v.k = k_.data();
  v.v = v_.data();
  v.counters = counters_.data();
  v.num_layers = shape_.num_layers;
  v.layer = layer;
  v.num_kv_heads = shape_.num_kv_heads;
  v.head_dim = shape_.head_dim;
  v.max_tokens = shape_.max_tokens;
  v.slots = shape_.slots;
  v.lfu = policy_ == CachePolicy::kLfu ? 1 : 0;
  v.step = step_;
  v.step_tokens = step_tokens_.data();
  v.tokens_stride = shape_.max_selected;
  return v;
}

Status CudaPqTokenCache::update(int layer, const PqCacheUpdate& update) {
  const auto stream = static_cast<cudaStream_t>(stream_);
  const auto gathered = static_cast<cudaEvent_t>(gathered_);
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(gathered, cudaStream_t{}));
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, gathered, 0));
  PqCacheUpdate u = update;
  u.view = view(layer);
  SLIMKV_RETURN_IF_ERROR(pq_cache_update(u, stream));
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(updated_), stream));
  return Status::ok();
}

Expected<PqCacheCounters> CudaPqTokenCache::counters() const {
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  unsigned long long counts[3] = {};
  SLIMKV_RETURN_IF_ERROR(counters_.download(counts, 3));
  return PqCacheCounters{(long long)counts[0], (long long)counts[1], (long long)counts[2]};
}

size_t CudaPqTokenCache::device_bytes() const {
  return token_slots_.bytes() + slot_tokens_.bytes() + slot_uses_.bytes() + slot_stamps_.bytes() + k_.bytes() +
         v_.bytes() + step_tokens_.bytes();
}

}  // namespace slimkv::cuda
