#include "attention/cuda/zack_attention.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <numeric>

#include "attention/cuda/softmax_state.cuh"
#include "backend/cuda/cuda_check.h"

namespace slimkv::cuda {
namespace {

constexpr int kZackWarps = 4;  // per CTA; each warp takes its own tasks
constexpr int kZackThreads = kZackWarps * 32;
constexpr int kMaxRank = 128;
constexpr float kLog2e = 1.4426950408889634f;
// A task's cost per block and row, beside its K dims and the V dims its lanes cover: the softmax's warp
// reductions and the block's table lookup, in dims' worth (an estimate; it keeps rank-1 heads from
// getting huge ranges).
constexpr int kBlockOverheadDims = 32;

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
  bool dynamic;               // take tasks from the counter (balanced); else warp w takes w, w + warps, ...
  int num_heads, num_kv_heads, head_dim, group, positions_per_tile;
  float scale_log2;
  float* partial_acc;         // [num_tasks, rows, head_dim]
  float* partial_max_sum;     // [num_tasks, rows, 2]
};

// Where a query tile's rows sit: row r is query query_begin + r / group (at position first_position +
// r / group of the sequence), head kv_head · group + r % group.
struct ZackTile {
  int sequence, query_begin, first_position, active_rows;
  __device__ ZackTile(const ZackLaunch& p, int tile) {
    const int* kv_lens = p.metadata + p.max_batch;
    const int* query_starts = p.metadata + 2 * p.max_batch;
    const int* tiles = p.metadata + p.tiles_offset;
    const int b = tiles[2 * tile], first = tiles[2 * tile + 1];
    const int n = query_starts[b + 1] - query_starts[b];
    sequence = p.metadata[b];
    query_begin = query_starts[b] + first;
    first_position = kv_lens[b] - n + first;
    active_rows = p.group * min(p.positions_per_tile, n - first);
  }
};

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// The lanes that cover a head's V dims, two each: a power of two (so token subsets split the warp evenly),
// 32 past 64 dims (each lane then takes 2 + 2 dims).
__host__ __device__ inline int value_lanes(const ZackHeadLayout& head) {
  int lanes = 1;
  while (lanes < 32 && 2 * lanes < head.v_stride) lanes *= 2;
  return lanes;
}

// One warp's task: the partial (base-2 max, sum, weighted V) of its tile's rows over its blocks. A lane
// reads tokens 2·lane, 2·lane + 1 of each K dim (dim-major), and dims 2·pair + {0, 1} (and 64 + 2·pair +
// {0, 1} past 64 dims) of its subset's tokens of V (token-major): every load is a coalesced half2
// whatever the ranks.
template <int kRows>
__device__ void run_task(const ZackLaunch& p, int task_index, float (&q_rows)[kRows][kMaxRank],
                         float (&p_rows)[kRows][kCudaBlockTokens]) {
  const int lane = threadIdx.x % 32;
  const ZackTask task = p.tasks[task_index];
  const ZackHeadLayout head = p.heads[task.kv_head];
  const ZackTile tile(p, task.tile);
  for (int i = lane; i < kRows * kMaxRank; i += 32) {
    const int r = i / kMaxRank, j = i % kMaxRank;
    float x = 0.0f;
    if (r < tile.active_rows && j < head.k_rank) {
      const int query = tile.query_begin + r / p.group, h = task.kv_head * p.group + r % p.group;
      x = __half2float(p.q[(size_t(query) * p.num_heads + h) * p.head_dim + j]) * p.scale_log2;
    }
    q_rows[r][j] = x;
  }
  __syncwarp();
  float acc[kRows][4], row_max[kRows], row_sum[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    row_max[r] = -INFINITY, row_sum[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[r][c] = 0.0f;
  }
  const int pairs = value_lanes(head), pair = lane % pairs, subset = lane / pairs;
  const bool low = 2 * pair < head.v_rank, high = 64 + 2 * pair < head.v_rank;
  const int* table = p.block_tables + size_t(tile.sequence) * p.block_table_stride;
  for (int block = task.block_begin; block < task.block_end; ++block) {
    const __half* base = p.blocks + size_t(table[block]) * size_t(p.block_elements);
    const __half2* k = reinterpret_cast<const __half2*>(base + head.k_offset) + lane;  // [k_rank, 32] half2
    float s[kRows][2];
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r][0] = s[r][1] = 0.0f;
#pragma unroll 4
    for (int j = 0; j < head.k_rank; ++j) {
      const float2 kk = __half22float2(k[j * (kCudaBlockTokens / 2)]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        s[r][0] = fmaf(q_rows[r][j], kk.x, s[r][0]);
        s[r][1] = fmaf(q_rows[r][j], kk.y, s[r][1]);
      }
    }
    // Causal mask (a row sees the tokens up to its position), the online-softmax update per row.
    const int token = block * kCudaBlockTokens + 2 * lane;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int position = tile.first_position + r / p.group;
      const bool active = r < tile.active_rows;
      const float s0 = active && token <= position ? s[r][0] : -INFINITY;
      const float s1 = active && token + 1 <= position ? s[r][1] : -INFINITY;
      const float new_max = fmaxf(row_max[r], warp_max(fmaxf(s0, s1)));
      const float reference = softmax_reference(new_max);
      const float factor = exp2f(row_max[r] - reference);
      const float e0 = exp2f(s0 - reference), e1 = exp2f(s1 - reference);
      row_sum[r] = row_sum[r] * factor + warp_sum(e0 + e1);
      row_max[r] = new_max;
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[r][c] *= factor;
      p_rows[r][2 * lane] = e0;
      p_rows[r][2 * lane + 1] = e1;
    }
    __syncwarp();
    // V: lanes split into (token subset, dim pair), `pairs` lanes covering the head's dims, so a low-rank
    // head costs what its dims cost (the subsets' sums are added once, at the end of the task).
    const __half* v = base + head.v_offset;
    for (int t = subset; t < kCudaBlockTokens; t += 32 / pairs) {
      const __half2* row = reinterpret_cast<const __half2*>(v + t * head.v_stride);
      const float2 v0 = low ? __half22float2(row[pair]) : make_float2(0.0f, 0.0f);
      const float2 v1 = high ? __half22float2(row[32 + pair]) : make_float2(0.0f, 0.0f);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float weight = p_rows[r][t];
        acc[r][0] = fmaf(weight, v0.x, acc[r][0]);
        acc[r][1] = fmaf(weight, v0.y, acc[r][1]);
        acc[r][2] = fmaf(weight, v1.x, acc[r][2]);
        acc[r][3] = fmaf(weight, v1.y, acc[r][3]);
      }
    }
    __syncwarp();
  }
  for (int offset = pairs; offset < 32; offset <<= 1) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[r][c] += __shfl_xor_sync(0xffffffffu, acc[r][c], offset);
    }
  }
  const int dims[4] = {2 * pair, 2 * pair + 1, 64 + 2 * pair, 65 + 2 * pair};
  const bool writes = subset == 0;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const size_t row = size_t(task_index) * kRows + r;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      if (writes && dims[c] < p.head_dim) p.partial_acc[row * p.head_dim + dims[c]] = acc[r][c];
    }
    if (lane == 0) {
      p.partial_max_sum[2 * row] = row_max[r];
      p.partial_max_sum[2 * row + 1] = row_sum[r];
    }
  }
}

