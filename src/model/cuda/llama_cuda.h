// A Llama-family model on the GPU (issue 9; Qwen3, Qwen3-MoE and Gemma 3, issue 29): the forward pass of model/llama.cc with the weights in
// FP16/BF16 on the device, or in a GGUF file's quantized blocks (Q8_0, Q4_0, Q4_K, Q6_K: kept as blocks,
// backend/cuda/quantized_gemm.h), the GEMMs in cuBLAS or the quantized kernels, the KV in one GPU KV cache (kv/cuda/gpu_kv_cache.h:
// dense FP16 pages, sealed hack/quant blocks, or a host tier, as the options say; the model knows none
// of them), and several sequences of different lengths through the layers in one step (batched decode,
// prefill chunks, or both mixed: the basis of continuous batching), each bringing back logits rows or a
// token sampled on the GPU.
//
//   x = embed(tokens)                                     (Gemma: × √hidden)
//   for each layer:
//       h = rmsnorm(x);  kv.keep_layer_input(layer, h)      (kvpr keeps X)
//       qkv = h · W_qkvᵀ (one GEMM);  q, k, v = rope(qk_norm(qkv + bias)) in FP16   (q/k norms: Qwen3, Gemma 3)
//       o = kv.attend(layer, q, k, v)             (appends k, v, then attention; sliding layers: their window)
//       x += o · W_oᵀ (the add rides on the GEMM; Gemma 3: x += rmsnorm(o · W_oᵀ))
//       h = rmsnorm(x);  gu = h · W_gate_upᵀ;   x += act(gu) · W_downᵀ   (SwiGLU; Gemma: GeGLU, normed before the add)
//         (Qwen3-MoE's sparse layers: each row's top k experts by router softmax, grouped by expert on
//          the device; every expert's rows through its gate/up and down, one grouped launch each in
//          decode; x += the outputs weighted: add_routed_experts)
//   logits = lm_head(rmsnorm(x)) for the rows asked for   (Gemma: soft-capped where the config says)
//
// Gemma's (1 + w) norm weights arrive as that sum (model/llama_weights.h, in FP32, as transformers
// computes it) and are uploaded in FP32: the GPU's norms multiply by the same values as the CPU's.
// A head_dim the attention kernels lack (e.g. 48) is stored zero-padded to the next they have
// (attention_head_dim(); layer_kernels.h attention_inputs), W_o with zero columns to match.
//
// Kernels and their references: backend/cuda/layer_kernels.h, attention/cuda/paged_attention.h.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/expert_gemv.h"
#include "backend/cuda/item_products.h"
#include "backend/cuda/quantized_gemm.h"
#include "backend/cuda/sampling.h"
#include "kv/cuda/gpu_kv_cache.h"
#include "model/llama_weights.h"
#include "model/model_config.h"

namespace slimkv::cuda {

// The cost model of a model's split (kv/cuda/gpu_kv_cache.h's, for this model's shape; X in the
// weights' dtype).
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
  // ZACK's ranks and Q–K bases; the weights given to upload() must have W_V / W_O folded at full width
  // (model/zack_projection.h full_width_*).
  std::optional<ZackKvOptions> zack;
  // rot=hadamard (kv/rotation.h): q, k, v turned by H per head before attention and the cache, the
  // attention output turned back; scores are unchanged, the quantized blocks hold rotated values.
  bool rotate_heads = false;
  std::optional<KvTierOptions> tier;  // none: every block in GPU memory
  std::optional<PqKvOptions> pq;      // PQCache's token selection (kv/cuda/gpu_pq_kv.cc)
  // GGUF files: each quantized matrix stays in its blocks on the GPU (the file's bytes); true widens
  // them to the model's FP16/BF16 at upload instead (about 3.5x the memory of Q4_K_M), what the GPU did
  // before, kept so that benchmarks can compare the two.
  bool widen_quantized_weights = false;
  // Qwen3-MoE: a step's sequences of up to 64 rows multiply every expert's rows in grouped launches
  // planned on the device (backend/cuda/expert_gemv.h); false runs each expert's own products at every
  // step, as longer sequences do, so that tests and benchmarks can hold the two side by side.
  bool grouped_experts = true;
};

