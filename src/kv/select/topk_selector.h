// The selection rule PQCache uses (§3.1): initial tokens + the top-k of the middle tokens by a score +
// the local window. `pq` scores with PQ codes, `oracle` with the exact keys; everything else is here.
//
//   tokens:  [0, init) | middle: top-k by score | [middle_end, num_tokens)
//   middle_end = min(num_tokens - local, sealed_tokens): the open block is always attended (it is the
//   newest tokens, unquantized, in the fast tier), so the local window is at least the open block.
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
  TopkSelector(const TopkWindow& window, int num_layers, int num_kv_heads, int k_dim, int block_tokens);

  // Keeps the keys (the slow tier's FP32 copy that scoring and clustering read).
  void on_seal(int layer, int head, const float* k) override;
  void clear() override;
  size_t memory_bytes() const override;  // the FP32 copy of the sealed keys
  void select(int layer, const float* q, int num_heads, int num_tokens, int sealed_tokens, ThreadPool& pool,
              std::vector<HeadSelection>& selection) final;

 protected:
  // Before scoring tokens [0, scored_tokens) of `layer` (PQ: brings its index up to date).
  // Returns false if this layer cannot score yet (then every token is attended).
  virtual bool prepare(int layer, int scored_tokens, ThreadPool& pool) = 0;
  // scores[t - first] = score of token t of (layer, head) for the query q [k_dim], t in [first, last).
  // Called concurrently for different heads.
  virtual void score(int layer, int head, const float* q, int first, int last, float* scores) const = 0;

  int num_kv_heads() const { return num_kv_heads_; }
  int k_dim() const { return k_dim_; }
  // The keys of the sealed tokens of (layer, head): [sealed_tokens(layer), k_dim].
  const std::vector<float>& keys(int layer, int head) const {
    return keys_[size_t(layer) * size_t(num_kv_heads_) + size_t(head)];
  }
  int sealed_tokens(int layer) const { return int(keys(layer, 0).size()) / k_dim_; }

 private:
  TopkWindow window_;
  int num_kv_heads_;
  int k_dim_;
  int block_tokens_;
  std::vector<std::vector<float>> keys_;  // [layer · num_kv_heads + head]
};

}  // namespace slimkv
