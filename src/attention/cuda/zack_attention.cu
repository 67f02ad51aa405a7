#include "attention/cuda/zack_attention.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "attention/cuda/device_ops.cuh"
#include "attention/cuda/softmax_state.cuh"
#include "attention/cuda/zack_prefill_attention.cuh"
#include "attention/split_rule.h"
#include "backend/cuda/cuda_check.h"

namespace slimkv::cuda {
namespace {

// A CTA takes one task at a time and stages each of its blocks once (shared memory sized by the ranks: up
// to 64 KB at full rank); warp w attends tokens 16w..16w + 15 of every block with its own online-softmax
// partial, so a block is a quarter of each warp's work and four times the warps fit beside the staging
// (one warp per staged block held 4 warps an SM: 1.2–1.6x dense at compression 0.5, DRAM half busy).
constexpr int kZackWarps = kCudaBlockTokens / 16;
constexpr int kZackThreads = kZackWarps * 32;
constexpr int kMaxRank = 128;  // a query's 8 k-steps of 16 dims and an output's 16 n-tiles of 8, in registers
// A task's cost per block: the K and V rows it stages and multiplies, plus a fixed part (the barrier,
// the softmax, the mma chains' latency) in rows' worth. Fitted on H100 (batch 8, 64K, skewed ranks,
// uniform ranges): a block of 256 staged rows took ~2.75 µs of a CTA, one of 32 rows ~1.2 µs, i.e.
// ~1 µs + rows · 7 ns: 144 rows. (Costing rows alone gave rank-8 heads 4.5x the blocks of rank-128
// ones and ran 1.4x slower than equal ranges.)
constexpr int kBlockOverheadRows = 144;
// The same for a block of the prefill kernel (zack_prefill_attention.cuh), in dims of K' and V' rounded
// to 16: its mma work grows with the dims, the softmax of 128 rows × 64 tokens (exp2, max, the mask) does
// not. Not fitted yet: the dense kernel at d 128 spends roughly a third of its time off the tensor cores
// (docs/results/cuda/prefill_instruction_mix_h100.txt: 128 of 796 instructions a unit are HMMA).
constexpr int kPrefillBlockOverheadDims = 128;

// K and V dims rounded up to 16: an mma's k (Q·K'ᵀ) and two n-tiles of 8 (P·V', one ldmatrix.x4).
__host__ __device__ inline int round16(int dims) { return (dims + 15) / 16 * 16; }

// Rows of kCudaBlockTokens halves that one (block, KV head) takes staged: K' dims, then V' dims.
__host__ __device__ inline int staged_rows(int k_rank, int v_rank) { return round16(k_rank) + round16(v_rank); }

struct ZackLaunch {
  const __half* q;  // [queries, num_heads, head_dim]
  __half* out;
  const __half* blocks;
  long long block_elements;
  const ZackHeadLayout* heads;
  const int* block_tables;
  int block_table_stride;
  const int* metadata;  // lay_out_attention_batch's
  int max_batch, tiles_offset;
  const ZackTask* tasks;      // the layer's, canonical order
  const int* order;           // the layer's execution order
  const int* unit_tasks;      // the layer's [units + 1]
  int* counter;               // the layer's next task (dynamic scheduling; the merge resets it)
  int num_tasks;
  bool dynamic;               // take tasks from the counter (balanced); else CTA c takes c, c + CTAs, ...
  int staged_elements;        // one staging buffer: staged_rows at the largest ranks, of kCudaBlockTokens halves
  int num_heads, num_kv_heads, head_dim, group, positions_per_tile;
  float scale_log2;
  float* partial_acc;         // [num_tasks, rows, head_dim]: each task's (its warps' merged)
  float* partial_max_sum;     // [num_tasks, rows, 2]
};

// Where a query tile's rows sit: row r is query query_begin + r / group (at position first_position +
// r / group of the sequence), head kv_head · group + r % group.
struct ZackTile {
  int sequence, kv_len, query_begin, first_position, active_rows;
  __device__ ZackTile(const ZackLaunch& p, int tile) {
    const int* kv_lens = p.metadata + p.max_batch;
    const int* query_starts = p.metadata + 2 * p.max_batch;
    const int* tiles = p.metadata + p.tiles_offset;
    const int b = tiles[2 * tile], first = tiles[2 * tile + 1];
    const int n = query_starts[b + 1] - query_starts[b];
    sequence = p.metadata[b];
    kv_len = kv_lens[b];
    query_begin = query_starts[b] + first;
    first_position = kv_len - n + first;
    active_rows = p.group * min(p.positions_per_tile, n - first);
  }
};

// What a CTA reads of a task to stage its blocks and attend them.
struct TaskView {
  ZackTask task;
  ZackHeadLayout head;
  ZackTile tile;
  const int* table;  // the sequence's block table
  int k_rows, rows;  // staged: K' dims rounded up to 16, and K' + V' rows

  __device__ TaskView(const ZackLaunch& p, int index)
      : task(p.tasks[index]), head(p.heads[task.kv_head]), tile(p, task.tile),
        table(p.block_tables + size_t(tile.sequence) * p.block_table_stride), k_rows(round16(head.k_rank)),
        rows(staged_rows(head.k_rank, head.v_rank)) {}

