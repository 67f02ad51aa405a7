// The selection rule PQCache uses (§3.1): initial tokens + the top-k of the middle tokens by a score +
// the local window. `pq` scores with PQ codes, `oracle` with the exact keys; everything else is here.
//
//   tokens:  [0, init) | middle: top-k by score | [middle_end, num_tokens)
//   middle_end = min(num_tokens - local, sealed_tokens): the open block is always attended (it is the
//   newest tokens, unquantized, in the fast tier), so the local window is at least the open block.
//
// With rerank > 1 (pq), the top ⌈rerank·k⌉ middle tokens by score are candidates: their keys are read
// back from the blocks as stored and the k with the highest exact scores are kept. It costs reading
// those keys (rerank·k rows of K per KV head and step) and buys PQ's boundary misses back: they rank
// just below the top k. The kept tokens' keys are not read again: the re-rank scores them for each query
// head of the group too, and attention takes those scores (HeadSelection::scores).
#pragma once

#include <vector>

#include "kv/select/selector.h"

namespace slimkv {

struct TopkWindow {
  int init_tokens = 4;
  int local_tokens = 64;
  double topk = 0.2;  // <= 1: a fraction of the layer's tokens; > 1: a count of tokens

  int topk_tokens(int num_tokens) const;
  std::string describe() const;  // "topk=0.2,init=4,local=64"
};

TopkWindow read_topk_window(StageOptions& options);

class TopkSelector : public Selector {
 public:
  // rerank >= 1: candidates ranked by score per token kept. Above 1, the top ⌈rerank·k⌉ middle tokens by
  // score are scored again exactly, from their keys as stored (SealedKeys), and the top k of those kept.
  TopkSelector(const TopkWindow& window, double rerank, int num_kv_heads, int k_dim);

  void select(int layer, const float* q, int num_heads, int num_tokens, int sealed_tokens,
              const SealedKeys& sealed_keys, ThreadPool& pool, std::vector<HeadSelection>& selection) final;

 protected:
  // Before scoring tokens [0, scored_tokens) of `layer` (PQ: brings its index up to date).
  // Returns false if this layer cannot score yet (then every token is attended).
  virtual bool prepare(int layer, int scored_tokens, ThreadPool& pool) = 0;
  // scores[t - first] = score of token t of (layer, head) for the query q [k_dim], t in [first, last).
  // Called concurrently for different heads.
  virtual void score(int layer, int head, const float* q, int first, int last, float* scores) const = 0;

  int num_kv_heads() const { return num_kv_heads_; }
  int k_dim() const { return k_dim_; }

 private:
  TopkWindow window_;
  double rerank_;
  int num_kv_heads_;
  int k_dim_;
};

}  // namespace slimkv
