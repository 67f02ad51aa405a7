// Attention over ZACK's reduced KV (ZACK §5.1–5.3) on the GPU: every (layer, KV head) at its own K and V
// ranks (kv_views.h ZackKvView), scores q'·k' on the head's k_rank dims and outputs on its v_rank dims,
// with no decompression (Lemma 2: the rotations are folded into W_V / W_O and applied to q, k after RoPE).
//
// Decode (one query per sequence): causal query tiles of the GQA group (4 or 8 rows, as the dense
// CUDA-core kernel); the work of a step is cut into tasks (query tile, KV head, range of blocks), each
// computed by one CTA on the tensor cores into online-softmax partials, then merged per row. A task's cost
// is blocks · (k_rank + v_rank), so with adaptive ranks equal block ranges take unequal time. ZACK §5.3
// balances them:
//   kBalanced: each head takes a share of the wave of tasks by its cost (more tasks of fewer blocks for
//              high-rank heads), and the tasks run longest first, each CTA taking the next one when it
//              is free (the paper's descending sort, then "the SM with the smallest cumulative time").
//   kUniform:  the same tasks for every head, in head order (what a kernel blind to ranks does; kept to
//              measure the balancing against).
// A unit's (query tile, KV head) tasks are cut by its own sequence alone (attention/split_rule.h: the
// wave a sequence alone would fill, the head's share of it), and merged in their order: a sequence's
// output has the same bits whatever shares the step (issue 22); only which CTA takes a task, and when,
// depends on the step.
// Prefill (a step in which some sequence has kPrefillMinQueries or more queries, head_dim 64 or 128): those
// sequences take the tensor-core prefill kernel (zack_prefill_attention.cuh: 128-row tiles, each block
// staged once per tile, split-K as the dense prefill's, by the tile's sequence alone), the step's
// one-query sequences the tasks above. Its splits: kBalanced gives each head a share of the wave of CTAs
// by its cost, kUniform the same splits to every head. Prefill runs kUniform unless told otherwise: on an
// H100 the balanced splits were slower at every context and compression measured (docs/cuda.md).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "attention/cuda/kv_views.h"
#include "attention/cuda/paged_attention.h"
#include "backend/cuda/device_memory.h"

namespace slimkv::cuda {

enum class ZackSchedule { kBalanced, kUniform };

// The schedules of a step's two kernels: the decode tasks' and the prefill kernel's splits.
struct ZackSchedules {
  ZackSchedule decode = ZackSchedule::kBalanced;
  ZackSchedule prefill = ZackSchedule::kUniform;
};

// One CTA's work: the query tile's rows of one KV head over blocks [block_begin, block_end).
struct ZackTask {
  int tile = 0, kv_head = 0, block_begin = 0, block_end = 0;
};

struct ZackAttentionShape {
  int num_layers = 0;
  int num_heads = 0;     // query heads; num_heads / num_kv_heads (at most 8) share a KV head
  int num_kv_heads = 0;
  int head_dim = 0;      // the full head dim (q and out rows), at most 128
  int max_batch = 0;     // sequences per step
  int max_queries = 0;   // queries per step, over all sequences
  // [num_layers · num_kv_heads]: each (layer, KV head)'s Q–K and V–W_O ranks, 1..head_dim.
  std::vector<int> k_ranks, v_ranks;
  // Tasks per CTA resident on the GPU that a sequence alone is cut into (a batch of B sequences makes
  // about B times as many): more evens out the CTAs' ends, fewer costs fewer partials to merge
  // (docs/results/cuda/zack_attention.txt; bench_zack_attention_cuda --tasks-per-cta).
  int tasks_per_cta = 1;
};

class CudaZackAttention {
 public:
  static Expected<std::unique_ptr<CudaZackAttention>> create(const ZackAttentionShape& shape);

  // Lays out the step's tasks for every layer (their ranks differ) and uploads them once (a decode step
  // whose tiles read the blocks the last plan's read keeps them: only its metadata is uploaded), and the
  // prefill kernel's tiles and splits; the plan holds until the next call.
  Status plan(const PagedAttentionBatch& batch, ZackSchedules schedules = {});

  // q: FP16 [queries, num_heads, head_dim] whose head h holds its reduced query in the first
  // k_rank(layer, h's KV head) entries; out likewise: the first v_rank entries of each head are the
  // attention output in the reduced V space, the rest 0. Scores are scale · q'·k'.
  Status run(int layer, const ZackKvView& kv, const uint16_t* q, float scale, uint16_t* out);