  // Issues the copies of block `block`'s part of the head into `to`, rows swizzled, pad rows zero, as one
  // cp.async group. A thread copies chunk threadIdx.x % 8 of rows threadIdx.x / 8 + 16j (the CTA's
  // 128 threads are 16 rows of 8 chunks), so its chunk and swizzle stay fixed and the copies are all the
  // index arithmetic it does.
  __device__ void stage(const ZackLaunch& p, int block, __half* to) const {
    static_assert(kZackThreads == 16 * 8, "16 rows of 8 chunks per pass");
    const int chunk = threadIdx.x % 8, first_row = threadIdx.x / 8;
    const __half* from = p.blocks + size_t(table[block]) * size_t(p.block_elements) + head.k_offset + chunk * 8;
    __half* k_to = to + swizzled<kCudaBlockTokens>(first_row, chunk);
    for (int row = first_row; row < k_rows; row += 16, k_to += 16 * kCudaBlockTokens) {
      cp_async_16(k_to, from + row * kCudaBlockTokens, row < head.k_rank);
    }
    // V past the sequence's end: zeros (see cp_async_16).
    const int v_bytes = 2 * max(0, min(8, tile.kv_len - block * kCudaBlockTokens - 8 * chunk));
    const __half* v_from = from + head.k_rank * kCudaBlockTokens;
    __half* v_to = to + swizzled<kCudaBlockTokens>(k_rows + first_row, chunk);
    for (int row = first_row; row < rows - k_rows; row += 16, v_to += 16 * kCudaBlockTokens) {
      cp_async_16_partial(v_to, v_from + row * kCudaBlockTokens, row < head.v_rank ? v_bytes : 0);
    }
    cp_async_commit();
  }
};

// One warp's partial (base-2 max, sum, weighted V') of a task's rows over the warp's 16 tokens of each
// block, on the tensor cores (m16n8k16 FP16 mma, FP32 sums; the tile's at most 8 rows are rows 0..7 of
// the m16 tile, rows 8..15 zero):
//   S = Q'·K'ᵀ: Q' (the rows' reduced queries) is the A operand, held in registers for the task; K' the
//       B operand by ldmatrix.trans from the staged block (dims are its rows);
//   P·V': P from S's accumulators (the C layout of two n-tiles is the A layout of one k-step), V' the
//       B operand by ldmatrix (dims are its rows, tokens its columns).
// Lane (g = lane / 4, i = lane % 4) holds row g's scores of the warp's tokens 8n + 2i, +1 and outputs
// of dims 8n + 2i, +1 (device_ops.cuh mma_16816_rows_0_to_7).
template <int kRows>
struct WarpPartial {
  int warp, lane, g, i;
  uint32_t qa[8][2];   // k-step s: dims 16s + 2i, +1 and 16s + 8 + 2i, +1 of row g (rows g + 8 are zero)
  float o[16][2];      // [n-tile of 8 V' dims][C fragment of rows 0..7]
  float row_max, row_sum;  // row g's max (the same in its 4 lanes); sum over this lane's tokens

  __device__ WarpPartial() : warp(threadIdx.x / 32), lane(threadIdx.x % 32), g(lane / 4), i(lane % 4) {}

  // A new task: its rows' queries pre-scaled to base 2 (dims past k_rank 0), nothing attended yet.
  __device__ void begin(const ZackLaunch& p, const TaskView& t) {
    const bool active = g < t.tile.active_rows;
    const __half* q_row = p.q;
    if (active) {
      const int query = t.tile.query_begin + g / p.group, h = t.task.kv_head * p.group + g % p.group;
      q_row += (size_t(query) * p.num_heads + h) * p.head_dim;
    }
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      if (16 * s >= t.k_rows) break;  // attend() reads no further
      float x[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int dim = 16 * s + 8 * (c / 2) + 2 * i + c % 2;
        x[c] = active && dim < t.head.k_rank ? __half2float(q_row[dim]) * p.scale_log2 : 0.0f;
      }
      qa[s][0] = pack_halves(x[0], x[1]);
      qa[s][1] = pack_halves(x[2], x[3]);
    }
#pragma unroll
    for (int n = 0; n < 16; ++n) o[n][0] = o[n][1] = 0.0f;
    row_max = -INFINITY, row_sum = 0.0f;
  }

