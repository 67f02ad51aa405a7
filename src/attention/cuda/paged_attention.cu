#include "attention/cuda/paged_attention.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include "attention/cuda/device_ops.cuh"
#include "attention/cuda/hack_prefill_attention.cuh"
#include "attention/cuda/prefill_attention.cuh"
#include "attention/cuda/split_k.cuh"
#include "attention/cuda/softmax_state.cuh"
#include "backend/cuda/cuda_check.h"

namespace slimkv::cuda {
namespace {

__device__ inline void halves_to_floats(const uint4& raw, float (&out)[8]) {
  const __half2* pairs = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(pairs[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// The three steps of a chunk in the decode kernel below (FlashInfer's decode.cuh names them so). A
// lane holds 8 dims of one token of each of kSteps loads (kHeadDim / 8 lanes per token).

// Scores (base 2) of the chunk's tokens against each row's query, reduced over the lanes that hold one
// token; masked by causality and the sliding window (a token the row does not see scores −∞).
template <int kHeadDim, int kRows, int kSteps>
__device__ __forceinline__ void compute_qk(const float (&q)[kRows][8], const uint4 (&k_raw)[kSteps], int chunk_first,
                                           int token_in_step, const int (&position)[kRows], int window_tokens,
                                           float (&score)[kSteps][kRows]) {
  constexpr int kLanesPerToken = kHeadDim / 8;
  constexpr int kTokensPerStep = 32 / kLanesPerToken;
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    float k[8];
    halves_to_floats(k_raw[s], k);
    const int token = chunk_first + s * kTokensPerStep + token_in_step;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float dot = 0.0f;
#pragma unroll
      for (int c = 0; c < 8; ++c) dot = fmaf(q[r][c], k[c], dot);
#pragma unroll
      for (int offset = kLanesPerToken / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      score[s][r] = masked_token(token, position[r], window_tokens) ? -INFINITY : dot;
    }
  }
}

// Online softmax (softmax_state.cuh): each row's running max takes the chunk's (uniform over the warp),
// and what was summed is rescaled to it; reference: what the chunk's weights are taken against.
template <int kHeadDim, int kRows, int kSteps>
__device__ __forceinline__ void update_mdo_states(const float (&score)[kSteps][kRows], float (&running_max)[kRows],
                                                  float (&sum)[kRows], float (&acc)[kRows][8],
                                                  float (&reference)[kRows]) {
  constexpr int kLanesPerToken = kHeadDim / 8;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float chunk_max = score[0][r];
#pragma unroll
    for (int s = 1; s < kSteps; ++s) chunk_max = fmaxf(chunk_max, score[s][r]);
#pragma unroll
    for (int offset = kLanesPerToken; offset < 32; offset *= 2) {
      chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, offset));
    }
    const float new_max = fmaxf(running_max[r], chunk_max);
    reference[r] = softmax_reference(new_max);  // all masked so far: exp2 gives 0, not NaN
    const float rescale = exp2f(running_max[r] - reference[r]);
    running_max[r] = new_max;
    sum[r] *= rescale;
#pragma unroll
    for (int c = 0; c < 8; ++c) acc[r][c] *= rescale;
  }
}

// The chunk's softmax weights times V, into each row's sum and weighted V.
template <int kRows, int kSteps>
__device__ __forceinline__ void compute_sfm_v(const float (&score)[kSteps][kRows], const float (&reference)[kRows],
                                              const uint4 (&v_raw)[kSteps], float (&sum)[kRows],
                                              float (&acc)[kRows][8]) {
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    float v[8];
    halves_to_floats(v_raw[s], v);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float weight = exp2f(score[s][r] - reference[r]);
      sum[r] += weight;
#pragma unroll
      for (int c = 0; c < 8; ++c) acc[r][c] = fmaf(weight, v[c], acc[r][c]);
    }
  }
}