// The weights random() generates: FP16 matrices, or blocks of one type, or a mix like llama.cpp's
// Q4_K_M (Q4_K, with Q6_K for W_v, W_down and the lm_head).
enum class RandomWeights { kF16, kQ8_0, kQ4_0, kQ4_K_M };
// "f16", "q8_0", "q4_0", "q4_k_m" (the benchmarks' names), or an error naming the choices.
Expected<RandomWeights> parse_random_weights(std::string_view name);

// One sequence's part of a step: its new tokens, run at the end of what it holds.
struct SequenceTokens {
  int sequence = 0;
  std::span<const int32_t> tokens;
};

// What a sequence's part of a step brings back to the host.
enum class StepRows {
  kNone,    // nothing
  kLast,    // the logits of its last token [vocab]
  kAll,     // the logits of every token it ran [n, vocab]
  kSample,  // its next token, drawn on the GPU as `sampling` says (backend/cuda/sampling.h)
};
struct SequenceStep {
  int sequence = 0;
  std::span<const int32_t> tokens;
  StepRows rows = StepRows::kLast;
  RowSampling sampling;  // kSample
};
struct StepOutputs {
  std::vector<float> logits;       // the rows asked for, items in order [rows, vocab]
  std::vector<int64_t> first_row;  // per item: its first row in logits, -1 when none
  std::vector<int32_t> tokens;     // per item: the sampled token (kSample), else -1
};

class CudaLlamaModel final : private KvProjection {
 public:
  // The weights of a loaded model, uploaded in FP16 when every value fits FP16's range (F32 weights
  // rounded; BF16 ones exact in FP16's normal range), else in BF16. FP16 keeps 3 more mantissa bits
  // of the activations that feed the GEMMs, which are rounded to the weights' dtype. Quantized GGUF
  // matrices stay in their blocks (unless options.widen_quantized_weights), the activations in that
  // dtype all the same.
  static Expected<std::unique_ptr<CudaLlamaModel>> upload(const ModelConfig& config, const LlamaWeights& weights,
                                                          const CudaModelOptions& options);
  // Random weights of config's shape generated on the GPU (benchmarks at shapes not at hand, such as
  // Llama-3-8B's, without downloading them): FP16 matrices uniform with unit-variance products, or
  // random blocks of about that spread (fill_random_quantized), as `weights` says.
  static Expected<std::unique_ptr<CudaLlamaModel>> random(const ModelConfig& config, uint64_t seed,
                                                          const CudaModelOptions& options,
                                                          RandomWeights weights = RandomWeights::kF16);
  ~CudaLlamaModel();

  const ModelConfig& config() const { return config_; }
  // The dims of a head in the KV cache and attention: head_dim, or the next size the kernels have.
  int attention_head_dim() const { return attention_dim_; }
  DType weight_dtype() const { return dtype_; }
  // What the matrices are held in: "FP16", or e.g. "Q4_K+Q6_K+FP16" (block types first, then plain).
  std::string weight_description() const;
  int context_tokens() const { return context_tokens_; }
  // GPU memory of the weights as held (quantized blocks at the file's bytes).
  size_t weight_bytes() const { return weights_.bytes(); }
  // GPU memory of the KV: the block pools (FP16, and sealed quantized blocks), or a tier's staging buffers.
  size_t kv_cache_bytes() const;
  // GPU memory KVPR adds beside the KV: X's staging and the recomputation's scratch (0 without kvpr).
  size_t recompute_bytes() const;
  size_t host_kv_bytes() const { return kv_->host_bytes(); }
  int kv_cache_blocks() const { return held().num_blocks(); }
  int free_kv_blocks() const { return held().free_blocks(); }
  // The fraction of held tokens the last step recomputed (kvpr), and the cost model that chose it.
  double last_recompute_fraction() const { return kv_->kvpr().last_recompute_fraction; }
  KvprCostModel kvpr_cost_model() const { return kv_->kvpr().cost; }
  // The KV cache: its sequences and budget, and a sequence's blocks out and in (export/import).
  const GpuKvCache& kv() const { return *kv_; }
  GpuKvCache& kv() { return *kv_; }