  // The warp's tokens of block `block`, staged at k_staged.
  __device__ void attend(const ZackLaunch& p, const TaskView& t, int block, const __half* k_staged) {
    const __half* v_staged = k_staged + t.k_rows * kCudaBlockTokens;
    // S: n-tile n holds tokens 16·warp + 8n + 0..7; ldmatrix.x4.trans matrix m = lane / 8 is dims
    // 16·step + 8(m % 2) + 0..7 of tokens 16·warp + 8(m / 2) + 0..7: the B fragments of both n-tiles.
    float s[2][2] = {};
#pragma unroll
    for (int step = 0; step < 8; ++step) {
      if (16 * step >= t.k_rows) break;
      unsigned b[4];
      ldmatrix_x4_trans(b, k_staged + swizzled<kCudaBlockTokens>(16 * step + 8 * (lane / 8 % 2) + lane % 8,
                                                                2 * warp + lane / 16));
      mma_16816_rows_0_to_7(s[0], qa[step][0], qa[step][1], b[0], b[1]);
      mma_16816_rows_0_to_7(s[1], qa[step][0], qa[step][1], b[2], b[3]);
    }
    // Causal mask (a row sees the tokens up to its position), the online-softmax update of row g.
    const bool active = g < t.tile.active_rows;
    const int position = t.tile.first_position + g / p.group;
    const int first_token = block * kCudaBlockTokens + 16 * warp + 2 * i;
    float block_max = -INFINITY;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        if (!active || first_token + 8 * n + c > position) s[n][c] = -INFINITY;
        block_max = fmaxf(block_max, s[n][c]);
      }
    }
    block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 1));
    block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 2));
    const float new_max = fmaxf(row_max, block_max);
    const float reference = softmax_reference(new_max);
    const float factor = exp2f(row_max - reference);
    row_max = new_max;
    row_sum *= factor;
#pragma unroll
    for (int n = 0; n < 16; ++n) o[n][0] *= factor, o[n][1] *= factor;
    // P as the A fragment of the warp's k-step (its 16 tokens are S's two n-tiles).
    float e[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      e[c] = exp2f(s[c / 2][c % 2] - reference);
      row_sum += e[c];
    }
    const uint32_t a0 = pack_halves(e[0], e[1]), a1 = pack_halves(e[2], e[3]);
    // O += P·V': ldmatrix.x4 matrix m = lane / 8 is dims 16·pair + 8(m / 2) + 0..7 of tokens 16·warp +
    // 8(m % 2) + 0..7: the B fragments of n-tiles 2·pair and 2·pair + 1.
    const int v_tiles = round16(t.head.v_rank) / 8;
#pragma unroll
    for (int pair = 0; pair < 8; ++pair) {
      if (2 * pair >= v_tiles) break;
      unsigned b[4];
      ldmatrix_x4(b, v_staged + swizzled<kCudaBlockTokens>(16 * pair + 8 * (lane / 16) + lane % 8, 2 * warp + lane / 8 % 2));
      mma_16816_rows_0_to_7(o[2 * pair], a0, a1, b[0], b[1]);
      mma_16816_rows_0_to_7(o[2 * pair + 1], a0, a1, b[2], b[3]);
    }
  }

  // Writes the partial of task `index`: the warps' partials of each row merged, in warp order, through
  // `merged` (shared memory, merge_bytes(kRows): the staging's, once every warp is past the last block),
  // so that a unit's partials are its tasks' and the merge kernel reads a quarter of the warps' (a long
  // sequence's unit has a wave's share of tasks, issue 22).
  __device__ void finish(const ZackLaunch& p, const TaskView& t, int index, float* merged) {
    row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
    row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 2);
    float* warp_acc = merged;                                    // [kZackWarps, kRows, kMaxRank]
    float* warp_max_sum = merged + kZackWarps * kRows * kMaxRank;  // [kZackWarps, kRows, 2]
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the staged blocks
    if (g < kRows) {
      const int slot = warp * kRows + g;
#pragma unroll
      for (int n = 0; n < 16; ++n) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int dim = 8 * n + 2 * i + c;
          if (dim < t.head.v_rank) warp_acc[slot * kMaxRank + dim] = o[n][c];
        }
      }
      if (i == 0) {
        warp_max_sum[2 * slot] = row_max;
        warp_max_sum[2 * slot + 1] = row_sum;
      }
    }
    __syncthreads();
    const int v_rank = t.head.v_rank;
    for (int e = threadIdx.x; e < kRows * v_rank; e += kZackThreads) {
      const int r = e / v_rank, dim = e % v_rank;
      float max_all = -INFINITY;
#pragma unroll
      for (int w = 0; w < kZackWarps; ++w) max_all = fmaxf(max_all, warp_max_sum[2 * (w * kRows + r)]);
      const float reference = softmax_reference(max_all);
      float total = 0.0f, weighted = 0.0f;
#pragma unroll
      for (int w = 0; w < kZackWarps; ++w) {
        const float factor = exp2f(warp_max_sum[2 * (w * kRows + r)] - reference);
        total += factor * warp_max_sum[2 * (w * kRows + r) + 1];
        weighted += factor * warp_acc[(w * kRows + r) * kMaxRank + dim];
      }
      const size_t row = size_t(index) * kRows + r;
      p.partial_acc[row * p.head_dim + dim] = weighted;
      if (dim == 0) {
        p.partial_max_sum[2 * row] = max_all;
        p.partial_max_sum[2 * row + 1] = total;
      }
    }
  }
};

// Shared memory the warps' partials of a task take to be merged (WarpPartial::finish).
constexpr size_t merge_bytes(int rows) { return size_t(kZackWarps) * size_t(rows) * (kMaxRank + 2) * sizeof(float); }

