// The `pq` selector (PQCache §3): per layer and KV head, product quantizers over the keys of sealed
// tokens, one per segment of `segment` tokens (positions [s·segment, (s+1)·segment)), trained by k-means
// when a prefill chunk is appended (on a background thread, overlapped with the rest of the forward
// pass; the layer's next prompt chunk or first decode step waits for it: Algorithm 1), and again while
// a segment fills (tokens decoded one by one would otherwise all be coded with centroids of the first
// few blocks; §5 suggests periodic rebuilding). Per-segment codebooks follow the keys' drift with
// position (RoPE, pq_selector.cc). Tokens sealed later get the codes of their nearest centroids. A
// segment's keys are kept only until it is clustered full: then the index (centroids and codes) is all
// pq keeps. Decode scores the middle tokens by ADC, one q·centroid table per segment, re-ranks the top
// rerank·k exactly with their keys read back from the blocks, and keeps the top-k (topk_selector.h).
#pragma once

#include <memory>
#include <string>

#include "kv/select/selector.h"
#include "kv/select/topk_selector.h"

namespace slimkv {

struct PqOptions {
  TopkWindow window;
  int m = 2;           // sub-spaces
  int bits = 6;        // b: 2^b centroids per sub-space
  // Candidates per selected token re-scored exactly from their keys as stored (topk_selector.h): PQ's
  // misses sit just below the top-k boundary, so a few more candidates recover most of them.
  double rerank = 1.25;
  int max_iters = 0;   // k-means iteration cap; 0: auto (kmeans_iteration_cap)
  int segment_tokens = 256;  // tokens per codebook (>= 2^b)
  int cache_tokens = 4096;  // the offload tier's block cache, in tokens
  std::string policy = "lru";
  bool overlap = true;      // off: cluster at the first decode step instead (for measuring the overlap)
  // @offload on CUDA: full blocks also copied token-major into host memory, where the selection reads
  // them (kv/cuda/pq_select.h). "on", "off" (it reads the pages or sealed blocks) or "auto": on over a
  // codec's sealed blocks, off over FP16 pages, where the copies measured no faster on an H100 and
  // double the host memory (docs/pq.md). The CPU store has no such copies.
  std::string rows = "auto";
  std::string describe() const;
};

// Eq. 3: the largest k-means iteration count whose clustering of s tokens (one layer: every KV head and
// sub-space) takes no longer than the forward pass of one layer over them, from Eq. 1 and 2 with
// coefficients fitted on this machine (bench/bench_pq); clipped to [2, 32].
int kmeans_iteration_cap(int tokens, int num_kv_heads, int m, int bits, int sub_dim);

// The k-means seed of `segment` of (layer, KV head): every implementation of pq clusters alike.
uint64_t pq_segment_seed(uint64_t seed, int layer, int head, int segment);

std::shared_ptr<const SelectorFactory> make_pq_selector_factory(const PqOptions& options);
std::shared_ptr<const SelectorFactory> make_oracle_selector_factory(const TopkWindow& window);

}  // namespace slimkv
