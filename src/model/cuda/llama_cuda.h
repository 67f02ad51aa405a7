// A Llama-family model on the GPU (issue 9): the forward pass of model/llama.cc with the weights in
// FP16/BF16 on the device, the GEMMs in cuBLAS, the KV cache in the GPU's paged block pool with the
// `dense` codec (FP16 blocks), and several sequences of different lengths through the layers in one
// step (batched decode, prefill chunks, or both mixed: the basis of continuous batching).
//
//   x = embed(tokens)
//   for each layer:
//       h = rmsnorm(x);  qkv = h · W_qkvᵀ (one GEMM)
//       q, k, v = rope(qkv + bias) in FP16;  cache.append(layer, k, v)
//       o = paged_attention(q, cache)            x += o · W_oᵀ (the add rides on the GEMM)
//       h = rmsnorm(x);  gu = h · W_gate_upᵀ;   x += swiglu(gu) · W_downᵀ
//   logits = lm_head(rmsnorm(x)) for the rows asked for
//
// Kernels and their references: backend/cuda/layer_kernels.h, attention/cuda/paged_attention.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "attention/cuda/paged_attention.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/host_kv_tier.h"
#include "backend/cuda/paged_kv_cache.h"
#include "backend/cuda/quantized_kv_cache.h"
#include "backend/cuda/sampling.h"
#include "kv/tier/kvpr_cost_model.h"
#include "model/llama_weights.h"
#include "model/model_config.h"

namespace slimkv::cuda {

// KV blocks sealed by the `hack` codec, or the `quant` baseline, in the CPU codec's byte layout, with
// FP16 only for what is not sealed yet (backend/cuda/quantized_kv_cache.h). Attention reads the sealed
// blocks before the step (hack: on integers, decode on CUDA cores, prefill on INT8 tensor cores; quant:
// dequantized in the kernel) and the step's own tokens and open blocks in FP16 (prefill=exact).
struct QuantizedKvOptions {
  QuantizationConfig config;
  bool hack = true;  // false: quant
  uint64_t seed = 0;
};

// The slow tiers (issue 11, backend/cuda/host_kv_tier.h): every token's K/V in pinned host memory,
// streamed to the GPU layer by layer (`offload`); with `recompute` (KVPR) part of it recomputed from
// the attention inputs X kept beside it, while the rest streams in.
struct KvTierOptions {
  bool recompute = false;  // kvpr; false: offload
  // The fraction of the tokens each sequence holds whose K/V is recomputed (rounded to blocks of 64;
  // 1: all); negative: chosen each step by the cost model (Eq. 10, kv/tier/kvpr_cost_model.h).
  double split = -1;
  // 1: the row-by-row schedule (the whole batch through a layer, the next layer's KV loading meanwhile);
  // 0: column-by-column, in as few micro-batches as the GPU KV budget holds (at least 2); n: n of them.
  int micro_batches = 1;
  size_t host_bytes = 0;  // the pinned host pool; 0: room for max_sequences full contexts
  // The machine's host→device bytes/s and GEMM FLOP/s (backend/cuda/kvpr_profiler.h); the per-token
  // figures are the model's, filled in at upload.
  double link_bytes_per_s = 0;
  double gemm_flops_per_s = 0;
};

// The cost model of a model's split (kv/tier/kvpr_cost_model.h), per token of the batch: X crosses the
// link in the weights' dtype (it is never resident here), the K/V it replaces takes kv_bytes_per_token
// (FP16, or the codec's sealed bytes), recomputing it is 2 · hidden · 2·kv_dim FLOPs. Pipelined in both
// schedules: a unit's X and K/V stream while the unit before it computes, so X shares the link with
// the K/V instead of delaying recomputation.
KvprCostModel kvpr_cost_model(const ModelConfig& config, DType dtype, double kv_bytes_per_token, double link_bytes_per_s,
                              double gemm_flops_per_s);

struct CudaModelOptions {
  int max_sequences = 16;      // sequences held at once
  int max_step_tokens = 512;   // tokens through the model in one step, all sequences together
  int max_context_tokens = 0;  // per sequence; 0: the model's max_position_embeddings
  // GPU memory for the KV block pool (quantized: the sealed pool and the FP16 window; with a tier: its
  // two staging buffers); 0: room for max_sequences full contexts (a tier: one layer's of them in each
  // buffer), or what fits in 90% of the memory left after the weights and activations, whichever is less.
  size_t kv_cache_bytes = 0;
  std::optional<QuantizedKvOptions> quantized_kv;  // none: the `dense` codec (FP16 blocks)
  // rot=hadamard (kv/rotation.h): q, k, v turned by H per head before attention and the cache, the
  // attention output turned back; scores are unchanged, the quantized blocks hold rotated values.
  bool rotate_heads = false;
  std::optional<KvTierOptions> tier;  // none: every block in GPU memory
};

// One sequence's part of a step: its new tokens, run at the end of what it holds.
struct SequenceTokens {
  int sequence = 0;
  std::span<const int32_t> tokens;
};

class CudaLlamaModel {
 public:
  // The weights of a loaded model, uploaded in FP16 when every value fits FP16's range (F32 weights
  // rounded; BF16 ones exact in FP16's normal range), else in BF16. FP16 keeps 3 more mantissa bits
  // of the activations that feed the GEMMs, which are rounded to the weights' dtype.
  static Expected<std::unique_ptr<CudaLlamaModel>> upload(const ModelConfig& config, const LlamaWeights& weights,
                                                          const CudaModelOptions& options);
  // Random FP16 weights of config's shape generated on the GPU (benchmarks at shapes not at hand, such
  // as Llama-3-8B's, without downloading them). Each matrix is uniform with unit-variance products.
  static Expected<std::unique_ptr<CudaLlamaModel>> random(const ModelConfig& config, uint64_t seed,
                                                          const CudaModelOptions& options);
  ~CudaLlamaModel();

