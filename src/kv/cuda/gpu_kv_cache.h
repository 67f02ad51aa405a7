// The GPU's KV store as the model sees it (ARCHITECTURE.md: `kv.append`, `attention` as single calls):
// one interface over the caches of kv/cuda/, so that model/cuda/llama_cuda.cc holds the model and no
// KV policy, and a GPU technique is one new implementation of this class plus a line in
// make_gpu_kv_cache. Implementations:
//
//   FP16 pages (`dense`)                     gpu_dense_kv.cc        over paged_kv_cache.h
//   sealed quantized blocks (`hack`, `quant`) gpu_quantized_kv.cc    over quantized_kv_cache.h
//   a host tier (`@offload`, `@kvpr`)         gpu_host_tier_kv.cc    over host_kv_tier.h
//   ZACK's per-head ranks (`zack`, `@offload`) gpu_zack_kv.cc         over zack_kv_cache.h
//   zack then hack / quant (`zack+hack`)      gpu_zack_quantized_kv.cc over quantized_kv_cache.h (HeadDims)
//   PQCache's selection (`pq`, `pq@offload`)   gpu_pq_kv.cc           over paged_kv_cache.h, pq_select.h
//     (`pq...+hack`, its `@offload`)                                  over quantized_kv_cache.h, pq_select.h
//   FP16 pages with sliding-window layers     gpu_sliding_dense_kv.cc over paged_kv_cache.h (two pools)
//
// A step of several sequences (prefill chunks and decode tokens mixed):
//   check_step(batch)            an error naming what cannot hold the step; changes nothing
//   begin_step(batch)            grows the sequences, plans the step's attention
//   per layer: keep_layer_input(layer, x)                  kvpr keeps X, the others nothing
//              attend(layer, q, k, v, scale, out)          appends the layer's new K/V, then attention
// Sequences are small ids (rows of the block tables), given out by add_sequence.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "attention/cuda/paged_attention.h"
#include "attention/cuda/zack_attention.h"
#include "tensor/quantized_block.h"
#include "kv/cuda/sequence_blocks.h"
#include "kv/tier/kvpr_cost_model.h"
#include "kv/select/pq_selector.h"
#include "kv/transfer.h"
#include "slimkv/status.h"
#include "tensor/dtype.h"

namespace slimkv {
class KvStore;
}