  // A new, empty sequence (an id for steps), or an error when max_sequences are held.
  Expected<int> add_sequence() { return kv_->add_sequence(); }
  void remove_sequence(int sequence) { kv_->remove_sequence(sequence); }  // frees its KV blocks
  int num_tokens(int sequence) const { return held().num_tokens(sequence); }

  // Runs each item's tokens through the model in one pass, bringing back what each asks for (logits
  // rows, or a token sampled on the GPU: only those rows or ids cross to the host). Checked as step().
  // after_attention (if set) is called on this thread as soon as each layer's attention is enqueued,
  // the layer's KV then final for the step while later layers are still to run (a KV stream hands the
  // layer's blocks out there); an error it returns ends the step.
  using LayerHook = std::function<Status(int layer)>;
  Status run_step(std::span<const SequenceStep> items, StepOutputs& out, const LayerHook& after_attention = {});

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
  // A contiguous device allocation cut into the matrices and vectors of the model, sized by a counting
  // pass: until reserve(), take() only adds up the bytes asked for and returns nullptr.
  class WeightArena {
   public:
    // The memory for what was counted; later takes cut it from its start.
    Status reserve();
    // The next `bytes` of the arena, 256-byte aligned (nullptr while counting).
    void* take(size_t bytes);
    size_t bytes() const { return memory_.bytes(); }

   private:
    DeviceArray<uint8_t> memory_;
    size_t used_ = 0;
  };
  // A projection's weights as runs of rows, each one matrix of one kind (plain or one block type):
  // stacked matrices (W_q|W_k|W_v, W_gate|W_up) whose parts differ in type (a Q4_K_M file's W_v is Q6_K
  // beside Q4_K W_q, W_k) multiply run by run, each writing its columns of the one output.
  struct StackedMatrix {
    std::vector<DeviceMatrix> runs;
    int64_t rows = 0;
    // Rows [first, first + count), runs cut where the range cuts them.
    StackedMatrix row_range(int64_t first, int64_t count) const;
  };
  // The kind each matrix is kept in on the GPU: a block type, or kNone (the model's FP16/BF16). In a
  // sparse layer gate, up and down are every expert's (a GGUF file stores a layer's experts stacked, one
  // type for all), and router its router's.
  struct LayerKinds {
    BlockQuant q, k, v, o, gate, up, down, router;
  };
  struct WeightKinds {
    BlockQuant embedding = BlockQuant::kNone, lm_head = BlockQuant::kNone;
    std::vector<LayerKinds> layers;
  };
  // One gated MLP of `intermediate` (the dense one, or an expert).
  struct MlpOnDevice {
    StackedMatrix w_gate_up;  // [2·intermediate, hidden]: W_gate, W_up stacked
    StackedMatrix w_down;     // [hidden, intermediate]
  };
  struct LayerOnDevice {
    float* attention_norm = nullptr;  // [hidden]
    StackedMatrix w_qkv;              // [q_dim + 2·kv_dim, hidden]: W_q, W_k, W_v stacked
    float* b_qkv = nullptr;           // [q_dim + 2·kv_dim] or nullptr
    float* q_norm = nullptr;          // [head_dim] each with qk_norm, else nullptr
    float* k_norm = nullptr;
    StackedMatrix w_o;                // [hidden, num_heads · attention_dim]: W_o, zero columns after each head's head_dim
    float* attention_out_norm = nullptr;  // [hidden] with sandwich_norms, else nullptr
    float* mlp_norm = nullptr;        // [hidden]
    float* mlp_out_norm = nullptr;    // [hidden] with sandwich_norms, else nullptr
    MlpOnDevice mlp;                  // a dense layer's (intermediate_size); empty in a sparse layer
    StackedMatrix router;             // [num_experts, hidden] a sparse layer's; else empty
    std::vector<MlpOnDevice> experts;  // [num_experts] a sparse layer's (expert_intermediate_size); else empty
    // The same experts addressed by index for the grouped products (expert_gemv.h): each run of
    // W_gate|W_up, and W_down. Empty in a dense layer.
    std::vector<ExpertMatrices> experts_gate_up;
    ExpertMatrices experts_down;
  };