// Waits until at most `pending` (0..kMaxStages - 2) of this thread's cp.async groups are in flight.
constexpr int kMaxStages = 8;
__device__ __forceinline__ void cp_async_wait_at_most(int pending) {
  switch (pending) {
    case 0: return cp_async_wait<0>();
    case 1: return cp_async_wait<1>();
    case 2: return cp_async_wait<2>();
    case 3: return cp_async_wait<3>();
    case 4: return cp_async_wait<4>();
    case 5: return cp_async_wait<5>();
    default: return cp_async_wait<6>();
  }
}

// A CTA's task: its blocks stream through a ring of staging slots, each block's part of the head copied
// once by cp.async while the blocks before it are attended. The ring fills the CTA's staging memory (two
// blocks at the layer's largest ranks), so a task of low-rank heads keeps more, smaller blocks in flight
// (up to kMaxStages): with two, a block cost a memory round trip whatever its size, and a rank-8 head's
// task took as long per block as a rank-128 one.
template <int kRows>
__device__ void attend_task(const ZackLaunch& p, const TaskView& task, int index, WarpPartial<kRows>& partial,
                            __half* staging) {
  const int slot_elements = task.rows * kCudaBlockTokens;
  const int stages = min(kMaxStages, 2 * p.staged_elements / slot_elements);  // at least 2
  const int first = task.task.block_begin, count = task.task.block_end - first;
  partial.begin(p, task);
  for (int j = 0; j < stages - 1; ++j) {  // one group per slot, empty past the task's blocks
    if (j < count) {
      task.stage(p, first + j, staging + j * slot_elements);
    } else {
      cp_async_commit();
    }
  }
  for (int j = 0; j < count; ++j) {
    cp_async_wait_at_most(stages - 2);
    __syncthreads();  // block j has landed, and every warp is past block j - 1, whose slot is refilled now
    const int ahead = j + stages - 1;
    if (ahead < count) {
      task.stage(p, first + ahead, staging + (ahead % stages) * slot_elements);
    } else {
      cp_async_commit();
    }
    partial.attend(p, task, first + j, staging + (j % stages) * slot_elements);
  }
  partial.finish(p, task, index, reinterpret_cast<float*>(staging));
}

// A CTA takes tasks one after another: from the counter (balanced: longest first, a CTA taking the next
// when it is free) or statically (uniform: CTA c takes c, c + CTAs, ...).
template <int kRows>
__global__ void __launch_bounds__(kZackThreads, 3) zack_attention_kernel(ZackLaunch p) {
  extern __shared__ __align__(16) unsigned char staged[];  // shared_bytes(staged_elements, kRows)
  __shared__ int taken_by_cta;
  WarpPartial<kRows> partial;
  for (int turn = blockIdx.x;; turn += gridDim.x) {
    int taken = turn;
    if (p.dynamic) {
      if (threadIdx.x == 0) taken_by_cta = atomicAdd(p.counter, 1);
      __syncthreads();
      taken = taken_by_cta;
    }
    if (taken >= p.num_tasks) return;
    const int index = p.order[taken];
    attend_task<kRows>(p, TaskView(p, index), index, partial, reinterpret_cast<__half*>(staged));
    __syncthreads();  // every warp is done with the slots and taken_by_cta before the next task
  }
}

// A CTA's shared memory: its staging, two blocks at the largest ranks, and in the same bytes after a
// task's last block its warps' partials (merge_bytes).
size_t shared_bytes(int staged_elements, int rows) {
  return std::max(2 * size_t(staged_elements) * sizeof(__half), merge_bytes(rows));
}

// Merges each unit's task partials (the online-softmax rule) into the output rows; dims past the
// head's v_rank are written 0 (the folded W_O has zero columns there). A CTA per (unit, row): a long
// sequence's unit has a wave's share of tasks (about 50 at batch 1 on an H100), and one thread per dim
// walking them all in turn waited on each partial's load (30 µs a layer at 32K, dense's merge 6.5), so
// the CTA's threads are slices of the tasks × the dims: each slice sums its contiguous tasks in order,
// and the slices' sums are added in slice order. Slices and their bounds depend on the unit's task count
// and v_rank alone (each the sequence's and the head's), so the output keeps its bits whatever shares
// the step (issue 22).
constexpr int kMergeThreads = 512;