template <int kRows>
__global__ void __launch_bounds__(kZackThreads) zack_attention_kernel(ZackLaunch p) {
  __shared__ float q_rows[kZackWarps][kRows][kMaxRank];
  __shared__ float p_rows[kZackWarps][kRows][kCudaBlockTokens];
  const int warp = threadIdx.x / 32;
  const int warps = gridDim.x * kZackWarps;
  for (int i = blockIdx.x * kZackWarps + warp;; i += warps) {
    int taken = i;
    if (p.dynamic) {
      if (threadIdx.x % 32 == 0) taken = atomicAdd(p.counter, 1);
      taken = __shfl_sync(0xffffffffu, taken, 0);
    }
    if (taken >= p.num_tasks) return;
    run_task<kRows>(p, p.order[taken], q_rows[warp], p_rows[warp]);
  }
}

// Merges each unit's task partials (the online-softmax rule) into the output rows; dims past the
// head's v_rank are written 0 (the folded W_O has zero columns there).
template <int kRows>
__global__ void zack_merge_kernel(ZackLaunch p) {
  const int unit = blockIdx.x, tile_index = unit / p.num_kv_heads, kv_head = unit % p.num_kv_heads;
  const ZackTile tile(p, tile_index);
  if (unit == 0 && threadIdx.x == 0) *p.counter = 0;  // the attention kernel is done with it: the next run's
  const int first = p.unit_tasks[unit], end = p.unit_tasks[unit + 1];
  const int v_rank = p.heads[kv_head].v_rank;
  const int r = blockIdx.y;
  if (r >= tile.active_rows) return;
  for (int c = threadIdx.x; c < p.head_dim; c += blockDim.x) {
    float value = 0.0f;
    if (c < v_rank) {
      float max_all = -INFINITY;
      for (int t = first; t < end; ++t) max_all = fmaxf(max_all, p.partial_max_sum[2 * (size_t(t) * kRows + r)]);
      const float reference = softmax_reference(max_all);
      float total = 0.0f, weighted = 0.0f;
      for (int t = first; t < end; ++t) {
        const size_t row = size_t(t) * kRows + r;
        const float factor = exp2f(p.partial_max_sum[2 * row] - reference);
        total += factor * p.partial_max_sum[2 * row + 1];
        weighted += factor * p.partial_acc[row * p.head_dim + c];
      }
      value = total > 0.0f ? weighted / total : 0.0f;
    }
    const int query = tile.query_begin + r / p.group, h = kv_head * p.group + r % p.group;
    p.out[(size_t(query) * p.num_heads + h) * p.head_dim + c] = __float2half(value);
  }
}

}  // namespace

