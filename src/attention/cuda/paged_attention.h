// Attention over the GPU's paged FP16 KV store (kv/cuda/paged_kv_cache.h), for a batch of
// sequences of different lengths in one launch: decode (one new query per sequence) and prefill
// (many new queries per sequence, causal) are the same kernel.
//
// Work is split as in flash-decoding: the grid is (KV split, KV head, query tile). A query tile is
// the GQA group of query heads that share a KV head, over one or more consecutive positions, so each
// block of K/V is read once for all of them. Each CTA computes the attention partial (running max,
// sum, weighted V: attention/partial.h) of its tile over its range of blocks; a second kernel merges
// the splits' partials with the online-softmax rule and writes acc / sum.
//
// Sequences with several queries in a step (prefill) take the tensor-core kernel instead
// (attention/cuda/prefill_attention.cuh: 128-row tiles, mma.sync, FlashAttention-2 style); decode
// takes the CUDA-core one (4 or 8 rows, at the memory roofline). A step that mixes them (a server's
// prefill chunk beside running decodes) runs in two parts, each sequence on its own kernel.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "attention/cuda/kv_views.h"
#include "attention/split_rule.h"
#include "backend/cuda/device_memory.h"

namespace slimkv::cuda {

struct AttentionLaunch;  // attention/cuda/split_k.cuh

// The default of PagedAttentionShape::tensor_core_min_queries. Measured on H100, batch 8, 32 q / 8 kv
// heads, d 128, 16K context: the tensor-core kernel is faster from 2 queries per sequence on (0.238 vs
// 0.265 ms; 16 queries: 0.243 vs 1.95 ms); one query (decode) keeps the CUDA-core kernel.
constexpr int kPrefillMinQueries = 2;

// One step's batch: sequence i (cache id sequence_ids[i]) holds kv_lens[i] tokens, of which the last
// query_counts[i] are the new ones whose queries attend (1 for decode). Queries are laid out sequence
// by sequence, as the cache's begin_step lays out new tokens.
struct PagedAttentionBatch {
  std::vector<int> sequence_ids;
  std::vector<int> kv_lens;
  std::vector<int> query_counts;
};

// Where the tiles start in a step's metadata: after the per-sequence arrays, rounded up for int2 loads.
inline int attention_tiles_offset(int max_batch) { return (3 * max_batch + 2) / 2 * 2; }

// A step's batch as the attention kernels read it (split_k.cuh's AttentionLaunch, point_at_batch):
// [sequence ids | kv_lens, each padded to max_batch | query_starts, max_batch + 1 | pad |
// tiles: (batch index, first query) every tile_positions queries of each sequence]. The planners of
// CudaPagedAttention and of the INT8 prefill kernel (hack_prefill_attention.cuh) share it. Errors
// name what is out of range: the batch's size, a query count, the step's queries.
Expected<std::vector<int>> lay_out_attention_batch(const PagedAttentionBatch& batch, int max_batch, int max_queries,
                                                   int tile_positions);
// The same without tiles (the per-sequence arrays and their checks), and the tiles of the sequences
// with least..most queries appended to it; returns how many tiles it appended.
Expected<std::vector<int>> lay_out_attention_sequences(const PagedAttentionBatch& batch, int max_batch, int max_queries);
int append_attention_tiles(std::vector<int>& metadata, const PagedAttentionBatch& batch, int tile_positions, int least,
                           int most);

// The head dims the kernels are built for (16, 32, 64, 128, 256; 256 on the CUDA-core kernel alone, for
// prefill too, and without quantized KV): the smallest of them that holds head_dim (a model's heads of
// another size are stored zero-padded to it), or 0 when none does.
int attention_head_dim_for(int head_dim);

struct PagedAttentionShape {
  int num_heads = 0;     // query heads; num_heads / num_kv_heads (at most 8) share a KV head
  int num_kv_heads = 0;
  int head_dim = 0;      // 16, 32, 64, 128 or 256
  int max_batch = 0;     // sequences per step
  int max_queries = 0;   // queries per step, over all sequences
  // A step in which some sequence has at least this many queries (at least 2: decode keeps the
  // CUDA-core kernel's tiles, which the quantized kernels share) runs its sequences of two or more
  // queries on the tensor-core kernel (head_dim 64 or 128; 0: never).
  int tensor_core_min_queries = kPrefillMinQueries;
  // Decode over 2-bit HACK blocks of head_dim 128 on INT8 tensor cores (quantized_attention.cu's
  // MmaLanes); false: the dp4a kernel, which gives the same bits (tests hold the two to each other).
  bool integer_tensor_cores = true;
};

class CudaPagedAttention {
 public:
  static Expected<std::unique_ptr<CudaPagedAttention>> create(const PagedAttentionShape& shape);

  // Checks the batch, lays out query tiles, picks the split-K factor and uploads the batch's
  // metadata. The plan holds until the next call (a decode step reuses it for every layer).
  Status plan(const PagedAttentionBatch& batch);