template <int kRows>
__global__ void __launch_bounds__(kMergeThreads) zack_merge_kernel(ZackLaunch p) {
  __shared__ float slice_acc[kMergeThreads];            // [slices, dims]
  __shared__ float slice_total[kMergeThreads / 32];     // [slices]
  __shared__ float warp_max_of[kMergeThreads / 32];
  const int unit = blockIdx.x, tile_index = unit / p.num_kv_heads, kv_head = unit % p.num_kv_heads;
  const ZackTile tile(p, tile_index);
  // The attention kernel is done with the counter: reset for the next run.
  if (unit == 0 && blockIdx.y == 0 && threadIdx.x == 0) *p.counter = 0;
  const int r = blockIdx.y;
  if (r >= tile.active_rows) return;
  // The unit's partials: its tasks', in their order.
  const int first = p.unit_tasks[unit], count = p.unit_tasks[unit + 1] - first;
  const int v_rank = p.heads[kv_head].v_rank;
  const float* max_sum = p.partial_max_sum + 2 * (size_t(first) * kRows + r);  // task t's at 2 · t · kRows
  // The reference: the largest max of any task (a max, so its order does not matter).
  float max_all = -INFINITY;
  for (int t = threadIdx.x; t < count; t += kMergeThreads) max_all = fmaxf(max_all, max_sum[2 * size_t(t) * kRows]);
  max_all = warp_max(max_all);
  if (threadIdx.x % 32 == 0) warp_max_of[threadIdx.x / 32] = max_all;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kMergeThreads / 32; ++w) max_all = fmaxf(max_all, warp_max_of[w]);
  const float reference = softmax_reference(max_all);
  // Thread (slice, dim): dims are v_rank rounded up to whole warps, so a slice's threads are whole warps.
  const int dims = (v_rank + 31) / 32 * 32, slices = kMergeThreads / dims;
  const int slice = threadIdx.x / dims, c = threadIdx.x % dims;
  if (slice < slices) {
    const int begin = count * slice / slices, end = count * (slice + 1) / slices;
    const float* acc = p.partial_acc + (size_t(first) * kRows + r) * p.head_dim + c;  // task t's at t · kRows · head_dim
    float total = 0.0f, weighted = 0.0f;
#pragma unroll 4
    for (int t = begin; t < end; ++t) {
      const float factor = exp2f(max_sum[2 * size_t(t) * kRows] - reference);
      total += factor * max_sum[2 * size_t(t) * kRows + 1];
      if (c < v_rank) weighted += factor * acc[size_t(t) * kRows * p.head_dim];
    }
    slice_acc[threadIdx.x] = weighted;
    if (c == 0) slice_total[slice] = total;
  }
  __syncthreads();
  const int query = tile.query_begin + r / p.group, h = kv_head * p.group + r % p.group;
  for (int d = threadIdx.x; d < p.head_dim; d += kMergeThreads) {
    float value = 0.0f;
    if (d < v_rank) {
      float total = 0.0f, weighted = 0.0f;
      for (int s = 0; s < slices; ++s) {
        total += slice_total[s];
        weighted += slice_acc[s * dims + d];
      }
      value = total > 0.0f ? weighted / total : 0.0f;
    }
    p.out[(size_t(query) * p.num_heads + h) * p.head_dim + d] = __float2half(value);
  }
}

}  // namespace

Expected<std::unique_ptr<CudaZackAttention>> CudaZackAttention::create(const ZackAttentionShape& shape) {
  const size_t heads = size_t(shape.num_layers) * size_t(shape.num_kv_heads);
  if (shape.num_layers < 1 || shape.num_kv_heads < 1 || shape.num_heads % shape.num_kv_heads != 0 ||
      shape.num_heads / shape.num_kv_heads > 8 || shape.head_dim < 2 || shape.head_dim > kMaxRank ||
      shape.head_dim % 2 != 0 || shape.max_batch < 1 || shape.max_queries < 1 || shape.tasks_per_cta < 1) {
    return error("CUDA ZACK attention: ", shape.num_heads, " query heads over ", shape.num_kv_heads,
                 " KV heads (a group of at most 8), head_dim ", shape.head_dim, " (even, at most ", kMaxRank, "), ",
                 shape.num_layers, " layers, batch ", shape.max_batch, ", queries ", shape.max_queries, ", tasks per CTA ",
                 shape.tasks_per_cta,
                 ": every size must be positive");
  }
  if (shape.k_ranks.size() != heads || shape.v_ranks.size() != heads) {
    return error("CUDA ZACK attention: ", shape.k_ranks.size(), " K and ", shape.v_ranks.size(),
                 " V ranks, expected one per layer and KV head (", heads, ")");
  }
  for (size_t i = 0; i < heads; ++i) {
    for (int rank : {shape.k_ranks[i], shape.v_ranks[i]}) {
      if (rank < 1 || rank > shape.head_dim) {
        return error("CUDA ZACK attention: layer ", i / size_t(shape.num_kv_heads), " KV head ",
                     i % size_t(shape.num_kv_heads), " has rank ", rank, ", expected 1..", shape.head_dim);
      }
    }
  }
  std::unique_ptr<CudaZackAttention> attention(new CudaZackAttention(shape));
  attention->group_ = shape.num_heads / shape.num_kv_heads;
  attention->rows_per_tile_ = attention->group_ <= 4 ? 4 : 8;
  attention->positions_per_tile_ = attention->rows_per_tile_ / attention->group_;
  for (size_t i = 0; i < heads; ++i) {
    attention->staged_elements_ =
        std::max(attention->staged_elements_, staged_rows(shape.k_ranks[i], shape.v_ranks[i]) * kCudaBlockTokens);
  }
  const size_t shared = shared_bytes(attention->staged_elements_, attention->rows_per_tile_);
  const auto kernel = attention->rows_per_tile_ == 4 ? zack_attention_kernel<4> : zack_attention_kernel<8>;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)));
  int resident = 0;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kZackThreads, shared));
  if (resident == 0) {
    return error("CUDA ZACK attention: ", shared, " bytes of shared memory to stage a block at the largest ranks do not fit");
  }
  attention->resident_ctas_ = resident * multiprocessor_count();
  if (prefill_head_dim_supported(shape.head_dim)) {
    const int prefill_resident = zack_prefill_attention_setup(shape.head_dim);
    if (prefill_resident == 0) {
      return error("CUDA ZACK attention: the tensor-core prefill kernel (head_dim ", shape.head_dim,
                   ") cannot run: its shared memory does not fit");
    }
    attention->prefill_target_ctas_ = prefill_resident * multiprocessor_count();
  }
  SLIMKV_ASSIGN_OR_RETURN(attention->counters_, DeviceArray<int>::allocate(size_t(shape.num_layers), "ZACK task counters"));
  SLIMKV_ASSIGN_OR_RETURN(attention->prefill_splits_per_tile_, DeviceArray<int>::allocate(heads, "ZACK prefill splits"));
  return Expected<std::unique_ptr<CudaZackAttention>>(std::move(attention));
}