  const ZackAttentionShape& shape() const { return shape_; }
  // The planned step's decode tasks of a layer, and its tiles on the prefill kernel (0: none).
  int num_tasks(int layer) const { return layer_tasks_[size_t(layer) + 1] - layer_tasks_[size_t(layer)]; }
  int num_prefill_tiles() const { return prefill_.num_tiles; }

 private:
  // The planned step's sequences on the prefill kernel: their tiles (after the decode tiles in the
  // metadata) and the most splits of any of their tiles (prefill_splits_per_tile_ has each head's rule).
  struct PrefillPart {
    int first_tile = 0, num_tiles = 0;
    int num_splits = 1;
  };
  // A decode tile: the blocks it reads and its sequence's tiles (what its tasks are cut by).
  struct DecodeTile {
    int blocks = 0, sequence_tiles = 1;
    bool operator==(const DecodeTile& other) const { return blocks == other.blocks && sequence_tiles == other.sequence_tiles; }
  };

  explicit CudaZackAttention(const ZackAttentionShape& shape) : shape_(shape) {}
  // A block's cost for a (layer, KV head): its staged K' and V' rows plus a fixed overhead in rows.
  double block_cost(int layer, int kv_head, int overhead) const;
  // Each (layer, KV head)'s splits_per_tile (split_rule.h) for a kernel of target_ctas CTAs a wave: the
  // wave over the KV heads, each head's share by its block_cost against its layer's mean (balanced: a
  // head of twice the cost takes twice the splits, its CTAs as long as the others'), or equal (uniform).
  // [num_layers · num_kv_heads], of the shape alone, never of the step.
  std::vector<int> head_splits_per_tile(int target_ctas, int overhead, ZackSchedule schedule) const;
  Status plan_tasks(const std::vector<DecodeTile>& tiles, ZackSchedule schedule);
  Status plan_prefill_splits(const PagedAttentionBatch& batch, ZackSchedule schedule);
  Status run_decode(int layer, const ZackKvView& kv, const uint16_t* q, float scale, uint16_t* out);
  Status run_prefill(int layer, const ZackKvView& kv, const uint16_t* q, float scale, uint16_t* out);

  ZackAttentionShape shape_;
  int group_ = 0, rows_per_tile_ = 0, positions_per_tile_ = 0;
  int resident_ctas_ = 0;   // CTAs of the kernel resident on the whole GPU at once
  int staged_elements_ = 0; // one (block, KV head)'s part at the largest ranks: each CTA stages two
  int prefill_target_ctas_ = 0;  // one wave of the prefill kernel (0: head_dim without it)
  // Planned: the batch's metadata (lay_out_attention_batch), per layer the tasks (canonical order:
  // unit by unit, a unit being a (query tile, KV head)), their execution order, each unit's first task.
  int num_tiles_ = 0;  // decode tiles, the first of the metadata's
  PrefillPart prefill_;
  ZackSchedule schedule_ = ZackSchedule::kBalanced;  // the decode tasks'; the prefill's is in its splits
  std::vector<int> layer_tasks_;  // [num_layers + 1]: each layer's first task
  std::vector<DecodeTile> planned_tiles_;  // the decode tiles when the tasks were laid out
  size_t decode_partial_rows_ = 0;        // the tasks' partial rows (of the layer with the most)
  DeviceArray<int> metadata_;
  DeviceArray<ZackTask> tasks_;
  DeviceArray<int> order_;        // [tasks]: canonical task index, in the order CTAs take them
  DeviceArray<int> unit_tasks_;   // [num_layers, units + 1]: each unit's first task (within its layer)
  DeviceArray<int> counters_;     // [num_layers]: the next task to take
  DeviceArray<int> prefill_splits_per_tile_;  // [num_layers, num_kv_heads]: each head's, on the prefill kernel
  // Decode: [tasks of a layer, rows_per_tile, head_dim] and [.., 2] (base-2 max, sum); then
  // prefill, reusing them: split_k.cuh's [tiles, num_kv_heads, kPrefillTileRows, splits, head_dim] and [.., 2].
  DeviceArray<float> partial_acc_;
  DeviceArray<float> partial_max_sum_;
};

}  // namespace slimkv::cuda
