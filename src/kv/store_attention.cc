#include "kv/store_attention.h"

#include <algorithm>
#include <cassert>
#include <climits>
#include <vector>

#include "attention/cpu/dense_block_attention.h"
#include "kv/rotation.h"

namespace slimkv {
namespace {

// Query positions per tile: with the GQA group, a tile is up to this many positions × group heads,
// so each block is read once for all of them.
constexpr int kTilePositions = 16;

// Tokens [block_start, block_start + block_len) as seen by each query of the tile, of those before
// `end` (a query at position p sees positions <= p).
void visible_tokens(int first_tile_position, int group, int n_rows, int block_start, int block_len, int end,
                    int* visible) {
  for (int r = 0; r < n_rows; ++r) {
    const int position = first_tile_position + r / group;
    visible[r] = std::clamp(std::min(position + 1, end) - block_start, 0, block_len);
  }
}

// Whole rows of tokens [start, start + len) in FP32 or FP16/BF16 (`dtype`: the open block as stored, or a
// prefill chunk's own in FP32) for a tile: each query sees those before `end` and at its position or
// earlier, and none before `window_first` (the first position of a one-position tile's window; 0 without a
// window). The half kernel widens in registers: the bits of the FP32 kernel over widened rows, without
// the copy (per decode token and head, the open block's widening was 3% of a 16-sequence step).
void attend_rows_range(QueryTile tile, int* visible, const void* k, const void* v, DType dtype, int k_dim, int v_dim,
                       int first_tile_position, int group, int start, int len, int end, int window_first,
                       AttentionPartials& partials) {
  const int skip = std::clamp(window_first - start, 0, len);
  if (skip == len) return;
  visible_tokens(first_tile_position, group, tile.n_queries, start + skip, len - skip, end, visible);
  const size_t element = dtype_size_bytes(dtype);
  const auto* k_rows = static_cast<const uint8_t*>(k) + size_t(skip) * size_t(k_dim) * element;
  const auto* v_rows = static_cast<const uint8_t*>(v) + size_t(skip) * size_t(v_dim) * element;
  if (dtype == DType::kF32) {
    attend_block_f32(tile, reinterpret_cast<const float*>(k_rows), reinterpret_cast<const float*>(v_rows), k_dim,
                     v_dim, partials, 0);
  } else {
    attend_block_half(tile, reinterpret_cast<const uint16_t*>(k_rows), reinterpret_cast<const uint16_t*>(v_rows),
                      dtype, k_dim, v_dim, partials, 0);
  }
}

// Rows [first_row, first_row + count) of sealed block b of KV head g, decoded to FP32 for the FP32
// kernel: the part of a block the codec's kernel cannot read alone (it reads a block's rows from its
// first): where a sliding window starts inside the block, or after block 0's sink tokens (sinks=N).
// Each query sees those rows before `end` and at its position or earlier.
void attend_block_rows(const KvStore& store, int layer, int g, int b, int first_row, int count, QueryTile tile,
                       int* visible, int first_tile_position, int group, int end, AttentionPartials& partials) {
  const BlockShape& shape = store.block_shape(layer, g);
  thread_local std::vector<int> rows;
  thread_local std::vector<float> k, v;
  rows.resize(size_t(count));
  for (int r = 0; r < count; ++r) rows[size_t(r)] = first_row + r;
  k.resize(size_t(count) * size_t(shape.k_dim));
  v.resize(size_t(count) * size_t(shape.v_dim));
  store.codec(layer, g).decode_tokens(shape, store.sealed_block(layer, g, b), rows.data(), count, k.data(), v.data());
  visible_tokens(first_tile_position, group, tile.n_queries, b * shape.block_tokens + first_row, count, end, visible);
  attend_block_f32(tile, k.data(), v.data(), shape.k_dim, shape.v_dim, partials, 0);
}

// The sealed blocks' part of one decode query tile (one position: a row per query head of the group) over
// the selected tokens (ascending) of KV head g. A block whose tokens are all selected, none with given
// scores, is read by its codec's kernel; from the others the selected tokens are decoded and gathered
// into FP32 chunks: keys and values, or only values for tokens whose scores the selector gives (its exact
// re-rank read their keys a moment ago: HeadSelection::scores).
void attend_selected_sealed(const KvStore& store, int layer, int g, const HeadSelection& selection, float scale,
                            QueryTile tile, int* visible, AttentionPartials& partials) {
  const BlockShape& shape = store.block_shape(layer, g);
  const int block_tokens = shape.block_tokens;
  const int sealed_tokens = store.num_sealed_blocks(layer) * block_tokens;
  const std::vector<int>& tokens = selection.tokens;
  const int rows_per_token = tile.n_queries;
  thread_local std::vector<float> gathered_k, gathered_v, scored_v, gathered_scores;
  gathered_k.resize(size_t(block_tokens) * size_t(shape.k_dim));
  gathered_v.resize(size_t(block_tokens) * size_t(shape.v_dim));
  scored_v.resize(size_t(block_tokens) * size_t(shape.v_dim));
  gathered_scores.resize(size_t(block_tokens) * size_t(rows_per_token));
  int gathered = 0, scored = 0;
  const auto flush = [&] {
    std::fill(visible, visible + tile.n_queries, gathered);
    attend_block_f32(tile, gathered_k.data(), gathered_v.data(), shape.k_dim, shape.v_dim, partials, 0);
    gathered = 0;
  };
  const auto flush_scored = [&] {
    attend_scored_f32(gathered_scores.data(), scale, rows_per_token, scored_v.data(), scored, shape.v_dim, partials, 0);
    scored = 0;
  };
  // Tokens [scored_begin, scored_end) of the list have scores given (the ranked ones: tokens ascend).
  const bool scores_given = !selection.scores.empty();
  const auto index_of = [&](int token) {
    return size_t(std::lower_bound(tokens.begin(), tokens.end(), token) - tokens.begin());
  };
  const size_t sealed_end = index_of(sealed_tokens);
  const size_t scored_begin = scores_given ? index_of(selection.ranked_first) : 0;
  const size_t scored_end = scores_given ? index_of(selection.ranked_last) : 0;
  assert(selection.scores.size() == (scored_end - scored_begin) * size_t(rows_per_token));
  // Asks for the rows of tokens [first, last) of the list: values, and keys unless scores are given.
  const auto prefetch = [&](size_t first, size_t last) {
    last = std::min(last, sealed_end);
    for (size_t begin = first; begin < last;) {
      const bool scored = begin >= scored_begin && begin < scored_end;
      const size_t end = std::min(last, scored ? scored_end : begin < scored_begin ? scored_begin : last);
      store.prefetch_sealed_tokens(layer, g, tokens.data() + begin, int(end - begin), !scored, true);
      begin = end;
    }
  };
  constexpr size_t ahead = KvStore::kPrefetchTokens;
  thread_local std::vector<int> rows, scored_rows;
  const float* next_scores = selection.scores.data();  // the scores of the next scored token
  prefetch(0, ahead);
  for (size_t i = 0; i < sealed_end;) {
    const int b = tokens[i] / block_tokens;
    const size_t first = i;
    rows.clear();
    scored_rows.clear();
    for (; i < sealed_end && tokens[i] < (b + 1) * block_tokens; ++i) {
      (i >= scored_begin && i < scored_end ? scored_rows : rows).push_back(tokens[i] - b * block_tokens);
    }
    prefetch(first + ahead, i + ahead);  // the rows `ahead` tokens past this block's
    const uint8_t* block = store.sealed_block(layer, g, b);
    if (int(rows.size()) == block_tokens) {
      std::fill(visible, visible + tile.n_queries, block_tokens);
      store.codec(layer, g).attend(shape, {&block, 1}, tile, partials, 0);
      continue;
    }
    for (size_t done = 0; done < rows.size();) {
      const int take = std::min(int(rows.size() - done), block_tokens - gathered);
      store.codec(layer, g).decode_tokens(shape, block, rows.data() + done, take,
                                  gathered_k.data() + size_t(gathered) * shape.k_dim,
                                  gathered_v.data() + size_t(gathered) * shape.v_dim);
      gathered += take;
      done += size_t(take);
      if (gathered == block_tokens) flush();
    }
    for (size_t done = 0; done < scored_rows.size();) {
      const int take = std::min(int(scored_rows.size() - done), block_tokens - scored);
      store.codec(layer, g).decode_tokens(shape, block, scored_rows.data() + done, take, nullptr,
                                  scored_v.data() + size_t(scored) * shape.v_dim);
      const size_t score_count = size_t(take) * size_t(rows_per_token);
      std::copy(next_scores, next_scores + score_count,
                gathered_scores.data() + size_t(scored) * size_t(rows_per_token));
      next_scores += score_count;
      scored += take;
      done += size_t(take);
      if (scored == block_tokens) flush_scored();
    }
  }
  if (gathered > 0) flush();
  if (scored > 0) flush_scored();
}

// Where each KV head's group of query heads starts in a row of q / out, and the rows' widths.
struct HeadOffsets {
  std::vector<int> q, out;  // [num_kv_heads]
  int q_row = 0, out_row = 0;
};

HeadOffsets head_offsets(const KvShape& shape, int layer, int group) {
  HeadOffsets offsets;
  for (int g = 0; g < shape.num_kv_heads; ++g) {
    offsets.q.push_back(offsets.q_row);
    offsets.out.push_back(offsets.out_row);
    offsets.q_row += group * shape.k_dim_of(layer, g);
    offsets.out_row += group * shape.v_dim_of(layer, g);
  }
  return offsets;
}

// Task indices (task = tile · num_kv_heads + head) by decreasing work, ties in index order (ZACK §5.3's
// longest-processing-time-first: the pool hands tasks out in this order to whichever thread is free).
std::vector<int> longest_first_order(const KvShape& shape, int layer, int tiles, int tile_positions, int n,
                                     int first_position) {
  std::vector<int64_t> work(size_t(tiles) * size_t(shape.num_kv_heads));
  for (int t = 0; t < tiles; ++t) {
    const int positions = std::min(tile_positions, n - t * tile_positions);
    const int64_t tokens = first_position + int64_t(t) * tile_positions + positions;  // seen by its last query
    for (int g = 0; g < shape.num_kv_heads; ++g) {
      work[size_t(t) * shape.num_kv_heads + g] = int64_t(shape.k_dim_of(layer, g) + shape.v_dim_of(layer, g) + 1) *
                                                 positions * tokens;
    }
  }
  std::vector<int> order(work.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return work[size_t(a)] > work[size_t(b)]; });
  return order;
}

// What a call's tasks share: their count, the query positions per tile (one with a sliding window: each
// query's window starts elsewhere), the heads' offsets in q / out, the order they are taken in.
struct CallPlan {
  int tasks = 0;
  int tile_positions = kTilePositions;
  HeadOffsets offsets;
  std::vector<int> order;  // empty: index order
};

CallPlan plan_call(const AttendCall& call, int layer, const AttentionParams& params) {
  const KvShape& shape = call.store->shape();
  assert(call.store->num_tokens(layer) == call.first_position + call.n);
  CallPlan plan;
  plan.tile_positions = params.window_tokens > 0 ? 1 : kTilePositions;
  const int tiles = (call.n + plan.tile_positions - 1) / plan.tile_positions;
  plan.tasks = shape.num_kv_heads * tiles;
  plan.offsets = head_offsets(shape, layer, params.num_heads / shape.num_kv_heads);
  if (params.longest_task_first) {
    plan.order = longest_first_order(shape, layer, tiles, plan.tile_positions, call.n, call.first_position);
  }
  return plan;
}

// Task `task_index` of a call: one KV head over one tile of query positions.
void attend_task(const AttendCall& call, int layer, const AttentionParams& params, const CallPlan& plan,
                 int64_t task_index) {
  const KvStore& store = *call.store;
  const KvShape& shape = store.shape();
  const float* q = call.q;
  const int n = call.n, first_position = call.first_position;
  const int group = params.num_heads / shape.num_kv_heads;
  const int block_tokens = store.block_tokens();
  const int sealed = store.num_sealed_blocks(layer);
  const int open_tokens = store.open_tokens(layer);
  const HeadOffsets& offsets = plan.offsets;
  // This thread's scratch, reused from task to task.
  thread_local std::vector<float> q_tile;
  thread_local std::vector<int> visible;
  thread_local std::vector<uint8_t> prepared;
  thread_local AttentionPartials partials(0, 0);
  const int task = plan.order.empty() ? int(task_index) : plan.order[size_t(task_index)];
  const int g = task % shape.num_kv_heads;
  const BlockShape& block_shape = store.block_shape(layer, g);
  const int k_dim = block_shape.k_dim, v_dim = block_shape.v_dim;
  q_tile.resize(size_t(kTilePositions) * group * k_dim);
  visible.resize(size_t(kTilePositions) * group);
  const int first = (task / shape.num_kv_heads) * plan.tile_positions;  // first query (row of q) in the tile
  const int positions = std::min(plan.tile_positions, n - first);
  const int rows = positions * group;
  // Gather the group's queries, scaled: row r = (position r / group, head g·group + r % group).
  for (int r = 0; r < rows; ++r) {
    const float* src = q + size_t(first + r / group) * offsets.q_row + offsets.q[size_t(g)] + size_t(r % group) * k_dim;
    float* dst = q_tile.data() + size_t(r) * k_dim;
    for (int c = 0; c < k_dim; ++c) dst[c] = src[c] * params.scale;
    if (store.rotated()) hadamard_rotate(dst, k_dim);
  }
  partials.reset(rows, v_dim);
  QueryTile tile{q_tile.data(), rows, visible.data()};
  store.codec(layer, g).prepare_queries(block_shape, tile, prepared);
  tile.prepared = prepared.data();
  const int first_tile_position = first_position + first;
  const int last_tile_position = first_tile_position + positions - 1;
  // With a window, the tile's one query sees tokens from window_first on (blocks before it are freed).
  const int window = params.window_tokens;
  const int window_first = window > 0 ? std::max(0, first_tile_position - window + 1) : 0;
  const bool selected = call.selection && n == 1 && !(*call.selection)[size_t(g)].all;
  if (selected) {
    attend_selected_sealed(store, layer, g, (*call.selection)[size_t(g)], params.scale, tile, visible.data(), partials);
  }
  // prefill=exact: the store's tokens up to the chunk, then the chunk's own as appended.
  const KvStore::ExactChunk chunk = store.exact_chunk(layer, g);
  const bool exact = chunk.n == n && chunk.first_token == first_position;
  const int store_end = exact ? first_position : last_tile_position + 1;  // tokens read from the store
  const int first_block = std::max(store.first_live_block(layer), window_first / block_tokens);
  const int sinks = store.sink_tokens(layer);  // sinks=N: block 0's first N tokens from FP16
  // The blocks every query of the tile sees whole (all sealed ones, in decode) go to the codec's kernel
  // in runs, read in order as one at a time would be.
  const int whole_end = std::min(first_tile_position + 1, store_end);  // tokens before it: seen by every query
  thread_local std::vector<const uint8_t*> run;
  run.clear();
  const auto attend_run = [&] {
    if (run.empty()) return;
    std::fill(visible.begin(), visible.begin() + rows, block_tokens);
    store.codec(layer, g).attend(block_shape, run, tile, partials, 0);
    run.clear();
  };
  for (int b = first_block; !selected && b < sealed && b * block_tokens < store_end; ++b) {
    if (b * block_tokens < window_first) {  // the window starts inside this block: its tokens in it only
      const int skip = window_first - b * block_tokens;
      const int count = std::clamp(std::min(last_tile_position + 1, store_end) - window_first, 0, block_tokens - skip);
      if (count > 0) {
        attend_block_rows(store, layer, g, b, skip, count, tile, visible.data(), first_tile_position, group, store_end,
                          partials);
      }
      continue;
    }
    if (b == 0 && sinks > 0) {
      attend_rows_range(tile, visible.data(), store.sink_keys(layer, g), store.sink_values(layer, g),
                        store.open_dtype(), k_dim, v_dim, first_tile_position, group, 0, sinks, store_end, 0, partials);
      if (sinks < block_tokens) {
        attend_block_rows(store, layer, g, b, sinks, block_tokens - sinks, tile, visible.data(), first_tile_position,
                          group, store_end, partials);
      }
      continue;
    }
    const uint8_t* block = store.sealed_block(layer, g, b);
    if ((b + 1) * block_tokens <= whole_end) {
      run.push_back(block);
      continue;
    }
    attend_run();
    visible_tokens(first_tile_position, group, rows, b * block_tokens, block_tokens, store_end, visible.data());
    store.codec(layer, g).attend(block_shape, {&block, 1}, tile, partials, 0);
  }
  attend_run();
  // The open part, a block at a time (window=W makes it longer than a block; the kernel takes at most
  // kMaxBlockTokens).
  const size_t open_element = dtype_size_bytes(store.open_dtype());
  for (int t = 0; t < open_tokens && sealed * block_tokens + t < store_end; t += block_tokens) {
    attend_rows_range(tile, visible.data(), store.open_keys(layer, g) + size_t(t) * k_dim * open_element,
                      store.open_values(layer, g) + size_t(t) * v_dim * open_element, store.open_dtype(), k_dim, v_dim,
                      first_tile_position, group, sealed * block_tokens + t, std::min(block_tokens, open_tokens - t),
                      store_end, window_first, partials);
  }
  for (int t = 0; exact && t < chunk.n && first_position + t <= last_tile_position; t += block_tokens) {
    const int piece = std::min(block_tokens, chunk.n - t);
    attend_rows_range(tile, visible.data(), chunk.k + size_t(t) * k_dim, chunk.v + size_t(t) * v_dim, DType::kF32,
                      k_dim, v_dim, first_tile_position, group, first_position + t, piece, INT_MAX, window_first,
                      partials);
  }
  for (int r = 0; r < rows; ++r) {
    float* dst = call.out + size_t(first + r / group) * offsets.out_row + offsets.out[size_t(g)] + size_t(r % group) * v_dim;
    partials.write_output(r, dst);
    if (store.rotated()) hadamard_rotate(dst, v_dim);  // back from the rotated basis
  }
}

}  // namespace

void attend(const KvStore& store, int layer, const float* q, int n, int first_position,
            const AttentionParams& params, float* out, const std::vector<HeadSelection>* selection) {
  const AttendCall call{&store, q, n, first_position, out, selection};
  attend_many({&call, 1}, layer, params);
}

void attend_many(std::span<const AttendCall> calls, int layer, const AttentionParams& params) {
  std::vector<CallPlan> plans;
  std::vector<int64_t> first_task{0};  // call i's tasks are [first_task[i], first_task[i + 1])
  for (const AttendCall& call : calls) {
    plans.push_back(plan_call(call, layer, params));
    first_task.push_back(first_task.back() + plans.back().tasks);
  }
  params.pool->run(first_task.back(), [&](int64_t task, int) {
    const size_t i = size_t(std::upper_bound(first_task.begin(), first_task.end(), task) - first_task.begin()) - 1;
    attend_task(calls[i], layer, params, plans[i], task - first_task[i]);
  });
}

}  // namespace slimkv