  const ModelConfig& config() const { return config_; }
  DType weight_dtype() const { return dtype_; }
  int context_tokens() const { return context_tokens_; }
  size_t weight_bytes() const { return weights_.bytes(); }
  // GPU memory of the KV: the block pools (FP16, and sealed quantized blocks), or a tier's staging buffers.
  size_t kv_cache_bytes() const;
  // GPU memory KVPR adds beside the KV: X's staging and the recomputation's scratch (0 without kvpr).
  size_t recompute_bytes() const;
  size_t host_kv_bytes() const { return tier_ ? tier_->host_bytes() : 0; }
  int kv_cache_blocks() const { return held().num_blocks(); }
  int free_kv_blocks() const { return held().free_blocks(); }
  // The fraction of held tokens the last step recomputed (kvpr), and the cost model that chose it.
  double last_recompute_fraction() const { return last_recompute_fraction_; }
  const KvprCostModel& kvpr_cost_model() const { return kvpr_cost_; }

  // A new, empty sequence (an id for steps), or an error when max_sequences are held.
  Expected<int> add_sequence();
  void remove_sequence(int sequence);  // frees its KV blocks
  int num_tokens(int sequence) const { return held().num_tokens(sequence); }

  // Runs each sequence's tokens through the model in one pass over the layers. logits: every new
  // token's row [Σ tokens, vocab] when all_logits, else each sequence's last token's [batch, vocab].
  // Everything is checked before any work (ids, sequences, vocabulary, context, step size, free
  // blocks): an error leaves every sequence as it was.
  Status step(std::span<const SequenceTokens> batch, bool all_logits, std::vector<float>& logits);
  // Appends `tokens` tokens of random K/V (uniform, unit variance) to the sequence in every layer,
  // sealed as decode seals them, without running the layers: long contexts for decode benchmarks,
  // where what the keys hold does not change the work, in milliseconds instead of a long prefill.
  Status append_random_kv(int sequence, int tokens, uint64_t seed);
  // The same pass, returning each sequence's next token chosen on the GPU (backend/cuda/sampling.h),
  // so only the ids come back to the host: as sampling[i] says for sequence i, or greedy when
  // sampling is empty.
  Status step_sample(std::span<const SequenceTokens> batch, std::span<const RowSampling> sampling,
                     std::vector<int32_t>& next_tokens);
  Status step_greedy(std::span<const SequenceTokens> batch, std::vector<int32_t>& next_tokens) {
    return step_sample(batch, {}, next_tokens);
  }

 private:
  // A contiguous device allocation cut into the matrices and vectors of the model.
  class WeightArena {
   public:
    Status reserve(size_t bytes);
    // The next `bytes` of the arena, 256-byte aligned.
    void* take(size_t bytes);
    size_t bytes() const { return memory_.bytes(); }