// The attention partial of one query tile over one split of its blocks (see the header). Within a
// warp, kLanesPerToken lanes hold one token's head (8 halves = 16 bytes each, coalesced), so a warp
// load covers kTokensPerStep tokens; kSteps loads of K and of V are in flight before the first use.
template <int kHeadDim, int kRows>
__global__ __launch_bounds__(kThreads) void paged_attention_partials(AttentionLaunch p) {
  constexpr int kLanesPerToken = kHeadDim / 8;
  constexpr int kTokensPerStep = 32 / kLanesPerToken;
  // Loads per chunk, bounded by registers (two chunks are held, and kSteps × kRows scores). Measured on
  // H100, batch 8, 32/8 heads, d 128: 8 rather than 4 took 16K from 0.206 to 0.190 ms (SDPA 0.185):
  // the per-chunk max, rescale and shuffles are paid half as often.
  // (At most a block: small heads put many tokens in one step.)
  constexpr int kWantedSteps = kRows >= 8 ? 4 : 8;
  constexpr int kSteps = kWantedSteps * kTokensPerStep <= kCudaBlockTokens ? kWantedSteps : kCudaBlockTokens / kTokensPerStep;
  constexpr int kChunkTokens = kTokensPerStep * kSteps;
  static_assert(kCudaBlockTokens % kChunkTokens == 0, "a chunk must not straddle blocks");

  const int split = blockIdx.x, kv_head = blockIdx.y, tile = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const TileQueries tq(p, tile);
  const int num_blocks = (tq.kv_end + kCudaBlockTokens - 1) / kCudaBlockTokens;
  const TileSplit range = tile_split(p, tq, split, tq.kv_begin / kCudaBlockTokens, num_blocks);
  const int block_begin = range.begin, block_end = range.end;
  const int dim0 = (lane % kLanesPerToken) * 8;
  const int token_in_step = lane / kLanesPerToken;

  // This lane's 8 dims of each row's query, pre-scaled; inactive rows attend like the last query and
  // are never written (no special case in the loop).
  float q[kRows][8];
  int position[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const bool active = r < tq.active_rows;
    const int query = tq.first_query + r / p.group;
    position[r] = active ? tq.first_position + query : tq.kv_end - 1;
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (active) {
      const int head = kv_head * p.group + r % p.group;
      raw = *reinterpret_cast<const uint4*>(p.q + (size_t(tq.query_begin + query) * p.num_heads + head) * kHeadDim + dim0);
    }
    halves_to_floats(raw, q[r]);
#pragma unroll
    for (int c = 0; c < 8; ++c) q[r][c] *= p.scale_log2;
  }

  // The warp's running partial: max (uniform over the warp), and per lane the sum and weighted V over
  // the tokens its lane group saw (reduced over lane groups at the end).
  float running_max[kRows], sum[kRows], acc[kRows][8];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    running_max[r] = -INFINITY;
    sum[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < 8; ++c) acc[r][c] = 0.0f;
  }

  // The warp's chunks, in order: its blocks are block_begin + warp + kWarps·j; chunks at or past
  // kv_end (the tail of the sequence's last block) are not read at all.
  const int* table = p.block_tables + size_t(p.sequence_ids[tq.batch_index]) * p.block_table_stride;
  constexpr int kChunksPerBlock = kCudaBlockTokens / kChunkTokens;
  const int warp_blocks = max(0, (block_end - block_begin - warp + kWarps - 1) / kWarps);
  int num_chunks = 0;
  if (warp_blocks > 0) {
    const int last_block = block_begin + warp + kWarps * (warp_blocks - 1);
    const int last_tokens = min(kCudaBlockTokens, tq.kv_end - last_block * kCudaBlockTokens);
    num_chunks = (warp_blocks - 1) * kChunksPerBlock + (last_tokens + kChunkTokens - 1) / kChunkTokens;
  }
  // Loads chunk i of the warp into registers (zeros outside [kv_begin, kv_end): another sequence's data,
  // a block a sliding window gave back, or nothing sits there) and returns its first token.
  auto load_chunk = [&](int i, uint4 (&k_raw)[kSteps], uint4 (&v_raw)[kSteps]) {
    const int block = block_begin + warp + kWarps * (i / kChunksPerBlock);
    const int chunk = (i % kChunksPerBlock) * kChunkTokens;
    const size_t block_offset = (size_t(table[block]) * p.num_kv_heads + kv_head) * kCudaBlockTokens * kHeadDim;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int token = chunk + s * kTokensPerStep + token_in_step;
      k_raw[s] = v_raw[s] = make_uint4(0, 0, 0, 0);
      const int at = block * kCudaBlockTokens + token;
      if (at < tq.kv_end && at >= tq.kv_begin) {
        k_raw[s] = __ldg(reinterpret_cast<const uint4*>(p.k_pool + block_offset + token * kHeadDim + dim0));
        v_raw[s] = __ldg(reinterpret_cast<const uint4*>(p.v_pool + block_offset + token * kHeadDim + dim0));
      }
    }
    return block * kCudaBlockTokens + chunk;
  };
  // One chunk ahead: the next chunk's loads are in flight while this one is computed.
  uint4 k_raw[kSteps], v_raw[kSteps], k_next[kSteps], v_next[kSteps];
  int chunk_first = num_chunks > 0 ? load_chunk(0, k_raw, v_raw) : 0;
  for (int i = 0; i < num_chunks; ++i) {
    const int next_first = i + 1 < num_chunks ? load_chunk(i + 1, k_next, v_next) : 0;
    float score[kSteps][kRows], reference[kRows];
    compute_qk<kHeadDim, kRows, kSteps>(q, k_raw, chunk_first, token_in_step, position, p.window_tokens, score);
    update_mdo_states<kHeadDim, kRows, kSteps>(score, running_max, sum, acc, reference);
    compute_sfm_v<kRows, kSteps>(score, reference, v_raw, sum, acc);
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      k_raw[s] = k_next[s];
      v_raw[s] = v_next[s];
    }
    chunk_first = next_first;
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int offset = kLanesPerToken; offset < 32; offset *= 2) {
      sum[r] += __shfl_xor_sync(kFullMask, sum[r], offset);
#pragma unroll
      for (int c = 0; c < 8; ++c) acc[r][c] += __shfl_xor_sync(kFullMask, acc[r][c], offset);
    }
  }

  // Merge the warps' partials and write the CTA's.
  __shared__ float warp_acc[kWarps][kRows][kHeadDim];
  __shared__ float2 warp_max_sum[kWarps][kRows];
  if (lane < kLanesPerToken) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int c = 0; c < 8; ++c) warp_acc[warp][r][dim0 + c] = acc[r][c];
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) warp_max_sum[warp][r] = make_float2(running_max[r], sum[r]);
  }
  __syncthreads();
  store_cta_partial<kHeadDim, kRows>(p, tq.active_rows, warp_acc, warp_max_sum);
}