Expected<std::unique_ptr<CudaZackAttention>> CudaZackAttention::create(const ZackAttentionShape& shape) {
  const size_t heads = size_t(shape.num_layers) * size_t(shape.num_kv_heads);
  if (shape.num_layers < 1 || shape.num_kv_heads < 1 || shape.num_heads % shape.num_kv_heads != 0 ||
      shape.num_heads / shape.num_kv_heads > 8 || shape.head_dim < 2 || shape.head_dim > kMaxRank ||
      shape.head_dim % 2 != 0 || shape.max_batch < 1 || shape.max_queries < 1 || shape.tasks_per_warp < 1) {
    return error("CUDA ZACK attention: ", shape.num_heads, " query heads over ", shape.num_kv_heads,
                 " KV heads (a group of at most 8), head_dim ", shape.head_dim, " (even, at most ", kMaxRank, "), ",
                 shape.num_layers, " layers, batch ", shape.max_batch, ", queries ", shape.max_queries, ", tasks per warp ",
                 shape.tasks_per_warp,
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
  int resident = 0;
  const auto kernel = attention->rows_per_tile_ == 4 ? zack_attention_kernel<4> : zack_attention_kernel<8>;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kZackThreads, 0));
  attention->resident_ctas_ = std::max(1, resident) * multiprocessor_count();
  attention->resident_warps_ = attention->resident_ctas_ * kZackWarps;
  SLIMKV_ASSIGN_OR_RETURN(attention->counters_, DeviceArray<int>::allocate(size_t(shape.num_layers), "ZACK task counters"));
  return Expected<std::unique_ptr<CudaZackAttention>>(std::move(attention));
}