namespace slimkv::cuda {

class CudaQuantizedKvCache;

// The model's shape, as the KV caches need it.
struct GpuKvShape {
  int num_layers = 0;
  int num_heads = 0;     // query heads (attention plans)
  int num_kv_heads = 0;
  int head_dim = 0;
  int hidden = 0;        // a row of attention inputs X (kvpr)
  DType x_dtype = DType::kF16;  // the model's activations and weights (X, the recomputation GEMM)
  int max_sequences = 0;
  int max_step_tokens = 0;
  int context_tokens = 0;  // per sequence
  // [num_layers]: the tokens a query of a sliding-window layer sees (Gemma 3), 0 for a global layer;
  // empty: every layer attends over the whole context. Only the dense cache runs windows so far.
  std::vector<int> layer_windows = {};
  int window_of(int layer) const { return layer_windows.empty() ? 0 : layer_windows[size_t(layer)]; }
  bool has_windows() const;
  int kv_dim() const { return num_kv_heads * head_dim; }
  int blocks_per_sequence() const { return (context_tokens + kCudaBlockTokens - 1) / kCudaBlockTokens; }
};

// KV blocks sealed by the `hack` codec, or the `quant` baseline, in the CPU codec's byte layout, with
// FP16 only for what is not sealed yet (quantized_kv_cache.h). Attention reads the sealed blocks before
// the step (hack: on integers, decode on CUDA cores, prefill on INT8 tensor cores; quant: dequantized in
// the kernel) and the step's own tokens and open blocks in FP16 (prefill=exact).
struct QuantizedKvOptions {
  QuantizationConfig config;
  bool hack = true;  // false: quant
  uint64_t seed = 0;
};

// The slow tiers (issue 11, host_kv_tier.h): every token's K/V in pinned host memory, streamed to the
// GPU layer by layer (`offload`); with `recompute` (KVPR) part of it recomputed from the attention
// inputs X kept beside it, while the rest streams in.
struct KvTierOptions {
  bool recompute = false;  // kvpr; false: offload
  // The fraction of the tokens each sequence holds whose K/V is recomputed (rounded to blocks of 64;
  // 1: all); negative: chosen each step by the cost model (Eq. 10, kv/tier/kvpr_cost_model.h).
  double split = -1;
  // 1: the row-by-row schedule (the whole batch through a layer, the next layer's KV loading meanwhile);
  // 0: column-by-column, in as few micro-batches as the GPU KV budget holds (at least 2); n: n of them.
  int micro_batches = 1;
  size_t host_bytes = 0;  // the pinned host pool; 0: room for max_sequences full contexts
  // The machine's host→device bytes/s and GEMM FLOP/s (kv/cuda/kvpr_profiler.h).
  double link_bytes_per_s = 0;
  double gemm_flops_per_s = 0;
};

// ZACK (zack_kv_cache.h): each (layer, KV head) stored at its own ranks, q and k projected onto its Q–K
// basis after RoPE; the model's W_V / W_O are folded (V arrives reduced, the output is read reduced).
struct ZackKvOptions {
  std::vector<int> k_ranks, v_ranks;  // [num_layers · num_kv_heads]
  std::vector<float> qk_bases;        // each (layer, KV head)'s B_g[:k_rank] [k_rank, head_dim], in order
  ZackSchedules schedules;  // decode balanced, prefill uniform (attention/cuda/zack_attention.h)
  // rot=hadamard (a quantizing codec after zack): q', k', v' turned by each head's H at its ranks
  // (kv/rotation.h), the output turned back, as the CPU store does; the model itself rotates nothing.
  bool rotate = false;
};

// PQCache (gpu_pq_kv.cc): the pq selector's options; the FP16 pages (with a quantizing codec, its sealed
// blocks) in pinned host memory (`@offload`), only the selected tokens read from there, or resident in
// GPU memory.
struct PqKvOptions {
  PqOptions pq;
  bool offload = false;
  uint64_t seed = 0;  // k-means
};

// What a selecting cache (pq) reports of its last step (zeros elsewhere).
struct SelectionReport {
  long selected_tokens = 0, held_tokens = 0;  // over the step's decode rows (per KV head and layer)
  size_t page_bytes_read = 0;  // K/V bytes the selection read from the pages (over PCIe with @offload)
  // pq@offload's GPU cache of selected tokens (over layers, rows and KV heads): tokens looked up, found
  // there (their K/V not read from the pages), and the bytes copied into it (GPU to GPU).
  long cache_used_tokens = 0, cache_hit_tokens = 0;
  size_t cache_filled_bytes = 0;
};

struct GpuKvOptions {
  std::optional<QuantizedKvOptions> quantized;  // none: the `dense` codec (FP16 blocks)
  std::optional<ZackKvOptions> zack;            // reduced dims (FP16 blocks, or sealed by `quantized`; FP16 with a tier)
  std::optional<KvTierOptions> tier;            // none: every block in GPU memory
  std::optional<PqKvOptions> pq;                // PQCache's selection (its own offload; over `quantized` or FP16 pages)
  // GPU memory for KV (quantized: the sealed pool and the FP16 window; a tier: its two staging
  // buffers); 0: room for max_sequences full contexts (a tier: one layer's of them in each buffer), or
  // what fits in 90% of the free memory, whichever is less.
  size_t kv_cache_bytes = 0;
};

// KVPR's cost model for a model of this shape, per token of the batch: X crosses the link in the
// activations' dtype, the K/V it replaces takes kv_bytes_per_token (FP16, or the codec's sealed bytes),
// recomputing it is 2 · hidden · 2·kv_dim FLOPs; pipelined (a unit's X and K/V stream while the unit
// before it computes).
KvprCostModel kvpr_cost_model(int hidden, int kv_dim, DType x_dtype, double kv_bytes_per_token,
                              double link_bytes_per_s, double gemm_flops_per_s);

// The model's part of KVPR: the K/V of rows of attention inputs X, as the layer's projection and RoPE
// make them (the tier holds X; the model holds the weights).
class KvProjection {
 public:
  virtual ~KvProjection() = default;
  virtual int max_rows() const = 0;
  // k, v: FP16 [n, num_kv_heads, head_dim] (device, valid until the next call) of layer's X rows x
  // [n, hidden] (device, x_dtype) at positions [n] (device); n <= max_rows().
  virtual Status project_kv(int layer, const void* x, int n, const int32_t* positions, const uint16_t** k,
                            const uint16_t** v) = 0;
};

// What a host tier with recomputation reports of its last step (zeros elsewhere).
struct KvprReport {
  double last_recompute_fraction = 0;  // of the held tokens
  KvprCostModel cost;                  // the model that chose it
  size_t x_staging_bytes = 0;          // GPU memory of X's staging
};

class GpuKvCache {
 public:
  virtual ~GpuKvCache() = default;