namespace {

// Makes a device array hold at least n elements (doubling, so that steps growing by a little reallocate rarely).
template <typename T>
Status grow(DeviceArray<T>& array, size_t n, const char* what) {
  if (array.size() >= n) return Status::ok();
  SLIMKV_ASSIGN_OR_RETURN(array, DeviceArray<T>::allocate(std::max(n, 2 * array.size()), what));
  return Status::ok();
}

}  // namespace

Status CudaZackAttention::plan(const PagedAttentionBatch& batch, ZackSchedules schedules) {
  auto metadata = lay_out_attention_sequences(batch, shape_.max_batch, shape_.max_queries);
  if (!metadata) return metadata.status().with_context("CUDA ZACK attention");
  // Sequences of several queries take the prefill kernel when one has enough for it (as the dense
  // paged attention decides); the rest, the decode tasks.
  int max_query_count = 0;
  for (int n : batch.query_counts) max_query_count = std::max(max_query_count, n);
  const bool prefill = prefill_target_ctas_ > 0 && max_query_count >= kPrefillMinQueries;
  constexpr int kAny = std::numeric_limits<int>::max();
  num_tiles_ = append_attention_tiles(*metadata, batch, positions_per_tile_, 1, prefill ? 1 : kAny);
  prefill_ = {num_tiles_, prefill ? append_attention_tiles(*metadata, batch, kPrefillTileRows / group_, 2, kAny) : 0};
  size_t prefill_rows = 0;
  if (prefill_.num_tiles > 0) {
    SLIMKV_RETURN_IF_ERROR(plan_prefill_splits(batch, schedules.prefill));
    if (prefill_.num_splits > 1) {
      prefill_rows = size_t(prefill_.num_tiles) * size_t(shape_.num_kv_heads) * kPrefillTileRows * size_t(prefill_.num_splits);
    }
  }
  const int* tiles = metadata->data() + attention_tiles_offset(shape_.max_batch);
  // The blocks each decode tile reads (up to its last query's position: causal), and its sequence's tiles.
  std::vector<DecodeTile> decode_tiles(static_cast<size_t>(num_tiles_));
  for (int t = 0; t < num_tiles_; ++t) {
    const int b = tiles[2 * t], first = tiles[2 * t + 1], n = batch.query_counts[size_t(b)];
    const int kv_end = batch.kv_lens[size_t(b)] - n + first + std::min(positions_per_tile_, n - first);
    decode_tiles[size_t(t)] = {(kv_end + kCudaBlockTokens - 1) / kCudaBlockTokens,
                               (n + positions_per_tile_ - 1) / positions_per_tile_};
  }
  // The tasks name tiles by index and blocks by number, so a step whose tiles read the blocks the last
  // plan's did (a decode step within a block: 63 of 64) keeps them; only the metadata changes.
  if (layer_tasks_.empty() || schedules.decode != schedule_ || decode_tiles != planned_tiles_) {
    SLIMKV_RETURN_IF_ERROR(plan_tasks(decode_tiles, schedules.decode));
  }
  SLIMKV_RETURN_IF_ERROR(grow(metadata_, metadata->size(), "ZACK attention metadata"));
  const size_t rows = std::max(decode_partial_rows_, prefill_rows);
  SLIMKV_RETURN_IF_ERROR(grow(partial_acc_, rows * size_t(shape_.head_dim), "ZACK attention partials"));
  SLIMKV_RETURN_IF_ERROR(grow(partial_max_sum_, rows * 2, "ZACK attention partial sums"));
  SLIMKV_RETURN_IF_ERROR(metadata_.upload(metadata->data(), metadata->size()));
  return device_fill_bytes(counters_.data(), 0, counters_.bytes());
}

double CudaZackAttention::block_cost(int layer, int kv_head, int overhead) const {
  const size_t i = size_t(layer) * size_t(shape_.num_kv_heads) + size_t(kv_head);
  return double(staged_rows(shape_.k_ranks[i], shape_.v_ranks[i]) + overhead);
}

