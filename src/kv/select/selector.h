// A selector decides which tokens a decode query attends to (ARCHITECTURE.md: `sel = kv.select(layer, q)`,
// then attention over the selection). Selectors: `all` (the default: every token), `pq` (PQCache:
// initial tokens + PQ-approximate top-k + local window) and `oracle` (the same window with the exact
// top-k by true scores: the upper bound `pq` is measured against).
//
// Selection is per (layer, KV head), at token granularity. Query heads of a GQA group share their KV
// head's selection: a token's score is the sum of its scores over the group's query heads, which is the
// score of the summed query (q₁ + q₂)·k, so a group costs one scoring pass (and for PQ one table).
// Prefill (several queries in one call) attends to every token: PQCache selects only while decoding.
//
// A selector object belongs to one sequence (it lives in the KvStore): the store hands it the FP32 keys
// of every block it seals, in the basis the store keeps them (Hadamard-rotated when the codec rotates;
// the store rotates queries alike, and rotation keeps q·k), and, at select time, reads it the keys of
// chosen sealed tokens back from the blocks as stored, to score them (SealedKeys: pq's exact re-rank of its
// candidates).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "slimkv/status.h"

namespace slimkv {

class ThreadPool;
class StageOptions;
struct OffloadConfig;
struct PqOptions;

// The tokens one KV head attends to at the last decode step: every token, or these, ascending.
struct HeadSelection {
  bool all = true;
  std::vector<int> tokens;
  // The candidates the selector ranked: the selected tokens in [ranked_first, ranked_last) are its
  // top-k, those outside are forced (initial tokens, local window). What recall is measured on.
  int ranked_first = 0, ranked_last = 0;
  // After an exact re-rank (pq): q_h·k of each selected token in [ranked_first, ranked_last), in order,
  // for each query head h of the group (unscaled, in the store's basis), [those tokens, group]; empty
  // otherwise. Attention weighs these tokens' values by them instead of reading their keys again: the
  // re-rank has just read them (PQCache's top-k are scored twice otherwise).
  std::vector<float> scores = {};
};

// Exact scores of sealed tokens by their keys as the store holds them (decoded from their blocks, in the
// store's basis).
class SealedKeys {
 public:
  virtual ~SealedKeys() = default;
  // scores[i, r] = q_r·k of tokens[i] (ascending, all sealed) of (layer, head) for `rows` queries
  // q [rows, k_dim]; scores [n, rows]. The keys are read a block at a time into scratch that stays in
  // cache: scores are all a re-rank needs of them.
  virtual void score(int layer, int head, const float* q, int rows, const int* tokens, int n, float* scores) const = 0;
};

class Selector {
 public:
  virtual ~Selector() = default;

  // Keys of a block the store just sealed: k [block_tokens, k_dim] of (layer, head), the block after
  // those it sealed before.
  virtual void on_seal(int layer, int head, const float* k) = 0;
  // Whether on_seal reads the keys. A store restoring a transfer's blocks decodes each to hand them over
  // only for a selector that does (the `all` selector does not: decoding a 2-bit 8B KV of 16K tokens
  // took ~5x the rest of its import).
  virtual bool reads_sealed_keys() const { return true; }
  // The store appended a prefill chunk (n > 1 tokens) to `layer`: PQ starts clustering its keys here,
  // on a background thread, overlapped with the rest of the forward pass (PQCache Algorithm 1).
  virtual void on_prefill(int /*layer*/) {}
  // Selects for one decode query per head of `layer`. q: [num_heads, k_dim], in the store's basis;
  // num_tokens: tokens the layer holds (this query's included); sealed_tokens: those in sealed blocks
  // (the rest, the open block, is always attended); sealed_keys scores them by their keys (called
  // concurrently for different heads). Fills selection [num_kv_heads].
  virtual void select(int layer, const float* q, int num_heads, int num_tokens, int sealed_tokens,
                      const SealedKeys& sealed_keys, ThreadPool& pool, std::vector<HeadSelection>& selection) = 0;
  virtual void clear() = 0;  // back to an empty sequence
  // Bytes the selector keeps beside the store's blocks (in RAM on the CPU): the keys it keeps (oracle:
  // all; pq: those of segments not clustered in full yet), and its index once it covers the sealed
  // tokens (pq: centroids and codes).
  virtual size_t memory_bytes() const { return 0; }
};

// What a selector spec stage names; makes one Selector per sequence.
class SelectorFactory {
 public:
  virtual ~SelectorFactory() = default;
  virtual std::string describe() const = 0;  // canonical spec stage, every option spelled out
  // Whether keys of k_dim dims can be selected on (pq: m must divide them); checked when a model loads.
  virtual Status check_shape(int /*k_dim*/) const { return Status::ok(); }
  virtual std::unique_ptr<Selector> make(int num_layers, int num_kv_heads, int k_dim, int block_tokens,
                                         uint64_t seed) const = 0;
  // pq's options (the GPU runs its own implementation of them: kv/cuda/gpu_pq_kv.cc); null otherwise.
  virtual const PqOptions* pq_options() const { return nullptr; }
};

std::shared_ptr<const SelectorFactory> make_all_selector_factory();
// Whether `name` is a selector stage (all, pq, oracle).
bool is_selector_stage(const std::string& name);
// Builds the factory of a selector stage from its options (read from `options`; the caller finishes them).
// pq's cache and policy options set the offload tier's block cache (`cache`).
std::shared_ptr<const SelectorFactory> make_selector_factory(const std::string& name, StageOptions& options,
                                                             OffloadConfig& cache);

}  // namespace slimkv