// One warp per (tile, KV head, row): merges the row's split partials and writes acc / sum as FP16.
// A decode step of one or a few sequences has many splits (64 for one 16K sequence on an H100), so
// the lanes share out the splits' (max, sum), and each lane keeps the loads of kInFlight splits' columns
// in flight at once instead of walking the splits one dependent load after another. The weighted
// values are still summed in split order.
template <int kHeadDim>
__global__ __launch_bounds__(kThreads) void merge_split_partials(AttentionLaunch p) {
  constexpr int kCols = kHeadDim >= 32 ? kHeadDim / 32 : 1;  // per lane
  constexpr int kLanes = kHeadDim / kCols;                     // lanes holding columns
  constexpr int kInFlight = 8;
  const int row = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= p.num_tiles * p.num_kv_heads * p.rows_per_tile) return;
  const int r = row % p.rows_per_tile;
  const int kv_head = row / p.rows_per_tile % p.num_kv_heads;
  const int tile = row / p.rows_per_tile / p.num_kv_heads;
  const TileQueries tq(p, tile);
  if (r >= tq.active_rows) return;
  const int splits = p.split_stride;
  const float2* max_sum = p.partial_max_sum + size_t(row) * splits;
  float max_all = -INFINITY;
  for (int s = lane; s < splits; s += 32) max_all = fmaxf(max_all, max_sum[s].x);
  const float reference = softmax_reference(warp_max(max_all));
  float total = 0.0f;
  for (int s = lane; s < splits; s += 32) total += exp2f(max_sum[s].x - reference) * max_sum[s].y;
  total = warp_sum(total);
  const float inverse = total > 0.0f ? 1.0f / total : 0.0f;

  const float* acc = p.partial_acc + size_t(row) * splits * kHeadDim + (lane < kLanes ? lane * kCols : 0);
  float weighted[kCols] = {};
  for (int base = 0; base < splits; base += 32) {
    // Lane l holds split base + l's factor (0 past the last split), which the others take by shuffle.
    const float factor = base + lane < splits ? exp2f(max_sum[base + lane].x - reference) : 0.0f;
    const int count = min(32, splits - base);
    for (int first = 0; first < count; first += kInFlight) {
      float values[kInFlight][kCols];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const bool present = first + u < count && lane < kLanes;
#pragma unroll
        for (int i = 0; i < kCols; ++i) values[u][i] = present ? acc[size_t(base + first + u) * kHeadDim + i] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const float f = __shfl_sync(kFullMask, factor, first + u);
#pragma unroll
        for (int i = 0; i < kCols; ++i) weighted[i] += f * values[u][i];
      }
    }
  }
  if (lane >= kLanes) return;
  const int head = kv_head * p.group + r % p.group;
  __half* out = p.out + (size_t(tq.query_begin + tq.first_query + r / p.group) * p.num_heads + head) * kHeadDim + lane * kCols;