  // q: FP16 [total queries, num_heads, head_dim] (device), out likewise; scores are scale · q·k.
  // window_tokens > 0 (a sliding-window layer): a query at position p sees tokens p - window_tokens + 1
  // .. p only, and blocks wholly before that are not read (they may have been given back).
  Status run(const PagedKvView& kv, const uint16_t* q, float scale, uint16_t* out, int window_tokens = 0);

  // Attention over quantized KV (kv/cuda/quantized_kv_cache.h): sealed `hack` or `quant` blocks
  // and FP16 for the rest. Decode (one query per sequence; attention/cuda/quantized_attention.cu): the
  // sealed blocks, then the open block (the last kv_len % kCudaBlockTokens tokens) in FP16; `hack`
  // computes on the integer codes (HACK Eq. 4), `quant` dequantizes in the kernel and computes in FP32.
  // Prefill (the tensor-core plan): the sealed blocks wholly before each sequence's first new token,
  // `hack` on INT8 tensor cores (hack_prefill_attention.cuh), `quant` dequantized into the FP16
  // kernel's tiles; from the first unsealed block on, FP16 (prefill=exact: the step's own tokens as
  // computed). Other multi-query steps (head dims without the tensor-core kernel) are refused.
  Status run_quantized(const PagedKvView& kv, const QuantizedKvView& sealed, const uint16_t* q, float scale,
                       uint16_t* out);

  const PagedAttentionShape& shape() const { return shape_; }
  int num_splits() const;     // the most splits of the planned step's parts
  bool tensor_cores() const;  // whether some sequence of the planned step takes the tensor-core kernel

 private:
  // The sequences of a planned step that run on one kernel: their tiles (consecutive in the metadata)
  // and how their blocks are split. The parts run one after the other, sharing the partials.
  struct Part {
    // A sequence's tiles and blocks: all, and those wholly before the step (sealed, with quantized KV);
    // its tiles' splits are its own (split_rule.h), the part's the most of them.
    struct Sequence {
      int tiles = 0, blocks = 0, prefix_blocks = 0;
    };
    bool tensor_cores = false;
    int first_tile = 0, num_tiles = 0;
    int max_query_count = 0;  // the most queries of one of its sequences
    std::vector<Sequence> sequences;
    int splits_per_tile = 1, min_blocks_per_split = kMinBlocksPerSplit, num_splits = 1;
  };

  explicit CudaPagedAttention(const PagedAttentionShape& shape) : shape_(shape) {}
  Status check_run(const PagedKvView& kv) const;
  // Splits each sequence's blocks so that it alone would run about target_ctas CTAs (one wave of the
  // kernel at hand), each of at least min_blocks blocks, and makes the partials hold the part's splits.
  Status split_blocks(Part& part, int target_ctas, int min_blocks = kMinBlocksPerSplit);
  // The dense FP16 kernel of the part (tensor-core or CUDA-core) over its sequences.
  Status run_part(Part& part, const PagedKvView& kv, const uint16_t* q, float scale, uint16_t* out, int window_tokens);
  Status run_quantized_decode(Part& part, const PagedKvView& kv, const QuantizedKvView& sealed, const uint16_t* q,
                              float scale, uint16_t* out);
  Status run_quantized_prefill(Part& part, const PagedKvView& kv, const QuantizedKvView& sealed, const uint16_t* q,
                               float scale, uint16_t* out);
  // Makes the partials hold at least `slots` (rows × splits).
  Status reserve_partials(size_t slots);
  // A part's kernel's tile: query rows (a multiple of the group, or the tensor-core tile) and positions.
  int tile_rows(const Part& part) const;
  int tile_positions(const Part& part) const;
  AttentionLaunch launch_params(const Part& part, const PagedKvView& kv, const uint16_t* q, float scale,
                                uint16_t* out) const;

  PagedAttentionShape shape_;
  int group_ = 0;               // query heads per KV head
  int rows_per_tile_ = 0;       // the kernel's query rows: 4 or 8 (an instantiation)
  int positions_per_tile_ = 0;  // rows_per_tile / group
  int target_ctas_ = 0;         // enough CTAs to keep every multiprocessor busy
  int prefill_target_ctas_ = 0; // the same for the tensor-core kernel (0: head_dim not supported)
  size_t partial_rows_capacity_ = 0;
  // Planned: the step's parts (none before the first plan).
  std::vector<Part> parts_;
  // Device: the batch's metadata [sequence_ids B | kv_lens B | query_starts B+1 | pad | tiles 2·max_queries],
  // and the partials [tile, kv head, row, split] of (max, sum) and [.., head_dim] of weighted V.
  DeviceArray<int> metadata_;
  DeviceArray<float> partial_acc_;
  DeviceArray<float> partial_max_sum_;
  // The quantized kernels set up so far: (kernel, (staging bytes, CTAs resident per multiprocessor)).
  std::vector<std::pair<const void*, std::pair<size_t, int>>> quantized_residency_;
  int hack_prefill_resident_[9] = {};  // the INT8 prefill kernel's CTAs per multiprocessor, by bits (0: not set up)
};

}  // namespace slimkv::cuda