   private:
    DeviceArray<uint8_t> memory_;
    size_t used_ = 0;
  };
  struct LayerOnDevice {
    float* attention_norm = nullptr;  // [hidden]
    void* w_qkv = nullptr;            // [q_dim + 2·kv_dim, hidden]: W_q, W_k, W_v stacked
    float* b_qkv = nullptr;           // [q_dim + 2·kv_dim] or nullptr
    void* w_o = nullptr;              // [hidden, q_dim]
    float* mlp_norm = nullptr;        // [hidden]
    void* w_gate_up = nullptr;        // [2·intermediate, hidden]: W_gate, W_up stacked
    void* w_down = nullptr;           // [hidden, intermediate]
  };

  CudaLlamaModel(const ModelConfig& config, DType dtype, const CudaModelOptions& options);
  // Lays the weights out in the arena (sizes only: the callers fill them).
  Status allocate_weights();
  // Activations, the KV cache and the attention plan, sized by the options.
  Status allocate_runtime(const CudaModelOptions& options);
  // The host tier instead of the GPU's block pool: its pool, staging within kv_cache_bytes, the cost model.
  Status allocate_tier(const CudaModelOptions& options, int blocks_per_sequence);
  // The sequences and their blocks: the GPU pool's (quantized: the sealed blocks'), or the host tier's.
  const SequenceBlocks& held() const {
    return tier_ ? tier_->sequences() : quantized_ ? quantized_->sequences() : cache_->sequences();
  }
  Status check_batch(std::span<const SequenceTokens> batch) const;
  // Starts a step in the KV cache (or tier) and plans its attention.
  Status begin_kv_step(const PagedAttentionBatch& batch);
  // Starts a step in the GPU's KV cache (dense or quantized).
  Status begin_resident_step(const std::vector<int>& sequences, const std::vector<int>& counts);
  // Writes layer's new K/V (k_, v_, in begin_step's order) into the GPU's cache, sealing the blocks they fill.
  Status append_kv(int layer);
  // Layer's attention of the step's queries q_ into attended_, with the new K/V appended first.
  Status attend(int layer);
  // With a tier: unit's recomputed K/V (KVPR), from its X rows, into its staging buffer.
  Status recompute_kv(int unit, const LayerOnDevice& w);
  // The pass shared by step and step_sample: leaves logits [rows, vocab] on the device.
  Expected<int> forward(std::span<const SequenceTokens> batch, bool all_logits);

  ModelConfig config_;
  DType dtype_;  // of the weights and of every GEMM input
  int context_tokens_ = 0;
  int max_step_tokens_ = 0;
  int max_sequences_ = 0;
  bool rotate_heads_ = false;

  WeightArena weights_;
  void* embedding_ = nullptr;  // [vocab, hidden]
  void* lm_head_ = nullptr;    // [vocab, hidden] (the embedding when tied)
  float* final_norm_ = nullptr;
  float* inv_freq_ = nullptr;  // RoPE's inverse frequencies [head_dim / 2] (model/rope.h)
  std::vector<LayerOnDevice> layers_;

  std::unique_ptr<CublasGemm> gemm_;
  std::unique_ptr<CudaPagedKvCache> cache_;         // dense
  std::unique_ptr<CudaQuantizedKvCache> quantized_;  // options.quantized_kv: instead of cache_
  std::unique_ptr<CudaHostKvTier> tier_;            // options.tier: instead of cache_
  std::optional<KvTierOptions> tier_options_;
  KvprCostModel kvpr_cost_;
  double last_recompute_fraction_ = 0;
  // Attention plans: one per micro-batch of a step (one without a tier).
  std::vector<std::unique_ptr<CudaPagedAttention>> attention_;
  // Activations of one step, for max_step_tokens rows.
  DeviceArray<int32_t> step_ints_;   // tokens [T] | positions [T] | logit rows [T] | next tokens [batch]
  DeviceArray<float> x_;             // [T, hidden] the residual stream
  DeviceArray<uint16_t> h_;          // [T, max(hidden, q_dim, intermediate)] GEMM inputs in dtype_
  DeviceArray<float> projected_;     // [T, max(q_dim + 2·kv_dim, 2·intermediate)] qkv, gate/up
  DeviceArray<uint16_t> q_, k_, v_;  // FP16 [T, heads, head_dim] attention inputs
  DeviceArray<uint16_t> attended_;   // FP16 [T, q_dim] attention output
  DeviceArray<float> logits_;        // [T, vocab]
  DeviceArray<RowSampling> sampling_;  // [max_sequences] how each row of a step is sampled
  // KVPR's recomputation, kRecomputeChunkRows rows at a time: K|V projections, then K and V in FP16.
  DeviceArray<float> recompute_projected_;
  DeviceArray<uint16_t> recompute_k_, recompute_v_;
};

}  // namespace slimkv::cuda
