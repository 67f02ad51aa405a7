#include "kv/cuda/pq_select.h"

#include <cuda_fp16.h>

#include "backend/cuda/cuda_check.h"

namespace slimkv::cuda {
namespace {

using i64 = long long;

constexpr int kTopKThreads = 1024;
constexpr int kKeysInFlight = 8;  // per thread of the top-k's passes
constexpr int kWarpsPerBlock = 8;

__device__ float half_at(const uint16_t* p, long long i) { return __half2float(__ushort_as_half(p[i])); }

// The summed query of KV head g's group (FP32, heads in order: the CPU selector's Σ_h q_h) into sum[d].
__device__ void group_query(const uint16_t* q, int row, int g, int num_heads, int num_kv_heads, int d, float* sum) {
  const int group = num_heads / num_kv_heads;
  for (int c = threadIdx.x + threadIdx.y * blockDim.x; c < d; c += blockDim.x * blockDim.y) {
    float s = 0.0f;
    for (int h = 0; h < group; ++h) s += half_at(q, (i64(row) * num_heads + g * group + h) * d + c);
    sum[c] = s;
  }
}

// Where token t of sequence s, KV head g sits in a paged view.
__device__ long long paged_offset(const PagedKvView& v, int s, int g, int t) {
  const int block = v.block_tables[i64(s) * v.block_table_stride + t / kCudaBlockTokens];
  return ((i64(block) * v.num_kv_heads + g) * kCudaBlockTokens + t % kCudaBlockTokens) * v.head_dim;
}

// 1. grid (segments, kv heads, rows).
__global__ void tables_kernel(PqSelectLaunch p) {
  extern __shared__ float qsum[];
  const PqSelectRow r = p.rows[blockIdx.z];
  const int g = blockIdx.y, seg = blockIdx.x;
  if (r.all || seg >= r.trained_segments) return;
  const PqIndexView& x = p.index;
  group_query(p.q, blockIdx.z, g, p.num_heads, p.num_kv_heads, x.head_dim, qsum);
  __syncthreads();
  const int K = 1 << x.bits, sub = x.head_dim / x.m;
  const uint16_t* c = x.centroids + ((i64(r.sequence) * p.num_kv_heads + g) * x.max_segments + seg) *
                                        (i64(x.head_dim) * K);
  float* table = p.scratch.tables + ((i64(blockIdx.z) * p.num_kv_heads + g) * x.max_segments + seg) * (x.m * K);
  for (int e = threadIdx.x; e < x.m * K; e += blockDim.x) {
    const int s = e / K, i = e % K;
    double sum = 0.0;
    // Unrolled so that several centroid loads are in flight (a 128K context has 512 segments' codebooks
    // to read each layer); the sum keeps its order.
#pragma unroll 8
    for (int j = 0; j < sub; ++j) sum += double(qsum[s * sub + j]) * double(half_at(c, (i64(s) * sub + j) * K + i));
    table[e] = float(sum);
  }
}

// 2. grid (middle / 256, kv heads, rows).
__global__ void adc_kernel(PqSelectLaunch p) {
  const PqSelectRow r = p.rows[blockIdx.z];
  const int g = blockIdx.y;
  const int t = r.init_end + blockIdx.x * blockDim.x + threadIdx.x;
  if (r.all || t >= r.middle_end) return;
  const PqIndexView& x = p.index;
  const int K = 1 << x.bits;
  const int seg = min(t / x.segment_tokens, r.trained_segments - 1);
  const float* table = p.scratch.tables + ((i64(blockIdx.z) * p.num_kv_heads + g) * x.max_segments + seg) * (x.m * K);
  const uint8_t* code = x.codes + ((i64(r.sequence) * p.num_kv_heads + g) * x.max_tokens + t) * x.m;
  float sum = 0.0f;
  for (int s = 0; s < x.m; ++s) sum += table[s * K + code[s]];
  p.scratch.scores[(i64(blockIdx.z) * p.num_kv_heads + g) * p.scratch.max_middle + (t - r.init_end)] = sum;
}

// Larger floats, larger keys (zeros of both signs one key: they compare equal).
__device__ unsigned order_key(float f) {
  const unsigned u = __float_as_uint(f == 0.0f ? 0.0f : f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(kTopKThreads) top_k_kernel(const float* scores, long long score_stride, const int* ns,
                                                              const int* ks, int per_length, int* out_all,
                                                              long long out_stride) {
  __shared__ int hist[256];
  __shared__ unsigned shared_prefix;
  __shared__ int shared_remaining;
  const int n = ns[blockIdx.x / per_length], k = min(ks[blockIdx.x / per_length], n);
  const float* s = scores + blockIdx.x * score_stride;
  int* out = out_all + blockIdx.x * out_stride;
  if (k <= 0) return;
  if (k == n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = i;
    return;
  }
  // The k-th largest key, 8 bits at a time from the top; `remaining`: how many of the keys equal to it
  // are taken (the lowest indices).
  unsigned prefix = 0, mask = 0;
  int remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    // Scores cluster in few bins (the top byte is sign and exponent): lanes of a warp that hit the same
    // bin add once, through their leader. kKeysInFlight keys a thread are loaded before the first is
    // used: one CTA reads the whole row, so the loads' latency, not bandwidth, bounds a pass.
    for (int base = 0; base < n; base += int(blockDim.x) * kKeysInFlight) {
      unsigned keys[kKeysInFlight];
#pragma unroll
      for (int j = 0; j < kKeysInFlight; ++j) {
        const int i = base + j * int(blockDim.x) + int(threadIdx.x);
        keys[j] = i < n ? order_key(s[i]) : 0u;
      }
#pragma unroll
      for (int j = 0; j < kKeysInFlight; ++j) {
        const int i = base + j * int(blockDim.x) + int(threadIdx.x);
        const unsigned bin = (i < n && (keys[j] & mask) == prefix) ? (keys[j] >> shift) & 255u : 256u;
        const unsigned peers = __match_any_sync(0xffffffffu, bin);
        if (bin < 256u && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0, bin = 255;
      for (; bin > 0 && above + hist[bin] < remaining; --bin) above += hist[bin];
      shared_prefix = prefix | (unsigned(bin) << shift);
      shared_remaining = remaining - above;
    }
    __syncthreads();
    prefix = shared_prefix;
    remaining = shared_remaining;
    mask |= 255u << shift;
    __syncthreads();
  }
  // In index order: every key above the k-th's, and the first `remaining` equal to it. Warp w owns the
  // w-th of kWarps equal ranges of the scores (read coalesced); the warps' counts give each its first
  // output slot and how many equal keys precede it, and within a warp ballots order the lanes. (A
  // block-wide scan per 1024 scores cost two scans and four barriers each: at 128K tokens that pass
  // took most of a layer's selection, one CTA per row.)
  constexpr int kWarps = kTopKThreads / 32;
  __shared__ int warp_greater[kWarps], warp_equal[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int span = (n + kWarps - 1) / kWarps, begin = min(n, warp * span), end = min(n, begin + span);
  // A warp's keys kKeysInFlight pieces of 32 at a time, all loaded before the first is used.
  const auto load_keys = [&](int base, unsigned (&keys)[kKeysInFlight]) {
#pragma unroll
    for (int j = 0; j < kKeysInFlight; ++j) {
      const int i = base + 32 * j + lane;
      keys[j] = i < end ? order_key(s[i]) : 0u;
    }
  };
  int greater = 0, equal = 0;
  for (int base = begin; base < end; base += 32 * kKeysInFlight) {
    unsigned keys[kKeysInFlight];
    load_keys(base, keys);
#pragma unroll
    for (int j = 0; j < kKeysInFlight; ++j) {
      const bool in_range = base + 32 * j + lane < end;
      greater += in_range && keys[j] > prefix ? 1 : 0;
      equal += in_range && keys[j] == prefix ? 1 : 0;
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    greater += __shfl_xor_sync(0xffffffffu, greater, offset);
    equal += __shfl_xor_sync(0xffffffffu, equal, offset);
  }
  if (lane == 0) warp_greater[warp] = greater, warp_equal[warp] = equal;
  __syncthreads();
  int written = 0, equal_seen = 0;  // before this warp's range: outputs, keys equal to the k-th
  for (int w = 0; w < warp; ++w) {
    written += warp_greater[w] + min(warp_equal[w], max(0, remaining - equal_seen));
    equal_seen += warp_equal[w];
  }
  const unsigned lanes_below = (1u << lane) - 1u;
  for (int first = begin; first < end; first += 32 * kKeysInFlight) {
    unsigned keys[kKeysInFlight];
    load_keys(first, keys);
#pragma unroll
    for (int j = 0; j < kKeysInFlight; ++j) {
      const int i = first + 32 * j + lane;
      const unsigned u = keys[j];
      const bool is_equal = i < end && u == prefix;
      const unsigned equal_lanes = __ballot_sync(0xffffffffu, is_equal);
      const bool take = i < end && (u > prefix || (is_equal && equal_seen + __popc(equal_lanes & lanes_below) < remaining));
      const unsigned take_lanes = __ballot_sync(0xffffffffu, take);
      if (take) out[written + __popc(take_lanes & lanes_below)] = i;
      written += __popc(take_lanes);
      equal_seen += __popc(equal_lanes);
    }
  }
}

// 4. grid (candidates / warps, kv heads, rows), a warp per candidate.
__global__ void rerank_kernel(PqSelectLaunch p) {
  extern __shared__ float qsum[];
  const PqSelectRow r = p.rows[blockIdx.z];
  const int g = blockIdx.y, d = p.index.head_dim;
  if (r.all || r.candidates <= r.k) return;
  group_query(p.q, blockIdx.z, g, p.num_heads, p.num_kv_heads, d, qsum);
  __syncthreads();
  const int i = blockIdx.x * blockDim.y + threadIdx.y;
  if (i >= r.candidates) return;
  const long long row = (i64(blockIdx.z) * p.num_kv_heads + g) * p.scratch.max_candidates;
  const int t = r.init_end + p.scratch.ranked[row + i];
  const uint16_t* key = p.source.k + paged_offset(p.source, r.sequence, g, t);
  uint16_t* kept_key = p.scratch.keys + (row + i) * d;
  // 8 bytes a lane: a warp reads a 128-dim key in one 256-byte request (over PCIe with @offload).
  double sum = 0.0;
  for (int c = threadIdx.x; c < d / 4; c += 32) {
    const uint2 four = reinterpret_cast<const uint2*>(key)[c];
    reinterpret_cast<uint2*>(kept_key)[c] = four;
    const unsigned words[2] = {four.x, four.y};
    for (int j = 0; j < 4; ++j) {
      const uint16_t h = uint16_t(words[j / 2] >> (16 * (j % 2)));
      sum += double(qsum[4 * c + j]) * double(__half2float(__ushort_as_half(h)));
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (threadIdx.x == 0) p.scratch.exact[row + i] = float(sum);
}

// 5. grid (selected / warps, kv heads, rows), a warp per selected token: 8-byte loads.
__global__ void gather_kernel(PqSelectLaunch p) {
  const PqSelectRow r = p.rows[blockIdx.z];
  const int g = blockIdx.y, d = p.index.head_dim;
  const int i = blockIdx.x * blockDim.y + threadIdx.y;
  if (i >= r.selected) return;
  const long long row = (i64(blockIdx.z) * p.num_kv_heads + g) * p.scratch.max_candidates;
  int t = i;
  const uint16_t* key = nullptr;
  if (!r.all && i >= r.init_end) {
    if (i < r.init_end + r.k) {
      const int j = i - r.init_end;  // the j-th kept, ascending
      const int c = r.candidates > r.k ? p.scratch.kept[row + j] : j;
      t = r.init_end + p.scratch.ranked[row + c];
      if (r.candidates > r.k) key = p.scratch.keys + (row + c) * d;
    } else {
      t = r.middle_end + (i - r.init_end - r.k);
    }
  }
  const long long from = paged_offset(p.source, r.sequence, g, t);
  if (key == nullptr) key = p.source.k + from;
  const int block = blockIdx.z * p.out_blocks_per_row + i / kCudaBlockTokens;
  const long long to = ((i64(block) * p.num_kv_heads + g) * kCudaBlockTokens + i % kCudaBlockTokens) * d;
  const uint2* k_in = reinterpret_cast<const uint2*>(key);
  const uint2* v_in = reinterpret_cast<const uint2*>(p.source.v + from);
  uint2* k_out = reinterpret_cast<uint2*>(p.out_k + to);
  uint2* v_out = reinterpret_cast<uint2*>(p.out_v + to);
  for (int c = threadIdx.x; c < d / 4; c += 32) {
    k_out[c] = k_in[c];
    v_out[c] = v_in[c];
  }
}

unsigned ceil_div(int a, int b) { return unsigned((a + b - 1) / b); }

}  // namespace

Status top_k_rows(const float* scores, long long score_stride, const int* n, const int* k, int per_length, int rows,
                  int* out, long long out_stride) {
  if (rows == 0) return Status::ok();
  top_k_kernel<<<rows, kTopKThreads>>>(scores, score_stride, n, k, per_length, out, out_stride);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status pq_select_and_gather(const PqSelectLaunch& p) {
  if (p.num_rows == 0) return Status::ok();
  const int heads = p.num_kv_heads, rows = p.num_rows;
  const size_t q_bytes = size_t(p.index.head_dim) * sizeof(float);
  if (p.max_trained_segments > 0 && p.max_middle > 0) {
    tables_kernel<<<dim3(unsigned(p.max_trained_segments), unsigned(heads), unsigned(rows)), 128, q_bytes>>>(p);
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
    adc_kernel<<<dim3(ceil_div(p.max_middle, 256), unsigned(heads), unsigned(rows)), 256>>>(p);
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
    const PqSelectScratch& s = p.scratch;
    SLIMKV_RETURN_IF_ERROR(top_k_rows(s.scores, s.max_middle, s.lengths, s.lengths + rows, heads, rows * heads, s.ranked,
                                      s.max_candidates));
    if (p.max_candidates > 0) {
      const dim3 warps(32, kWarpsPerBlock);
      rerank_kernel<<<dim3(ceil_div(p.max_candidates, kWarpsPerBlock), unsigned(heads), unsigned(rows)), warps, q_bytes>>>(p);
      SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
      SLIMKV_RETURN_IF_ERROR(top_k_rows(s.exact, s.max_candidates, s.lengths + 2 * rows, s.lengths + 3 * rows, heads,
                                        rows * heads, s.kept, s.max_candidates));
    }
  }
  if (p.max_selected > 0) {
    gather_kernel<<<dim3(ceil_div(p.max_selected, kWarpsPerBlock), unsigned(heads), unsigned(rows)), dim3(32, kWarpsPerBlock)>>>(p);
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  }
  return Status::ok();
}

}  // namespace slimkv::cuda