  // --- Sequences and memory ---
  // The sequences (ids, tokens) and the blocks of the budget: 64 tokens of every layer and KV head each.
  virtual const SequenceBlocks& sequences() const = 0;
  virtual Expected<int> add_sequence() = 0;  // an error when max_sequences are held
  virtual void remove_sequence(int sequence) = 0;
  virtual size_t device_bytes() const = 0;  // GPU memory of the KV
  virtual size_t host_bytes() const { return 0; }
  virtual size_t bytes_per_block() const = 0;  // memory of one budget block (where the budget lives)
  virtual KvprReport kvpr() const { return {}; }
  // Blocks the sequence holds in the sliding-window layers' pool (0 without one): between steps those
  // of its window, however long the sequence.
  virtual int window_blocks(int /*sequence*/) const { return 0; }
  virtual SelectionReport selection() const { return {}; }

  // --- Steps ---
  // batch: sequence_ids, kv_lens (held + new), query_counts (new), as attention plans them.
  virtual Status check_step(const PagedAttentionBatch& batch) const = 0;
  virtual Status begin_step(const PagedAttentionBatch& batch) = 0;
  // The layer's attention inputs x [step tokens, hidden] (kvpr keeps them; the others need nothing).
  virtual Status keep_layer_input(int /*layer*/, const void* /*x*/) { return Status::ok(); }
  // Appends the layer's new k, v (FP16 [step tokens, num_kv_heads, head_dim], begin_step's order),
  // then attention of the step's queries q (FP16 [step tokens, num_heads, head_dim]) into out (likewise).
  virtual Status attend(int layer, const uint16_t* q, const uint16_t* k, const uint16_t* v, float scale,
                        uint16_t* out) = 0;

  // --- Contexts written without attention (benchmarks' random K/V: append_random_kv) ---
  virtual bool keeps_layer_input() const { return false; }
  // Starts appending `tokens` (at most max_step_tokens) to the sequence; fill() then writes each layer's
  // k, v [tokens, num_kv_heads, head_dim] (and x [tokens, hidden] when keeps_layer_input()).
  virtual Status begin_fill(int sequence, int tokens) = 0;
  virtual Status fill(int layer, const uint16_t* k, const uint16_t* v, const void* x) = 0;

  // --- A sequence's blocks out and in as device pages (the transfer format and CUDA IPC: gpu_kv_transfer.h) ---
  // Device layout of a sequence's first `blocks` full blocks: [num_layers, blocks, page] where a page
  // is one block of every KV head as this cache stores it (dense: the FP16 K of every head, then V;
  // hack/quant: every head's codec bytes), and where each head's block lies in a page. page_bytes 0:
  // this cache keeps no such pages (its sequences go through export_sequence / import_sequence).
  KvPageLayout device_page_layout() const;
  size_t device_page_bytes() const { return device_page_layout().page_bytes; }
  // The device pools a page's parts lie in, in page order (dense: the K pool, then V's; hack/quant: the
  // sealed pool): part p of (layer, block id) starts at base + layer · layer_bytes + id · block_bytes and
  // holds every KV head's piece, head h's head_bytes at h · head_bytes. No pools: no device pages.
  struct PagePool {
    const uint8_t* base = nullptr;
    size_t layer_bytes = 0, block_bytes = 0, head_bytes = 0;
  };
  struct DevicePages {
    int num_layers = 0;
    std::vector<PagePool> pools;
  };
  virtual DevicePages device_pages() const { return {}; }
  // Copies the sequence's first `blocks` full blocks, device to device, into `out` (device layout above).
  Status export_pages(int sequence, int blocks, uint8_t* out) const;
  // Makes the empty `sequence` hold `blocks` full blocks copied device to device from `pages` (device
  // layout above; the same cache kind and shape wrote them), then `open` (a store of the sequence's
  // tokens after those blocks, fewer than a block per layer) appended. An error when the budget lacks room.
  virtual Status import_pages(int sequence, int blocks, const uint8_t* pages, const KvStore& open);
  // The sequence's tokens after its last full block into the cleared `into` (each layer's as open tokens).
  Status export_open_tokens(int sequence, KvStore& into) const;
  // export_open_tokens' part for one layer, by the caches with device pages.
  virtual Status restore_open_layer(int sequence, int layer, KvStore& into) const;