#pragma unroll
  for (int i = 0; i < kCols; ++i) out[i] = __float2half(weighted[i] * inverse);
}

}  // namespace

void launch_merge_split_partials(const AttentionLaunch& p) {
  const unsigned ctas = unsigned((p.num_tiles * p.num_kv_heads * p.rows_per_tile + kWarps - 1) / kWarps);
  switch (p.head_dim) {  // create() admits these
    case 16: merge_split_partials<16><<<ctas, kThreads>>>(p); break;
    case 32: merge_split_partials<32><<<ctas, kThreads>>>(p); break;
    case 64: merge_split_partials<64><<<ctas, kThreads>>>(p); break;
    case 256: merge_split_partials<256><<<ctas, kThreads>>>(p); break;
    default: merge_split_partials<128><<<ctas, kThreads>>>(p); break;
  }
}

namespace {

template <int kHeadDim, int kRows>
void launch_partials(const AttentionLaunch& p) {
  const dim3 grid(unsigned(p.num_splits), unsigned(p.num_kv_heads), unsigned(p.num_tiles));
  paged_attention_partials<kHeadDim, kRows><<<grid, kThreads>>>(p);
}

template <int kHeadDim, int kRows>
int resident_ctas_per_multiprocessor() {
  int ctas = 1;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, paged_attention_partials<kHeadDim, kRows>, kThreads, 0);
  return std::max(ctas, 1);
}

struct ResidentCtas {
  template <int kHeadDim, int kRows>
  int operator()() const { return resident_ctas_per_multiprocessor<kHeadDim, kRows>(); }
};
struct LaunchPartials {
  const AttentionLaunch& p;
  template <int kHeadDim, int kRows>
  void operator()() const { launch_partials<kHeadDim, kRows>(p); }
};

// Calls f.template operator()<kHeadDim, kRows>() for the run-time shape: the one switch from it to the
// kernel's compile-time shape (create() checked that head_dim is one of these).
template <typename F>
auto with_kernel_shape(int head_dim, int rows, F&& f) {
  const bool four = rows == 4;
  switch (head_dim) {
    case 16: return four ? f.template operator()<16, 4>() : f.template operator()<16, 8>();
    case 32: return four ? f.template operator()<32, 4>() : f.template operator()<32, 8>();
    case 64: return four ? f.template operator()<64, 4>() : f.template operator()<64, 8>();
    case 256: return four ? f.template operator()<256, 4>() : f.template operator()<256, 8>();  // Gemma 3 1B-12B
    default: return four ? f.template operator()<128, 4>() : f.template operator()<128, 8>();  // 128: create() refuses others
  }
}

}  // namespace

int attention_head_dim_for(int head_dim) {
  for (int supported : {16, 32, 64, 128, 256}) {
    if (head_dim <= supported) return head_dim > 0 ? supported : 0;
  }
  return 0;
}

