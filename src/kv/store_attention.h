// Attention of a layer's new queries over the KV store: for each KV head and tile of queries, every
// block's partial comes from its codec's kernel (the open block's from the FP32 kernel, widened from FP16), merged with
// the online-softmax rule. Causal: the query at position p sees tokens at positions <= p.
// The store's read path: it walks KvStore's blocks, so it lives with the store in kv/, above the
// kernels and the partial state of attention/ that it calls.
#pragma once

#include <span>

#include "kv/store.h"
#include "util/thread_pool.h"

namespace slimkv {

struct AttentionParams {
  int num_heads = 0;       // query heads; num_heads / store's num_kv_heads share a KV head (GQA)
  float scale = 1.0f;      // softmax scale, 1/sqrt(head_dim)
  ThreadPool* pool = nullptr;  // tasks are (KV head, query tile) pairs
  // Longest task first (ZACK §5.3): tasks are handed out by decreasing work, (k_dim + v_dim + 1) × rows ×
  // tokens, so heads of unequal rank (and late prefill tiles) do not leave threads idle at the end.
  // false: in (tile, head) order, the unbalanced schedule bench/bench_zack.cc compares with.
  bool longest_task_first = true;
  // Sliding-window layers (KvShape::window_tokens): a query at position p sees p - window_tokens + 1 .. p.
  // Tiles are then one position each (each query's window starts elsewhere), and of the block where a
  // window starts only the tokens inside it are decoded and read. 0: the whole causal context.
  int window_tokens = 0;
};

// q: [n, num_heads, k_dim] for positions first_position .. first_position + n - 1, whose K/V the store
// already holds (store.num_tokens(layer) == first_position + n). out: [n, num_heads, v_dim].
// prefill=exact: when these n tokens were the store's last append (store.exact_chunk), the queries
// read them as appended, and only the tokens before first_position from the store's blocks.
// selection (from store.select, one per KV head; null: every token): for a decode query (n == 1), the
// tokens each KV head's group attends to. A sealed block whose tokens are all selected is read by its
// codec's kernel as always (so a selection of everything is exactly dense attention); from any other
// block only the selected tokens are decoded (Codec::decode_tokens) and gathered into FP32 chunks for
// the FP32 kernel: PQCache fetches tokens, not blocks, and a masked variant of every codec kernel
// would cost more code than it saves at top-k fractions of 1/5 or less. Tokens whose exact scores the
// selection carries (HeadSelection::scores: pq's re-rank) are weighed by them, and only their values
// are decoded. The open block is always whole.
// When the store's heads differ in dims (ZACK), a row of q holds each head's k_dim_of(layer, its KV
// head) dims back to back, and a row of out each head's v_dim_of.
void attend(const KvStore& store, int layer, const float* q, int n, int first_position,
            const AttentionParams& params, float* out, const std::vector<HeadSelection>* selection = nullptr);

// One sequence's part of attend_many: attend()'s arguments for its own store.
struct AttendCall {
  const KvStore* store = nullptr;
  const float* q = nullptr;
  int n = 0;
  int first_position = 0;
  float* out = nullptr;
  const std::vector<HeadSelection>* selection = nullptr;
};

// attend() for several sequences (distinct stores) of one layer, all their (KV head, query tile) tasks in
// one pool loop: a batched decode step hands work to the threads once per layer, not once per sequence.
void attend_many(std::span<const AttendCall> calls, int layer, const AttentionParams& params);

}  // namespace slimkv
