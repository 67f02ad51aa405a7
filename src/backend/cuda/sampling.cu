#include "backend/cuda/sampling.h"

#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "util/random.h"

namespace slimkv::cuda {
namespace {

constexpr int kThreads = 512;  // one CTA per row
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;

// An order-preserving key: a > b as floats (no NaN) iff key(a) > key(b) as unsigned integers.
__device__ inline uint32_t order_key(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Calls f(i, row[i]) for every logit of the row, spread over the CTA's threads. A row is read by one
// CTA, which waits on memory latency rather than bandwidth unless many loads are in flight: each
// thread keeps four 16-byte loads in flight (measured: scalar loads made sampling cost ~1 ms per step
// on a 128K vocabulary).
template <typename F>
__device__ void for_each_logit(const float* row, int vocab, F&& f) {
  constexpr int kUnroll = 4;
  const int vectors = reinterpret_cast<uintptr_t>(row) % 16 == 0 ? vocab / 4 : 0;
  const auto* v = reinterpret_cast<const float4*>(row);
  for (int base = threadIdx.x; base < vectors; base += kThreads * kUnroll) {
    float4 x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kThreads;
      if (j < vectors) x[u] = v[j];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kThreads;
      if (j < vectors) f(4 * j, x[u].x), f(4 * j + 1, x[u].y), f(4 * j + 2, x[u].z), f(4 * j + 3, x[u].w);
    }
  }
  for (int i = 4 * vectors + int(threadIdx.x); i < vocab; i += kThreads) f(i, row[i]);
}

// (best, best_index) becomes (value, index) when that is larger, or equal at a lower index: the first
// of equal maxima whatever order a thread sees them in. NaN-free rows always pick an index.
__device__ inline void keep_larger(float value, int index, float& best, int& best_index) {
  if (value > best || (value == best && index < best_index)) best = value, best_index = index;
}

// The largest value over the CTA and the first index holding it (ties: the lowest index).
__device__ void block_argmax(float& value, int& index) {
  __shared__ float values[kWarps];
  __shared__ int indices[kWarps];
  for (int offset = 16; offset > 0; offset /= 2) {
    keep_larger(__shfl_xor_sync(kFullMask, value, offset), __shfl_xor_sync(kFullMask, index, offset), value, index);
  }
  if (threadIdx.x % 32 == 0) values[threadIdx.x / 32] = value, indices[threadIdx.x / 32] = index;
  __syncthreads();
  value = values[0], index = indices[0];
  for (int w = 1; w < kWarps; ++w) keep_larger(values[w], indices[w], value, index);
  __syncthreads();  // the arrays may be reused by the next call
}

__device__ float block_sum(float value) {
  __shared__ float sums[kWarps];
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(kFullMask, value, offset);
  if (threadIdx.x % 32 == 0) sums[threadIdx.x / 32] = value;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) total += sums[w];
  __syncthreads();
  return total;
}

// Writes ends[t] = the sum of `value` over threads 0..t (thread order): thread t's share of a total
// is [ends[t - 1], ends[t]), intervals that tile it exactly.
__device__ void block_inclusive_scan(float value, float* ends) {
  __shared__ float warp_totals[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float inclusive = value;
  for (int offset = 1; offset < 32; offset *= 2) {
    const float before = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += before;
  }
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  float earlier_warps = 0.0f;
  for (int w = 0; w < warp; ++w) earlier_warps += warp_totals[w];
  ends[threadIdx.x] = earlier_warps + inclusive;
  __syncthreads();
}

// Radix selection over the row's keys, 8 bits at a time from the top: the largest key t such that the
// tokens with key >= t (among those with key >= floor) weigh at least `wanted` — weight 1 each for
// top-k (the k-th largest), probability mass for top-p. Ties at t are all kept.
template <typename Weight>
__device__ uint32_t select_threshold(const float* row, int vocab, uint32_t floor, float wanted, Weight weight) {
  __shared__ float bins[256];
  __shared__ uint32_t chosen_prefix;
  __shared__ float chosen_wanted;
  uint32_t prefix = 0, mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) bins[b] = 0.0f;
    __syncthreads();
    for_each_logit(row, vocab, [&](int, float logit) {
      const uint32_t key = order_key(logit);
      if (key >= floor && (key & mask) == prefix) {
        // Logits crowd into few bins (the top bits are sign and exponent): the lanes of a warp that
        // share a bin add their weights first, and one of them adds the sum (one atomic, not 32).
        const unsigned bin = (key >> shift) & 255u;
        const float w = weight(logit);
        const unsigned peers = __match_any_sync(__activemask(), bin);
        float sum = 0.0f;
        for (unsigned m = peers; m != 0; m &= m - 1) sum += __shfl_sync(peers, w, __ffs(int(m)) - 1);
        if (threadIdx.x % 32 == unsigned(__ffs(int(peers)) - 1)) atomicAdd(&bins[bin], sum);
      }
    });
    __syncthreads();
    if (threadIdx.x == 0) {
      // The highest bin whose mass from the top reaches what is wanted; the lowest non-empty one when
      // rounding leaves the total a hair short.
      float above = 0.0f;
      int pick = -1, lowest = 0;
      for (int b = 255; b >= 0; --b) {
        if (bins[b] == 0.0f) continue;
        lowest = b;
        if (above + bins[b] >= wanted) {
          pick = b;
          break;
        }
        above += bins[b];
      }
      if (pick < 0) pick = lowest;
      chosen_prefix = prefix | (uint32_t(pick) << shift);
      chosen_wanted = wanted - above;
    }
    __syncthreads();
    prefix = chosen_prefix;
    wanted = chosen_wanted;
    mask |= 255u << shift;
    __syncthreads();
  }
  return prefix;
}