  CudaLlamaModel(const ModelConfig& config, DType dtype, const CudaModelOptions& options);
  // Lays the weights out in the arena, each matrix of the kind `kinds` names (sizes only: the callers
  // fill them): a counting pass, then the allocation, then the same layout again.
  Status allocate_weights(const WeightKinds& kinds);
  void lay_out_weights(const WeightKinds& kinds);
  // The parts (rows, kind) of a stacked matrix of `cols` columns, as runs in the arena.
  StackedMatrix take_stacked(std::initializer_list<std::pair<int64_t, BlockQuant>> parts, int64_t cols);
  // y = x · Wᵀ over every run of w (x in dtype_, y FP32 [n, w.rows]), or y += when accumulate: as one
  // product of n rows (recomputed KV), or item by item (a step's rows by sequence, an expert's rows by
  // sequence: item_products.h, each sequence's rows get the bits they get alone).
  Status multiply(const void* x, int n, const StackedMatrix& w, float* y, bool accumulate = false);
  Status multiply_items(const void* x, const std::vector<int>& items, const StackedMatrix& w, float* y,
                        bool accumulate = false, PlainItems plain = PlainItems::kPaddedGroups);
  // Activations and the KV cache, sized by the options.
  Status allocate_runtime(const CudaModelOptions& options);
  // The sparse layers' experts_gate_up and experts_down from their laid-out experts; grouped_experts_.
  Status index_experts();
  // A sparse layer's MLP over the step's rows of h_ (normed, in dtype_; step_items_): y = Σ_j weight_j ·
  // expert_j(h) over each row's k routed experts, or y += that when accumulate (as the CPU's mlp() in
  // model/llama.cc).
  Status add_routed_experts(const LayerOnDevice& layer, float* y, bool accumulate);
  // Routes the step's rows [first_row, first_row + rows) by router_logits_: expert_of_, expert_weight_
  // and the plan of their places, each from its start (rows numbered from first_row).
  Expected<ExpertRowsPlan> route_rows(int first_row, int rows);
  // add_routed_experts over rows [first_row, first_row + rows): through the grouped GEMVs; or, the rows
  // of `items` (each a sequence's), through each expert's own products.
  Status add_grouped_experts(const LayerOnDevice& layer, int first_row, int rows, float* y, bool accumulate);
  Status add_expert_products(const LayerOnDevice& layer, int first_row, const std::vector<int>& items, float* y,
                             bool accumulate);
  // y[p, :] = input row of p · W_eᵀ over every run of a stacked expert matrix (grouped_expert_gemv),
  // each run into its columns of y [*, Σ run rows].
  Status multiply_experts(const void* x, const int32_t* x_rows, const std::vector<ExpertMatrices>& runs,
                          const ExpertRowsPlan& plan, int slots, float* y);
  const SequenceBlocks& held() const { return kv_->sequences(); }
  Status check_batch(std::span<const SequenceTokens> batch) const;
  // KvProjection (a tier that recomputes, KVPR): K/V of X rows through layer's W_k, W_v and RoPE.
  int max_rows() const override;
  Status project_kv(int layer, const void* x, int n, const int32_t* positions, const uint16_t** k,
                    const uint16_t** v) override;
  // The pass shared by the steps: leaves the logits of the rows asked for on the device [rows, vocab],
  // the rows of sampled items first (in item order), then the others' (likewise); first_row: per item,
  // its first row (-1: none). Returns the number of rows.
  Expected<int> forward(std::span<const SequenceTokens> batch, std::span<const StepRows> rows,
                        std::vector<int64_t>& first_row, const LayerHook& after_attention = {});

