#include "kv/cuda/top_k_rows.h"

#include "backend/cuda/cuda_check.h"

namespace slimkv::cuda {
namespace {

using i64 = long long;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kKeysInFlight = 8;  // per thread: loaded before the first is used (a pass waits on loads)
static_assert(kTopKSlice == kThreads * kKeysInFlight, "a slice is one round of every thread's loads");
constexpr int kBins = 256;  // 8 bits a pass
constexpr int kPasses = 4;
constexpr unsigned kAllLanes = 0xffffffffu;

__device__ int shift_of(int pass) { return 24 - 8 * pass; }

// Larger floats, larger keys (zeros of both signs one key: they compare equal).
__device__ unsigned order_key(float f) {
  const unsigned u = __float_as_uint(f == 0.0f ? 0.0f : f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The select's progress on a row: the high bits of the k-th highest key settled so far (prefix, the bits
// under mask), and its rank among the keys that match them, from the highest. Once every bit is settled,
// prefix is the k-th's key and `remaining` how many keys equal to it are kept. (No member initializers:
// it is also a __shared__ variable.)
struct RadixState {
  unsigned prefix, mask;
  int remaining;
};

struct KeyCounts {
  int greater, equal;  // keys above the k-th's, equal to it
};

// ---- the passes ----

// hist[b] += how many keys of s[begin, end) match the state's prefix with digit b at `shift` (block-wide).
// Scores cluster in few bins (the top byte is sign and exponent): lanes of a warp that hit the same bin
// add once, through their leader.
__device__ void count_digits(const float* s, int begin, int end, RadixState state, int shift, int* hist) {
  for (int base = begin; base < end; base += kThreads * kKeysInFlight) {
    unsigned keys[kKeysInFlight];
#pragma unroll
    for (int j = 0; j < kKeysInFlight; ++j) {
      const int i = base + j * kThreads + int(threadIdx.x);
      keys[j] = i < end ? order_key(s[i]) : 0u;
    }
#pragma unroll
    for (int j = 0; j < kKeysInFlight; ++j) {
      const int i = base + j * kThreads + int(threadIdx.x);
      const unsigned bin = (i < end && (keys[j] & state.mask) == state.prefix) ? (keys[j] >> shift) & 255u : 256u;
      const unsigned peers = __match_any_sync(kAllLanes, bin);
      if (bin < 256u && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
    }
  }
}

// The state with the digit at `shift` settled, from hist (shared, complete: every key that matches the
// state's prefix, by that digit): the highest bin whose keys and those of the bins above reach
// `remaining`. Warp 0 finds it: each lane sums 8 bins (lane 0 the top ones), a scan over the lanes finds
// the lane whose bins reach it, and the bins are walked down from that lane's first (a walk from bin 255
// by one thread cost up to 256 dependent steps a pass). Every thread of the block gets the state.
__device__ RadixState settle_digit(const int* hist, int shift, RadixState state) {
  __shared__ RadixState settled;
  if (threadIdx.x < 32) {
    const int lane = int(threadIdx.x), top = kBins - 1 - 8 * lane;  // the lane's bins: top down to top - 7
    int sum = 0;
    for (int j = 0; j < 8; ++j) sum += hist[top - j];
    int through = sum;  // keys in bins 255 down to the lane's last
    for (int offset = 1; offset < 32; offset *= 2) {
      const int before = __shfl_up_sync(kAllLanes, through, offset);
      if (lane >= offset) through += before;
    }
    const unsigned reached = __ballot_sync(kAllLanes, through >= state.remaining);
    // No lane: a state no bin satisfies (it cannot arise) ends at bin 0, as the walk from the top did.
    const int owner = reached != 0u ? __ffs(int(reached)) - 1 : 31;
    int above = __shfl_sync(kAllLanes, through - sum, owner);
    int bin = kBins - 1 - 8 * owner;
    for (; bin > 0 && above + hist[bin] < state.remaining; --bin) above += hist[bin];
    if (lane == 0) settled = RadixState{state.prefix | (unsigned(bin) << shift), state.mask | (255u << shift), state.remaining - above};
  }
  __syncthreads();
  const RadixState next = settled;
  __syncthreads();  // read by all before a next call writes it, and hist free to reuse
  return next;
}

// ---- the ordered write ----

// Warp w's share of [begin, end): the w-th of kWarps equal ranges (each read coalesced by its warp).
__device__ void warp_range(int begin, int end, int& first, int& last) {
  const int span = (end - begin + kWarps - 1) / kWarps;
  first = min(end, begin + int(threadIdx.x / 32) * span);
  last = min(end, first + span);
}

// A warp's keys from base, 32 · kKeysInFlight of them (those before `last`), all loaded before the first is used.
__device__ void load_keys(const float* s, int base, int last, unsigned (&keys)[kKeysInFlight]) {
#pragma unroll
  for (int j = 0; j < kKeysInFlight; ++j) {
    const int i = base + 32 * j + int(threadIdx.x % 32);
    keys[j] = i < last ? order_key(s[i]) : 0u;
  }
}

// This lane's keys of its warp's range [first, last) above and equal to the k-th's key `kth`.
__device__ KeyCounts count_keys(const float* s, int first, int last, unsigned kth) {
  KeyCounts counts{0, 0};
  for (int base = first; base < last; base += 32 * kKeysInFlight) {
    unsigned keys[kKeysInFlight];
    load_keys(s, base, last, keys);
#pragma unroll
    for (int j = 0; j < kKeysInFlight; ++j) {
      const bool in_range = base + 32 * j + int(threadIdx.x % 32) < last;
      counts.greater += in_range && keys[j] > kth ? 1 : 0;
      counts.equal += in_range && keys[j] == kth ? 1 : 0;
    }
  }
  return counts;
}

__device__ KeyCounts warp_sum(KeyCounts c) {
  for (int offset = 16; offset > 0; offset /= 2) {
    c.greater += __shfl_xor_sync(kAllLanes, c.greater, offset);
    c.equal += __shfl_xor_sync(kAllLanes, c.equal, offset);
  }
  return c;
}

// Every thread: the sum of every thread's counts.
__device__ KeyCounts block_sum(KeyCounts c) {
  __shared__ KeyCounts warps[kWarps];
  c = warp_sum(c);
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = c;
  __syncthreads();
  KeyCounts total{0, 0};
  for (int w = 0; w < kWarps; ++w) total.greater += warps[w].greater, total.equal += warps[w].equal;
  __syncthreads();  // read by all before a next call writes
  return total;
}

// In index order, the indices of s[begin, end) whose keys are above the k-th's (state: every bit
// settled) and, of those equal to it, the ones among the row's first state.remaining: `before` counts
// the row's keys before `begin` (block-wide). The warps' counts give each warp its first output slot and
// how many equal keys precede it; within a warp, ballots order the lanes. (A block-wide scan per 1024
// scores cost two scans and four barriers each: at 128K tokens that pass took most of a layer's
// selection, one CTA per row.)
__device__ void write_indices(const float* s, int begin, int end, RadixState state, KeyCounts before, int* out) {
  __shared__ KeyCounts warp_counts[kWarps];
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  int first = 0, last = 0;
  warp_range(begin, end, first, last);
  const KeyCounts mine = warp_sum(count_keys(s, first, last, state.prefix));
  if (lane == 0) warp_counts[warp] = mine;
  __syncthreads();
  int equal_seen = before.equal, greater = before.greater;
  for (int w = 0; w < warp; ++w) greater += warp_counts[w].greater, equal_seen += warp_counts[w].equal;
  int written = greater + min(equal_seen, state.remaining);  // the equal keys kept are the first ones
  const unsigned lanes_below = (1u << lane) - 1u;
  for (int base = first; base < last; base += 32 * kKeysInFlight) {
    unsigned keys[kKeysInFlight];
    load_keys(s, base, last, keys);
#pragma unroll
    for (int j = 0; j < kKeysInFlight; ++j) {
      const int i = base + 32 * j + lane;
      const unsigned u = keys[j];
      const bool is_equal = i < last && u == state.prefix;
      const unsigned equal_lanes = __ballot_sync(kAllLanes, is_equal);
      const bool take =
          i < last && (u > state.prefix || (is_equal && equal_seen + __popc(equal_lanes & lanes_below) < state.remaining));
      const unsigned take_lanes = __ballot_sync(kAllLanes, take);
      if (take) out[written + __popc(take_lanes & lanes_below)] = i;
      written += __popc(take_lanes);
      equal_seen += __popc(equal_lanes);
    }
  }
}

// ---- one CTA per row ----

__global__ void __launch_bounds__(kThreads) top_k_row_kernel(TopKRows p) {
  __shared__ int hist[kBins];
  const int row = int(blockIdx.x);
  const int n = p.n[row / p.per_length], k = min(p.k[row / p.per_length], n);
  const float* s = p.scores + row * p.score_stride;
  int* out = p.out + row * p.out_stride;
  if (k <= 0) return;
  if (k == n) {
    for (int i = int(threadIdx.x); i < n; i += kThreads) out[i] = i;
    return;
  }
  RadixState state{0u, 0u, k};
  for (int pass = 0; pass < kPasses; ++pass) {
    for (int b = int(threadIdx.x); b < kBins; b += kThreads) hist[b] = 0;
    __syncthreads();
    count_digits(s, 0, n, state, shift_of(pass), hist);
    __syncthreads();
    state = settle_digit(hist, shift_of(pass), state);
  }
  write_indices(s, 0, n, state, KeyCounts{0, 0}, out);
}

// ---- sliced rows: grid (slices, rows) ----

// A CTA's slice [begin, end) of row blockIdx.y, and the row's scratch.
struct RowSlice {
  const float* scores;  // the row's
  int* out;             // the row's
  int n, k, begin, end;
  int* hist;            // the row's [kPasses, kBins] histograms (zeroed before the first pass)
  KeyCounts* counts;    // the row's [slices]
  __device__ bool ranks() const { return k > 0 && k < n && begin < n; }
};

__device__ RowSlice row_slice(const TopKRows& p) {
  const int row = int(blockIdx.y);
  RowSlice r;
  r.scores = p.scores + row * p.score_stride;
  r.out = p.out + row * p.out_stride;
  r.n = p.n[row / p.per_length];
  r.k = min(p.k[row / p.per_length], r.n);
  r.begin = int(blockIdx.x) * kTopKSlice;
  r.end = min(r.n, r.begin + kTopKSlice);
  r.hist = p.scratch + i64(row) * kPasses * kBins;
  r.counts = reinterpret_cast<KeyCounts*>(p.scratch + i64(p.rows) * kPasses * kBins) + i64(row) * gridDim.x;
  return r;
}

// Every thread: the state after the first `passes` digits, from the row's histograms of them (complete:
// earlier kernels added every slice's). Each CTA settles them itself: the histograms are loaded at once
// into hists (shared [kPasses, kBins]), then each digit settles in shared memory.
__device__ RadixState settled_state(const RowSlice& slice, int passes, int* hists) {
  for (int b = int(threadIdx.x); b < passes * kBins; b += kThreads) hists[b] = slice.hist[b];
  __syncthreads();
  RadixState state{0u, 0u, slice.k};
  for (int pass = 0; pass < passes; ++pass) state = settle_digit(hists + pass * kBins, shift_of(pass), state);
  return state;
}

// Adds the slice's histogram of the digit of `pass` into the row's.
__global__ void __launch_bounds__(kThreads) slice_histogram_kernel(TopKRows p, int pass) {
  __shared__ int hists[kPasses * kBins];  // the settled digits', then this pass's at [pass]
  const RowSlice slice = row_slice(p);
  if (!slice.ranks()) return;
  const RadixState state = settled_state(slice, pass, hists);
  int* hist = hists + pass * kBins;
  for (int b = int(threadIdx.x); b < kBins; b += kThreads) hist[b] = 0;
  __syncthreads();
  count_digits(slice.scores, slice.begin, slice.end, state, shift_of(pass), hist);
  __syncthreads();
  for (int b = int(threadIdx.x); b < kBins; b += kThreads) {
    if (hist[b] != 0) atomicAdd(&slice.hist[pass * kBins + b], hist[b]);
  }
}

// The slice's keys above and equal to the k-th.
__global__ void __launch_bounds__(kThreads) slice_count_kernel(TopKRows p) {
  __shared__ int hists[kPasses * kBins];
  const RowSlice slice = row_slice(p);
  if (!slice.ranks()) return;
  const RadixState state = settled_state(slice, kPasses, hists);
  int first = 0, last = 0;
  warp_range(slice.begin, slice.end, first, last);
  const KeyCounts total = block_sum(count_keys(slice.scores, first, last, state.prefix));
  if (threadIdx.x == 0) slice.counts[blockIdx.x] = total;
}

// The slice's kept indices, after those of the slices before it.
__global__ void __launch_bounds__(kThreads) slice_write_kernel(TopKRows p) {
  __shared__ int hists[kPasses * kBins];
  const RowSlice slice = row_slice(p);
  if (slice.k <= 0 || slice.begin >= slice.n) return;
  if (slice.k == slice.n) {
    for (int i = slice.begin + int(threadIdx.x); i < slice.end; i += kThreads) slice.out[i] = i;
    return;
  }
  const RadixState state = settled_state(slice, kPasses, hists);
  KeyCounts before{0, 0};
  for (int w = int(threadIdx.x); w < int(blockIdx.x); w += kThreads) {
    before.greater += slice.counts[w].greater;
    before.equal += slice.counts[w].equal;
  }
  write_indices(slice.scores, slice.begin, slice.end, state, block_sum(before), slice.out);
}

int slices_of(int max_n) { return max_n > 0 ? (max_n + kTopKSlice - 1) / kTopKSlice : 0; }

}  // namespace

size_t top_k_scratch_ints(int rows, int max_n) {
  return size_t(rows) * (size_t(kPasses * kBins) + sizeof(KeyCounts) / sizeof(int) * size_t(slices_of(max_n)));
}

Status top_k_rows(const TopKRows& p) {
  if (p.rows <= 0) return Status::ok();
  const int slices = slices_of(p.max_n);
  if (slices <= 1) {
    top_k_row_kernel<<<unsigned(p.rows), kThreads>>>(p);
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
    return Status::ok();
  }
  if (p.scratch == nullptr) {
    return error("top_k_rows: rows of up to max_n=", p.max_n, " scores are cut into ", slices,
                 " slices and need scratch (top_k_scratch_ints), got none");
  }
  if (p.rows > 65535) return error("top_k_rows: rows=", p.rows, " of sliced rows; at most 65535 (a grid's y)");
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(p.scratch, 0, size_t(p.rows) * kPasses * kBins * sizeof(int), 0));
  const dim3 grid(unsigned(slices), unsigned(p.rows));
  for (int pass = 0; pass < kPasses; ++pass) {
    slice_histogram_kernel<<<grid, kThreads>>>(p, pass);
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  }
  slice_count_kernel<<<grid, kThreads>>>(p);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  slice_write_kernel<<<grid, kThreads>>>(p);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

}  // namespace slimkv::cuda