std::vector<int> CudaZackAttention::head_splits_per_tile(int target_ctas, int overhead, ZackSchedule schedule) const {
  const int G = shape_.num_kv_heads, per_head = std::max(1, target_ctas / G);
  std::vector<int> splits(size_t(shape_.num_layers) * size_t(G), per_head);
  if (schedule == ZackSchedule::kUniform) return splits;
  for (int l = 0; l < shape_.num_layers; ++l) {
    double mean_cost = 0;
    for (int g = 0; g < G; ++g) mean_cost += block_cost(l, g, overhead) / G;
    for (int g = 0; g < G; ++g) {
      splits[size_t(l) * G + size_t(g)] = std::max(1, int(per_head * block_cost(l, g, overhead) / mean_cost));
    }
  }
  return splits;
}

// Split-K for the prefill kernel as the dense prefill's: a tile's blocks cut by its sequence alone
// (split_rule.h), here at its head's splits_per_tile (one wave of the kernel's CTAs for a sequence alone,
// shared among the heads by cost when balanced). The grid's splits bound every prefill tile's, over every
// layer's heads; the heads' splits_per_tile, per layer (ranks differ by layer), are uploaded.
Status CudaZackAttention::plan_prefill_splits(const PagedAttentionBatch& batch, ZackSchedule schedule) {
  const std::vector<int> splits_per_tile = head_splits_per_tile(prefill_target_ctas_, kPrefillBlockOverheadDims, schedule);
  const int positions = kPrefillTileRows / group_;
  prefill_.num_splits = 1;
  for (size_t b = 0; b < batch.kv_lens.size(); ++b) {
    const int n = batch.query_counts[b];
    if (n < 2) continue;  // a decode tile's
    const int blocks = (batch.kv_lens[b] + kCudaBlockTokens - 1) / kCudaBlockTokens, tiles = (n + positions - 1) / positions;
    for (int head_splits : splits_per_tile) {
      prefill_.num_splits = std::max(prefill_.num_splits, most_splits_of(blocks, tiles, head_splits));
    }
  }
  return prefill_splits_per_tile_.upload(splits_per_tile.data(), splits_per_tile.size());
}

// Every layer's decode tasks (their ranks differ) over the decode tiles, uploaded. A unit's tasks cut its
// tile's blocks by split_rule.h at its head's splits_per_tile (tasks_per_cta waves of the kernel's CTAs
// for a sequence alone): by the tile's sequence and the head alone, so that each task's blocks, and the
// merge of a unit's tasks in their order, are the same whatever else the step holds. Only the order the
// CTAs take the tasks in depends on the step, which changes no partial.
Status CudaZackAttention::plan_tasks(const std::vector<DecodeTile>& tiles, ZackSchedule schedule) {
  const std::vector<int> splits_per_tile =
      head_splits_per_tile(shape_.tasks_per_cta * resident_ctas_, kBlockOverheadRows, schedule);
  const int G = shape_.num_kv_heads;
  std::vector<ZackTask> tasks;
  std::vector<int> order, unit_tasks, layer_tasks(1, 0);
  size_t max_layer_tasks = 0;
  for (int l = 0; l < shape_.num_layers; ++l) {
    const size_t first_task = tasks.size();
    for (int t = 0; t < num_tiles_; ++t) {
      const DecodeTile& tile = tiles[size_t(t)];
      for (int g = 0; g < G; ++g) {
        unit_tasks.push_back(int(tasks.size() - first_task));
        const int per_task = blocks_per_split(tile.blocks, tile.sequence_tiles, splits_per_tile[size_t(l) * G + size_t(g)]);
        for (int begin = 0; begin < tile.blocks; begin += per_task) {
          tasks.push_back({t, g, begin, std::min(tile.blocks, begin + per_task)});
        }
      }
    }
    unit_tasks.push_back(int(tasks.size() - first_task));
    const size_t layer_count = tasks.size() - first_task;
    std::vector<int> layer_order(layer_count);
    std::iota(layer_order.begin(), layer_order.end(), 0);
    if (schedule == ZackSchedule::kBalanced) {  // longest first (ZACK §5.3, Fig. 12)
      // Costs computed once: a batch of long sequences has thousands of tasks a layer, replanned as
      // any of them enters a new block.
      std::vector<double> head_cost(static_cast<size_t>(G)), task_cost(layer_count);
      for (int g = 0; g < G; ++g) head_cost[size_t(g)] = block_cost(l, g, kBlockOverheadRows);
      for (size_t i = 0; i < layer_count; ++i) {
        const ZackTask& task = tasks[first_task + i];
        task_cost[i] = (task.block_end - task.block_begin) * head_cost[size_t(task.kv_head)];
      }
      std::stable_sort(layer_order.begin(), layer_order.end(),
                       [&](int a, int b) { return task_cost[size_t(a)] > task_cost[size_t(b)]; });
    }
    order.insert(order.end(), layer_order.begin(), layer_order.end());
    layer_tasks.push_back(int(tasks.size()));
    max_layer_tasks = std::max(max_layer_tasks, layer_count);
  }
  layer_tasks_.clear();  // a failure below leaves no plan to keep
  SLIMKV_RETURN_IF_ERROR(grow(tasks_, tasks.size(), "ZACK attention tasks"));
  SLIMKV_RETURN_IF_ERROR(grow(order_, order.size(), "ZACK attention task order"));
  SLIMKV_RETURN_IF_ERROR(grow(unit_tasks_, unit_tasks.size(), "ZACK attention units"));
  SLIMKV_RETURN_IF_ERROR(tasks_.upload(tasks.data(), tasks.size()));
  SLIMKV_RETURN_IF_ERROR(order_.upload(order.data(), order.size()));
  SLIMKV_RETURN_IF_ERROR(unit_tasks_.upload(unit_tasks.data(), unit_tasks.size()));
  layer_tasks_ = std::move(layer_tasks);
  schedule_ = schedule;
  planned_tiles_ = tiles;
  decode_partial_rows_ = max_layer_tasks * size_t(rows_per_tile_);
  return Status::ok();
}