  // --- The same through a host KvStore, for the caches without device pages (a host tier, pq) ---
  // Restores into the cleared `into` (made with the pipeline this cache runs, kv_description) the
  // sequence's sealed blocks, as the codec encodes them, and its open tokens.
  virtual Status export_sequence(int sequence, KvStore& into) const;
  // Makes the empty `sequence` hold what `from` holds (the same pipeline, checked by the transfer's
  // reader): sealed blocks copied as they are, open tokens in FP16. An error when the budget lacks room.
  virtual Status import_sequence(int sequence, const KvStore& from);
};

// The cache for `options`. projection: the model's, for a tier that recomputes (kvpr); it must outlive
// the cache.
Expected<std::unique_ptr<GpuKvCache>> make_gpu_kv_cache(const GpuKvShape& shape, const GpuKvOptions& options,
                                                        KvProjection* projection);

// Whether `held` has the blocks the step's sequences grow into; else an error naming `cache` ("GPU",
// "host") and the counts. Shared by the caches that grow by SequenceBlocks alone.
Status check_blocks_for_step(const SequenceBlocks& held, const PagedAttentionBatch& batch, const char* cache);

// The device layout's offsets (GpuKvCache::export_pages) of part `part_offset` of every (layer, block)
// [num_layers · blocks], layer by layer; and where the same pieces lie in a pool of `layer_bytes` per
// layer whose block `id` starts at id · block_bytes (block_ids: the sequence's, in order).
std::vector<uint64_t> page_offsets(int num_layers, int blocks, size_t page_bytes, size_t part_offset);
std::vector<uint64_t> pool_offsets(int num_layers, const std::vector<int>& block_ids, int blocks, size_t layer_bytes,
                                   size_t block_bytes);

// A quantized cache's part of GpuKvCache, shared by the caches over one (gpu_quantized_kv.cc, and
// gpu_pq_kv.cc over sealed blocks): its device pages (every KV head's sealed block as the pool holds it);
// the empty `sequence` made to hold `blocks` sealed blocks copied from device `pages` (an error when the
// budget lacks room for them and `open_tokens` more); a layer's open tokens into `into`.
GpuKvCache::DevicePages sealed_device_pages(const CudaQuantizedKvCache& cache);
Status import_sealed_pages(CudaQuantizedKvCache& cache, int sequence, int blocks, const uint8_t* pages, int open_tokens);
Status restore_sealed_open_layer(const CudaQuantizedKvCache& cache, int sequence, int layer, KvStore& into);

// The implementations (one file each).
Expected<std::unique_ptr<GpuKvCache>> make_gpu_dense_kv(const GpuKvShape& shape, int num_blocks);
Expected<std::unique_ptr<GpuKvCache>> make_gpu_quantized_kv(const GpuKvShape& shape, const QuantizedKvOptions& options,
                                                            int num_blocks);
Expected<std::unique_ptr<GpuKvCache>> make_gpu_zack_kv(const GpuKvShape& shape, const ZackKvOptions& options,
                                                       int num_blocks);
// zack...@offload: the pool in pinned host memory (tier.host_bytes, 0: every sequence's full context),
// kv_cache_bytes of GPU staging (0: as much, within 80% of the free memory); kvpr is refused.
Expected<std::unique_ptr<GpuKvCache>> make_gpu_zack_host_kv(const GpuKvShape& shape, const ZackKvOptions& options,
                                                            const KvTierOptions& tier, size_t kv_cache_bytes);
Expected<std::unique_ptr<GpuKvCache>> make_gpu_zack_quantized_kv(const GpuKvShape& shape, const QuantizedKvOptions& quantized,
                                                                 const ZackKvOptions& zack, int num_blocks);
// sealed: the codec's blocks (`pq:...+hack`); none: FP16 pages.
Expected<std::unique_ptr<GpuKvCache>> make_gpu_pq_kv(const GpuKvShape& shape, const PqKvOptions& options,
                                                     const std::optional<QuantizedKvOptions>& sealed, size_t kv_cache_bytes);
// Sliding-window layers (shape.layer_windows): num_blocks of the global layers' pool (the budget), the
// sliding layers' pool sized by the window (sliding_window_pool_bytes); global_layers_block_bytes: a
// block of the global layers, the budget's unit.
Expected<std::unique_ptr<GpuKvCache>> make_gpu_sliding_dense_kv(const GpuKvShape& shape, int num_blocks);
size_t sliding_window_pool_bytes(const GpuKvShape& shape);
size_t global_layers_block_bytes(const GpuKvShape& shape);
Expected<std::unique_ptr<GpuKvCache>> make_gpu_host_tier_kv(const GpuKvShape& shape, const GpuKvOptions& options,
                                                            KvProjection* projection);

}  // namespace slimkv::cuda