Expected<std::unique_ptr<CudaPagedAttention>> CudaPagedAttention::create(const PagedAttentionShape& shape) {
  if (shape.num_heads <= 0 || shape.num_kv_heads <= 0 || shape.num_heads % shape.num_kv_heads != 0) {
    return error("CUDA paged attention: num_heads ", shape.num_heads, " must be a positive multiple of num_kv_heads ",
                 shape.num_kv_heads);
  }
  const int group = shape.num_heads / shape.num_kv_heads;
  if (group > 8) return error("CUDA paged attention: GQA group ", group, " (heads per KV head) is over the supported 8");
  if (attention_head_dim_for(shape.head_dim) != shape.head_dim) {
    return error("CUDA paged attention: head_dim ", shape.head_dim, " is not supported (16, 32, 64 or 128)");
  }
  if (shape.max_batch <= 0 || shape.max_queries < shape.max_batch) {
    return error("CUDA paged attention: max_batch ", shape.max_batch, " and max_queries ", shape.max_queries,
                 " must be positive, max_queries >= max_batch");
  }
  std::unique_ptr<CudaPagedAttention> attention(new CudaPagedAttention(shape));
  attention->group_ = group;
  // A group over 4 takes the 8-row kernel (fewer resident warps: 0.76x of SDPA at 64 q / 8 kv heads,
  // 32K, on H100). Two 4-row tiles whose CTAs share the blocks through L2 measured slower (0.69x).
  attention->rows_per_tile_ = group <= 4 ? 4 : 8;
  attention->positions_per_tile_ = attention->rows_per_tile_ / group;
  // As many CTAs as are resident at once: split-K fills one wave of the GPU (a second, partial wave
  // would leave most multiprocessors idle while it runs: measured 0.77x of SDPA with 2.2 waves).
  const int resident = with_kernel_shape(shape.head_dim, attention->rows_per_tile_, ResidentCtas{});
  attention->target_ctas_ = resident * multiprocessor_count();
  if (shape.tensor_core_min_queries > 0 && prefill_head_dim_supported(shape.head_dim)) {
    const int prefill_resident = prefill_attention_setup(shape.head_dim);
    if (prefill_resident == 0) {
      return error("CUDA paged attention: the tensor-core prefill kernel (head_dim ", shape.head_dim,
                   ") cannot run: its shared memory does not fit");
    }
    attention->prefill_target_ctas_ = prefill_resident * multiprocessor_count();
  }
  // The partials to start with: a step of single-split tiles plus one wave of splits (the quantized
  // kernels' waves included: at most kMaxResidentCtas per multiprocessor); a step whose sequences split
  // more (each as it would alone: long contexts in a big batch) grows them (split_blocks).
  const size_t max_target = size_t(std::max(resident, kMaxResidentCtas)) * multiprocessor_count();
  // The tensor-core kernel splits only up to its own target (each split of a tile is kPrefillTileRows rows).
  attention->partial_rows_capacity_ =
      std::max((size_t(shape.max_queries) * shape.num_kv_heads + max_target) * attention->rows_per_tile_,
               size_t(attention->prefill_target_ctas_) * kPrefillTileRows);
  SLIMKV_ASSIGN_OR_RETURN(attention->metadata_,
                          DeviceArray<int>::allocate(size_t(attention_tiles_offset(shape.max_batch) + 2 * shape.max_queries), "attention metadata"));
  SLIMKV_ASSIGN_OR_RETURN(attention->partial_acc_,
                          DeviceArray<float>::allocate(attention->partial_rows_capacity_ * shape.head_dim, "attention partials"));
  SLIMKV_ASSIGN_OR_RETURN(attention->partial_max_sum_,
                          DeviceArray<float>::allocate(attention->partial_rows_capacity_ * 2, "attention partials"));
  return Expected<std::unique_ptr<CudaPagedAttention>>(std::move(attention));
}

Expected<std::vector<int>> lay_out_attention_sequences(const PagedAttentionBatch& batch, int max_batch, int max_queries) {
  const int batch_size = int(batch.sequence_ids.size());
  if (batch_size == 0 || batch_size > max_batch || int(batch.kv_lens.size()) != batch_size ||
      int(batch.query_counts.size()) != batch_size) {
    return error("a batch of ", batch_size, " sequences (at most ", max_batch, "), ", batch.kv_lens.size(), " kv_lens and ",
                 batch.query_counts.size(), " query_counts");
  }
  // The per-sequence arrays padded to max_batch, so the tiles sit at a fixed, 8-byte aligned offset.
  std::vector<int> metadata(size_t(attention_tiles_offset(max_batch)), 0);
  int* sequence_ids = metadata.data();
  int* kv_lens = sequence_ids + max_batch;
  int* query_starts = kv_lens + max_batch;
  for (int b = 0; b < batch_size; ++b) {
    const int n = batch.query_counts[size_t(b)], kv_len = batch.kv_lens[size_t(b)];
    if (n < 1 || n > kv_len) {
      return error("sequence ", b, " has ", n, " queries over ", kv_len, " tokens (expected 1 <= queries <= tokens)");
    }
    sequence_ids[b] = batch.sequence_ids[size_t(b)];
    kv_lens[b] = kv_len;
    query_starts[b + 1] = query_starts[b] + n;
  }
  if (query_starts[batch_size] > max_queries) {
    return error(query_starts[batch_size], " queries in one step, over max_queries ", max_queries);
  }
  return metadata;
}