  ModelConfig config_;
  DType dtype_;  // of the weights and of every GEMM input
  int context_tokens_ = 0;
  int max_step_tokens_ = 0;
  int max_sequences_ = 0;
  bool rotate_heads_ = false;
  int attention_dim_ = 0;  // a head's dims in q, k, v, the KV cache and the attention output
  float embedding_scale_ = 1.0f;

  WeightArena weights_;
  size_t largest_quantized_values_ = 0;  // of the matrices kept in blocks (sizes the prefill tiles)
  std::vector<BlockQuant> block_types_;  // the block types held, in first-seen order
  bool plain_matrices_ = false;          // whether any matrix is held in dtype_
  bool grouped_experts_ = false;  // options.grouped_experts, kept where every sparse layer's experts fit grouped_expert_gemv
  DeviceMatrix embedding_;     // [vocab, hidden]
  DeviceMatrix lm_head_;       // [vocab, hidden] (the embedding when tied)
  float* final_norm_ = nullptr;
  float* inv_freq_ = nullptr;  // RoPE's inverse frequencies [head_dim / 2] (model/rope.h)
  float* sliding_inv_freq_ = nullptr;  // the sliding layers' (Gemma 3: rope_local_base_freq), or nullptr
  std::vector<LayerOnDevice> layers_;

  std::unique_ptr<WeightGemm> gemm_;
  std::unique_ptr<ItemProducts> item_products_;
  std::vector<int> step_items_;   // the running step's rows by sequence
  std::vector<int> logit_items_;  // its logit rows by sequence, in the order they are laid out
  std::unique_ptr<GpuKvCache> kv_;  // kv/cuda: dense, quantized, or a host tier, as the options say
  // Activations of one step, for max_step_tokens rows.
  DeviceArray<int32_t> step_ints_;   // tokens [T] | positions [T] | logit rows [T] | next tokens [batch]
  DeviceArray<float> x_;             // [T, hidden] the residual stream
  DeviceArray<uint16_t> h_;          // [T, max(hidden, q_dim, intermediate)] GEMM inputs in dtype_
  DeviceArray<float> projected_;     // [T, max(q_dim + 2·kv_dim, 2·intermediate, hidden)] qkv, gate/up, normed outputs
  DeviceArray<uint16_t> q_, k_, v_;  // FP16 [T, heads, attention_dim] attention inputs
  DeviceArray<uint16_t> attended_;   // FP16 [T, num_heads · attention_dim] attention output
  DeviceArray<float> logits_;        // [T, vocab]
  DeviceArray<RowSampling> sampling_;  // [max_sequences] how each sampled row of a step is drawn
  // Sparse layers (Qwen3-MoE), empty without: the router's logits [T, num_experts] FP32; each row's
  // experts and weights [T, k] (k = experts_per_token); the plan of a layer's experts' rows (the T·k
  // choices grouped by expert, each expert's rows in token order: expert_routing.h ExpertRowsPlan,
  // expert_plan_values(T·k, num_experts)); and the grouped rows: GEMM inputs [T·k, max(hidden, expert_intermediate)]
  // in dtype_ (gathered h, then act(gate)·up), FP32 products [T·k, max(2·expert_intermediate, hidden)]
  // (gate|up, then the experts' outputs).
  DeviceArray<float> router_logits_;
  DeviceArray<int32_t> expert_of_;
  DeviceArray<float> expert_weight_;
  DeviceArray<int32_t> expert_plan_;
  DeviceArray<uint32_t> expert_sum_counts_;  // [grouped_sum_counters(hidden)] the grouped W_down's sum's (expert_gemv.h)
  DeviceArray<uint16_t> expert_inputs_;
  DeviceArray<float> expert_products_;
  // KVPR's recomputation, kRecomputeChunkRows rows at a time: K|V projections, then K and V in FP16.
  DeviceArray<float> recompute_projected_;
  DeviceArray<uint16_t> recompute_k_, recompute_v_;
};

}  // namespace slimkv::cuda