Status CudaZackAttention::plan(const PagedAttentionBatch& batch, ZackSchedule schedule) {
  auto metadata = lay_out_attention_batch(batch, shape_.max_batch, shape_.max_queries, positions_per_tile_);
  if (!metadata) return metadata.status().with_context("CUDA ZACK attention");
  const int* tiles = metadata->data() + attention_tiles_offset(shape_.max_batch);
  num_tiles_ = int(metadata->size() - size_t(attention_tiles_offset(shape_.max_batch))) / 2;
  // The blocks each tile reads: up to its last query's position (causal).
  std::vector<int> tile_blocks(static_cast<size_t>(num_tiles_));
  int max_tile_blocks = 0;
  for (int t = 0; t < num_tiles_; ++t) {
    const int b = tiles[2 * t], first = tiles[2 * t + 1], n = batch.query_counts[size_t(b)];
    const int kv_end = batch.kv_lens[size_t(b)] - n + first + std::min(positions_per_tile_, n - first);
    tile_blocks[size_t(t)] = (kv_end + kCudaBlockTokens - 1) / kCudaBlockTokens;
    max_tile_blocks = std::max(max_tile_blocks, tile_blocks[size_t(t)]);
  }
  const int target_tasks = shape_.tasks_per_warp * resident_warps_;
  const int G = shape_.num_kv_heads, units = num_tiles_ * G;
  std::vector<ZackTask> tasks;
  std::vector<int> order, unit_tasks;
  layer_tasks_.assign(1, 0);
  size_t max_layer_tasks = 0;
  for (int l = 0; l < shape_.num_layers; ++l) {
    const auto cost = [&](int g) {
      const size_t i = size_t(l) * G + size_t(g);
      const int v_rank = shape_.v_ranks[i];
      const int v_work = v_rank > 64 ? 128 : 2 * value_lanes({0, 0, 0, v_rank, v_rank + (v_rank & 1)});
      return double(shape_.k_ranks[i] + v_work + kBlockOverheadDims);
    };
    double total_cost = 0;
    for (int t = 0; t < num_tiles_; ++t) {
      for (int g = 0; g < G; ++g) total_cost += tile_blocks[size_t(t)] * cost(g);
    }
    const double cost_per_task = total_cost / target_tasks;
    const int uniform_blocks = std::max(1, (max_tile_blocks + std::max(1, target_tasks / units) - 1) /
                                               std::max(1, target_tasks / units));
    const size_t first_task = tasks.size();
    for (int t = 0; t < num_tiles_; ++t) {
      for (int g = 0; g < G; ++g) {
        unit_tasks.push_back(int(tasks.size() - first_task));
        const int per_task = schedule == ZackSchedule::kBalanced
                                 ? std::max(1, int(cost_per_task / cost(g) + 0.5))
                                 : uniform_blocks;
        for (int begin = 0; begin < tile_blocks[size_t(t)]; begin += per_task) {
          tasks.push_back({t, g, begin, std::min(tile_blocks[size_t(t)], begin + per_task)});
        }
      }
    }
    unit_tasks.push_back(int(tasks.size() - first_task));
    const size_t layer_count = tasks.size() - first_task;
    std::vector<int> layer_order(layer_count);
    std::iota(layer_order.begin(), layer_order.end(), 0);
    if (schedule == ZackSchedule::kBalanced) {  // longest first (ZACK §5.3, Fig. 12)
      const auto task_cost = [&](int i) {
        const ZackTask& task = tasks[first_task + size_t(i)];
        return (task.block_end - task.block_begin) * cost(task.kv_head);
      };
      std::stable_sort(layer_order.begin(), layer_order.end(),
                       [&](int a, int b) { return task_cost(a) > task_cost(b); });
    }
    order.insert(order.end(), layer_order.begin(), layer_order.end());
    layer_tasks_.push_back(int(tasks.size()));
    max_layer_tasks = std::max(max_layer_tasks, layer_count);
  }
  schedule_ = schedule;
  const auto grow = [](auto& array, size_t n, const char* what) -> Status {
    if (array.size() >= n) return Status::ok();
    using Array = std::remove_reference_t<decltype(array)>;
    SLIMKV_ASSIGN_OR_RETURN(array, Array::allocate(std::max(n, 2 * array.size()), what));
    return Status::ok();
  };
  SLIMKV_RETURN_IF_ERROR(grow(metadata_, metadata->size(), "ZACK attention metadata"));
  SLIMKV_RETURN_IF_ERROR(grow(tasks_, tasks.size(), "ZACK attention tasks"));
  SLIMKV_RETURN_IF_ERROR(grow(order_, order.size(), "ZACK attention task order"));
  SLIMKV_RETURN_IF_ERROR(grow(unit_tasks_, unit_tasks.size(), "ZACK attention units"));
  const size_t rows = max_layer_tasks * size_t(rows_per_tile_);
  SLIMKV_RETURN_IF_ERROR(grow(partial_acc_, rows * size_t(shape_.head_dim), "ZACK attention partials"));
  SLIMKV_RETURN_IF_ERROR(grow(partial_max_sum_, rows * 2, "ZACK attention partial sums"));
  SLIMKV_RETURN_IF_ERROR(metadata_.upload(metadata->data(), metadata->size()));
  SLIMKV_RETURN_IF_ERROR(tasks_.upload(tasks.data(), tasks.size()));
  SLIMKV_RETURN_IF_ERROR(order_.upload(order.data(), order.size()));
  SLIMKV_RETURN_IF_ERROR(unit_tasks_.upload(unit_tasks.data(), unit_tasks.size()));
  return device_fill_bytes(counters_.data(), 0, counters_.bytes());
}

Status CudaZackAttention::run(int layer, const ZackKvView& kv, const uint16_t* q, float scale, uint16_t* out) {
  if (layer < 0 || layer >= shape_.num_layers || kv.num_kv_heads != shape_.num_kv_heads) {
    return error("CUDA ZACK attention: layer ", layer, " of ", shape_.num_layers, ", a view of ", kv.num_kv_heads,
                 " KV heads (expected ", shape_.num_kv_heads, ")");
  }
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
  const int ctas = std::min(resident_ctas_, (num_tasks + kZackWarps - 1) / kZackWarps);
  if (rows_per_tile_ == 4) {
    zack_attention_kernel<4><<<ctas, kZackThreads>>>(p);
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
    zack_merge_kernel<4><<<dim3(unsigned(units), 4), 128>>>(p);
  } else {
    zack_attention_kernel<8><<<ctas, kZackThreads>>>(p);
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
    zack_merge_kernel<8><<<dim3(unsigned(units), 8), 128>>>(p);
  }
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

}  // namespace slimkv::cuda