int append_attention_tiles(std::vector<int>& metadata, const PagedAttentionBatch& batch, int tile_positions, int least,
                           int most) {
  int tiles = 0;
  for (size_t b = 0; b < batch.query_counts.size(); ++b) {
    const int n = batch.query_counts[b];
    if (n < least || n > most) continue;
    for (int first = 0; first < n; first += tile_positions, ++tiles) {
      metadata.push_back(int(b));
      metadata.push_back(first);
    }
  }
  return tiles;
}

Expected<std::vector<int>> lay_out_attention_batch(const PagedAttentionBatch& batch, int max_batch, int max_queries,
                                                   int tile_positions) {
  SLIMKV_ASSIGN_OR_RETURN(std::vector<int> metadata, lay_out_attention_sequences(batch, max_batch, max_queries));
  append_attention_tiles(metadata, batch, tile_positions, 1, std::numeric_limits<int>::max());
  return metadata;
}

Status CudaPagedAttention::plan(const PagedAttentionBatch& batch) {
  auto metadata = lay_out_attention_sequences(batch, shape_.max_batch, shape_.max_queries);
  if (!metadata) return metadata.status().with_context("CUDA paged attention");
  // Sequences of several queries take the tensor-core kernel when one has enough for it; the others
  // (decode rows beside a prefill chunk) keep the CUDA-core kernel, whose split-K spreads a long
  // context over the GPU: in a 128-row tensor-core tile one query would fill 4 rows and walk its whole
  // context in one CTA (on H100 such rows cost a 16K-context step more than a 512-token chunk did).
  int max_query_count = 0;
  for (int n : batch.query_counts) max_query_count = std::max(max_query_count, n);
  const bool tensor_cores = prefill_target_ctas_ > 0 && max_query_count >= std::max(2, shape_.tensor_core_min_queries);
  parts_.clear();
  const auto add_part = [&](bool on_tensor_cores, int least, int most) {
    Part part;
    part.tensor_cores = on_tensor_cores;
    part.first_tile = int(metadata->size() - size_t(attention_tiles_offset(shape_.max_batch))) / 2;
    part.num_tiles = append_attention_tiles(*metadata, batch, tile_positions(part), least, most);
    if (part.num_tiles == 0) return;
    const int positions = tile_positions(part);
    for (size_t b = 0; b < batch.kv_lens.size(); ++b) {
      const int n = batch.query_counts[b], kv_len = batch.kv_lens[b];
      if (n < least || n > most) continue;
      const Part::Sequence sequence{(n + positions - 1) / positions, (kv_len + kCudaBlockTokens - 1) / kCudaBlockTokens,
                                    (kv_len - n) / kCudaBlockTokens};
      part.max_query_count = std::max(part.max_query_count, n);
      part.sequences.push_back(sequence);
    }
    parts_.push_back(part);
  };
  constexpr int kAny = std::numeric_limits<int>::max();
  if (tensor_cores) {
    add_part(true, 2, kAny);
    add_part(false, 1, 1);
  } else {
    add_part(false, 1, kAny);
  }
  return metadata_.upload(metadata->data(), metadata->size());
}

int CudaPagedAttention::num_splits() const {
  int splits = 0;
  for (const Part& part : parts_) splits = std::max(splits, part.num_splits);
  return splits;
}

bool CudaPagedAttention::tensor_cores() const {
  return std::any_of(parts_.begin(), parts_.end(), [](const Part& part) { return part.tensor_cores; });
}

int CudaPagedAttention::tile_rows(const Part& part) const { return part.tensor_cores ? kPrefillTileRows : rows_per_tile_; }

int CudaPagedAttention::tile_positions(const Part& part) const {
  return part.tensor_cores ? kPrefillTileRows / group_ : positions_per_tile_;
}