Status CudaZackAttention::run(int layer, const ZackKvView& kv, const uint16_t* q, float scale, uint16_t* out) {
  if (layer < 0 || layer >= shape_.num_layers || kv.num_kv_heads != shape_.num_kv_heads) {
    return error("CUDA ZACK attention: layer ", layer, " of ", shape_.num_layers, ", a view of ", kv.num_kv_heads,
                 " KV heads (expected ", shape_.num_kv_heads, ")");
  }
  if (layer_tasks_.size() != size_t(shape_.num_layers) + 1) return error("CUDA ZACK attention: run before plan");
  if (num_tasks(layer) > 0) SLIMKV_RETURN_IF_ERROR(run_decode(layer, kv, q, scale, out));
  if (prefill_.num_tiles > 0) SLIMKV_RETURN_IF_ERROR(run_prefill(layer, kv, q, scale, out));
  return Status::ok();
}

Status CudaZackAttention::run_decode(int layer, const ZackKvView& kv, const uint16_t* q, float scale, uint16_t* out) {
  const int first_task = layer_tasks_[size_t(layer)], num_tasks = layer_tasks_[size_t(layer) + 1] - first_task;
  const int units = num_tiles_ * shape_.num_kv_heads;
  ZackLaunch p{};
  p.q = reinterpret_cast<const __half*>(q);
  p.out = reinterpret_cast<__half*>(out);
  p.blocks = reinterpret_cast<const __half*>(kv.blocks);
  p.block_elements = kv.block_elements;
  p.heads = kv.heads;
  p.block_tables = kv.block_tables;
  p.block_table_stride = kv.block_table_stride;
  p.metadata = metadata_.data();
  p.max_batch = shape_.max_batch;
  p.tiles_offset = attention_tiles_offset(shape_.max_batch);
  p.tasks = tasks_.data() + first_task;
  p.order = order_.data() + first_task;
  p.unit_tasks = unit_tasks_.data() + size_t(layer) * size_t(units + 1);
  p.counter = counters_.data() + layer;
  p.num_tasks = num_tasks;
  p.dynamic = schedule_ == ZackSchedule::kBalanced;
  p.num_heads = shape_.num_heads;
  p.num_kv_heads = shape_.num_kv_heads;
  p.head_dim = shape_.head_dim;
  p.group = group_;
  p.positions_per_tile = positions_per_tile_;
  p.scale_log2 = scale * kLog2e;
  p.partial_acc = partial_acc_.data();
  p.partial_max_sum = partial_max_sum_.data();
  p.staged_elements = staged_elements_;
  const int ctas = std::min(resident_ctas_, num_tasks);
  const size_t shared = shared_bytes(staged_elements_, rows_per_tile_);
  if (rows_per_tile_ == 4) {
    zack_attention_kernel<4><<<ctas, kZackThreads, shared>>>(p);
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
    zack_merge_kernel<4><<<dim3(unsigned(units), 4), kMergeThreads>>>(p);
  } else {
    zack_attention_kernel<8><<<ctas, kZackThreads, shared>>>(p);
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
    zack_merge_kernel<8><<<dim3(unsigned(units), 8), kMergeThreads>>>(p);
  }
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

// The prefill kernel's launch reads the step's metadata as the dense kernels do (split_k.cuh), from the
// prefill tiles on; the blocks' tables are the ZACK view's.
Status CudaZackAttention::run_prefill(int layer, const ZackKvView& kv, const uint16_t* q, float scale, uint16_t* out) {
  AttentionLaunch p = step_launch(q, out, kv.block_tables, kv.block_table_stride, metadata_.data(), shape_.max_batch,
                                  shape_.num_heads, shape_.num_kv_heads, shape_.head_dim, scale, partial_acc_.data(),
                                  partial_max_sum_.data());
  p.tiles += prefill_.first_tile;
  p.positions_per_tile = kPrefillTileRows / group_;
  p.rows_per_tile = kPrefillTileRows;
  p.num_splits = p.split_stride = prefill_.num_splits;
  p.num_tiles = prefill_.num_tiles;
  launch_zack_prefill_attention(p, kv, prefill_splits_per_tile_.data() + size_t(layer) * size_t(shape_.num_kv_heads));
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  if (p.num_splits > 1) {  // one split wrote the output itself
    launch_merge_split_partials(p);
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  }
  return Status::ok();
}

}  // namespace slimkv::cuda