__global__ void argmax_kernel(const float* logits, int vocab, int32_t* out) {
  const float* row = logits + size_t(blockIdx.x) * vocab;
  float best = -INFINITY;
  int best_index = vocab;
  for_each_logit(row, vocab, [&](int i, float logit) { keep_larger(logit, i, best, best_index); });
  block_argmax(best, best_index);
  if (threadIdx.x == 0) out[blockIdx.x] = best_index;
}

__global__ void sample_kernel(const float* logits, int vocab, const RowSampling* rows, int32_t* out) {
  const float* row = logits + size_t(blockIdx.x) * vocab;
  const RowSampling s = rows[blockIdx.x];
  float max_logit = -INFINITY;
  int max_index = vocab;
  for_each_logit(row, vocab, [&](int i, float logit) { keep_larger(logit, i, max_logit, max_index); });
  block_argmax(max_logit, max_index);
  if (s.temperature <= 0.0f) {
    if (threadIdx.x == 0) out[blockIdx.x] = max_index;
    return;
  }
  // Keep the top-k logits, then the top-p of their probability mass: a threshold key each.
  uint32_t floor = 0;
  if (s.top_k > 0 && s.top_k < vocab) {
    floor = select_threshold(row, vocab, 0u, float(s.top_k), [](float) { return 1.0f; });
  }
  const float inverse_temperature = 1.0f / s.temperature;
  const auto weight = [&](float logit) { return expf((logit - max_logit) * inverse_temperature); };
  const auto kept_mass = [&](uint32_t from) {
    float local = 0.0f;
    for_each_logit(row, vocab, [&](int, float logit) {
      if (order_key(logit) >= from) local += weight(logit);
    });
    return block_sum(local);
  };
  float total = kept_mass(floor);
  if (s.top_p < 1.0f) {
    floor = select_threshold(row, vocab, floor, s.top_p * total, weight);
    total = kept_mass(floor);
  }
  // Draw u in [0, total) and walk the kept tokens in index order: each thread owns a contiguous
  // chunk; the one whose share of the mass holds u finds the token in it.
  const float u = counter_uniform(s.seed, s.counter) * total;
  const int chunk = (vocab + kThreads - 1) / kThreads;
  const int begin = min(vocab, int(threadIdx.x) * chunk), end = min(vocab, begin + chunk);
  float mine = 0.0f;
  int last_kept = -1;
  for (int i = begin; i < end; ++i) {
    if (order_key(row[i]) >= floor) mine += weight(row[i]), last_kept = i;
  }
  __shared__ float ends[kThreads];
  block_inclusive_scan(mine, ends);
  const float before = threadIdx.x > 0 ? ends[threadIdx.x - 1] : 0.0f;
  __shared__ int chosen;
  if (threadIdx.x == 0) chosen = max_index;  // u past the summed mass by rounding: the most likely token
  __syncthreads();
  if (u >= before && u < ends[threadIdx.x]) {  // at most one thread: the intervals tile [0, ends[last])
    float left = u - before;
    int pick = last_kept;
    for (int i = begin; i < end; ++i) {
      if (order_key(row[i]) < floor) continue;
      left -= weight(row[i]);
      if (left < 0.0f) {
        pick = i;
        break;
      }
    }
    chosen = pick;
  }
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = chosen;
}

}  // namespace

Status argmax_rows(const float* logits, int n, int vocab, int32_t* out) {
  if (n == 0) return Status::ok();
  if (vocab <= 0) return error("argmax over ", vocab, " logits");
  argmax_kernel<<<unsigned(n), kThreads>>>(logits, vocab, out);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status sample_rows(const float* logits, int n, int vocab, const RowSampling* rows, int32_t* out) {
  if (n == 0) return Status::ok();
  if (vocab <= 0) return error("sampling over ", vocab, " logits");
  sample_kernel<<<unsigned(n), kThreads>>>(logits, vocab, rows, out);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

}  // namespace slimkv::cuda