namespace {

// The splits per tile of a kernel of target_ctas resident CTAs (one wave) over num_kv_heads heads.
int splits_per_tile(int target_ctas, int num_kv_heads) { return std::max(1, target_ctas / num_kv_heads); }

// The most splits of a tile of the part's sequences, each tile of at most its sequence's blocks split
// with splits_per_tile (split_rule.h's most_splits_of).
template <typename Sequences>
int most_splits(const Sequences& sequences, int splits_per_tile, int min_blocks) {
  int most = 1;
  for (const auto& sequence : sequences) {
    most = std::max(most, most_splits_of(sequence.blocks, sequence.tiles, splits_per_tile, min_blocks));
  }
  return most;
}

}  // namespace

Status CudaPagedAttention::split_blocks(Part& part, int target_ctas, int min_blocks) {
  part.splits_per_tile = splits_per_tile(target_ctas, shape_.num_kv_heads);
  part.min_blocks_per_split = min_blocks;
  part.num_splits = most_splits(part.sequences, part.splits_per_tile, min_blocks);
  return reserve_partials(size_t(part.num_tiles) * shape_.num_kv_heads * tile_rows(part) * size_t(part.num_splits));
}

Status CudaPagedAttention::reserve_partials(size_t slots) {
  if (slots <= partial_rows_capacity_) return Status::ok();
  SLIMKV_ASSIGN_OR_RETURN(partial_acc_, DeviceArray<float>::allocate(slots * shape_.head_dim, "attention partials"));
  SLIMKV_ASSIGN_OR_RETURN(partial_max_sum_, DeviceArray<float>::allocate(slots * 2, "attention partials"));
  partial_rows_capacity_ = slots;
  return Status::ok();
}

Status CudaPagedAttention::check_run(const PagedKvView& kv) const {
  if (parts_.empty()) return error("CUDA paged attention: run before plan");
  if (kv.head_dim != shape_.head_dim || kv.num_kv_heads != shape_.num_kv_heads) {
    return error("CUDA paged attention: the KV cache has ", kv.num_kv_heads, " heads of ", kv.head_dim,
                 " dims, the attention ", shape_.num_kv_heads, " of ", shape_.head_dim);
  }
  return Status::ok();
}

AttentionLaunch CudaPagedAttention::launch_params(const Part& part, const PagedKvView& kv, const uint16_t* q, float scale,
                                                  uint16_t* out) const {
  AttentionLaunch p = step_launch(q, out, kv.block_tables, kv.block_table_stride, metadata_.data(), shape_.max_batch,
                                  shape_.num_heads, shape_.num_kv_heads, shape_.head_dim, scale,
                                  const_cast<float*>(partial_acc_.data()), const_cast<float*>(partial_max_sum_.data()));
  p.k_pool = reinterpret_cast<const __half*>(kv.k);
  p.v_pool = reinterpret_cast<const __half*>(kv.v);
  p.tiles += part.first_tile;
  p.positions_per_tile = tile_positions(part);
  p.rows_per_tile = tile_rows(part);
  p.splits_per_tile = part.splits_per_tile;
  p.min_blocks_per_split = part.min_blocks_per_split;
  p.num_splits = p.split_stride = part.num_splits;
  p.num_tiles = part.num_tiles;
  return p;
}

static_assert(kHackPrefillTileRows == kPrefillTileRows, "the INT8 and FP16 prefill kernels share the plan's tiles");

Status CudaPagedAttention::run_quantized_prefill(Part& part, const PagedKvView& kv, const QuantizedKvView& sealed,
                                                 const uint16_t* q, float scale, uint16_t* out) {
  const bool none_sealed = std::all_of(part.sequences.begin(), part.sequences.end(),
                                       [](const Part::Sequence& s) { return s.prefix_blocks == 0; });
  if (none_sealed) return run_part(part, kv, q, scale, out, 0);  // nothing sealed before the step: all FP16
  // quant, and hack over KIVI's layouts or ZACK's heads (the INT8 kernel reads HACK's layout at head_dim
  // only): one kernel, the sealed blocks dequantized into its tiles.
  if (!sealed.hack || sealed.k_per_channel || sealed.v_per_token || sealed.heads != nullptr) {
    SLIMKV_RETURN_IF_ERROR(split_blocks(part, prefill_target_ctas_));
    const AttentionLaunch p = launch_params(part, kv, q, scale, out);
    launch_prefill_attention(p, SealedPrefix::kDequantize, sealed);
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
    if (part.num_splits > 1) {
      launch_merge_split_partials(p);
      SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
    }
    return Status::ok();
  }
  // hack: the INT8 kernel over the sealed blocks and the FP16 kernel over the rest write disjoint
  // splits of the same rows (each split to fill one wave of its kernel), merged once.
  const int bits = sealed.k_bits;
  if (sealed.v_bits != bits || (bits != 2 && bits != 4 && bits != 8)) {
    return error("CUDA HACK prefill: K and V bits must be equal (2, 4 or 8), got ", sealed.k_bits, " and ", sealed.v_bits);
  }
  if (hack_prefill_resident_[bits] == 0) {
    hack_prefill_resident_[bits] = hack_prefill_kernel_setup(shape_.head_dim, bits, sealed.offsets.block_bytes);
    if (hack_prefill_resident_[bits] == 0) {
      return error("CUDA HACK prefill: the INT8 kernel (head_dim ", shape_.head_dim, ", ", bits, " bits) cannot run");
    }
  }
  // Each sequence's splits are its own (as in one kernel): its sealed splits, then its window's. Every
  // slot of every row is written (the merge reads them all): the sealed kernel's grid writes the first
  // ones (empty past a tile's own splits), the window kernel's the rest, from where the tile's sealed
  // splits end to the stride (its grid as wide as the stride; CTAs past it write nothing).
  const int sealed_per_tile = splits_per_tile(hack_prefill_resident_[bits] * multiprocessor_count(), shape_.num_kv_heads);
  const int window_per_tile = splits_per_tile(prefill_target_ctas_, shape_.num_kv_heads);
  const auto sealed_splits_of = [&](const Part::Sequence& s) { return most_splits_of(s.prefix_blocks, s.tiles, sealed_per_tile); };
  const auto window_splits_of = [&](const Part::Sequence& s) {
    return most_splits_of(s.blocks - s.prefix_blocks, s.tiles, window_per_tile);
  };
  int sealed_splits = 1, split_stride = 1;
  for (const Part::Sequence& s : part.sequences) {
    sealed_splits = std::max(sealed_splits, sealed_splits_of(s));
    split_stride = std::max(split_stride, sealed_splits_of(s) + window_splits_of(s));
  }
  SLIMKV_RETURN_IF_ERROR(reserve_partials(size_t(part.num_tiles) * shape_.num_kv_heads * kPrefillTileRows * size_t(split_stride)));
  AttentionLaunch p = launch_params(part, kv, q, scale, out);
  p.min_blocks_per_split = kMinBlocksPerSplit;  // the rule both kernels' splits were counted with above
  p.split_stride = split_stride;
  AttentionLaunch sealed_part = p, window_part = p;
  sealed_part.num_splits = sealed_splits;
  sealed_part.splits_per_tile = sealed_per_tile;
  launch_hack_prefill_kernel(sealed_part, sealed);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  window_part.num_splits = split_stride;
  window_part.splits_per_tile = window_per_tile;
  window_part.after_splits_per_tile = sealed_per_tile;
  launch_prefill_attention(window_part, SealedPrefix::kSkip);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  launch_merge_split_partials(p);
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  return Status::ok();
}

Status CudaPagedAttention::run(const PagedKvView& kv, const uint16_t* q, float scale, uint16_t* out, int window_tokens) {
  SLIMKV_RETURN_IF_ERROR(check_run(kv));
  if (window_tokens < 0) return error("CUDA paged attention: window of ", window_tokens, " tokens (expected >= 0)");
  for (Part& part : parts_) SLIMKV_RETURN_IF_ERROR(run_part(part, kv, q, scale, out, window_tokens));
  return Status::ok();
}

Status CudaPagedAttention::run_part(Part& part, const PagedKvView& kv, const uint16_t* q, float scale, uint16_t* out,
                                    int window_tokens) {
  SLIMKV_RETURN_IF_ERROR(split_blocks(part, part.tensor_cores ? prefill_target_ctas_ : target_ctas_));
  AttentionLaunch p = launch_params(part, kv, q, scale, out);
  p.window_tokens = window_tokens;
  if (part.tensor_cores) {
    launch_prefill_attention(p);  // one split writes the output itself
  } else {
    with_kernel_shape(shape_.head_dim, rows_per_tile_, LaunchPartials{p});
  }
  SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  if (!part.tensor_cores || part.num_splits > 1) {
    launch_merge_split_partials(p);
    SLIMKV_CUDA_RETURN_IF_LAUNCH_FAILED();
  }
  return Status::ok();
}

}  // namespace slimkv::cuda
