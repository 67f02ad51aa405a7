// A model of the Llama family and its descendants on the CPU, in FP32: config, weights (memory-mapped)
// and the forward pass through the paged KV store. LlamaForCausalLM, MistralForCausalLM and
// Qwen2ForCausalLM are the plain layer; Qwen3 adds q/k norms, Qwen3-MoE routed experts, Gemma 3 sandwich
// norms, GeGLU and sliding-window layers. The pass reads those as ModelConfig's features.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/bf16_gemm.h"
#include "kv/store.h"
#include "slimkv/zack_ranks.h"
#include "model/forward_observer.h"
#include "model/llama_weights.h"
#include "model/model_config.h"
#include "model/rope.h"
#include "model/weight_store.h"
#include "model/zack_projection.h"
#include "util/thread_pool.h"

namespace slimkv {

// Activations of one forward call over n tokens; reused between calls (resized, not reallocated).
struct RunState {
  std::vector<float> x;        // (n, hidden)        the residual stream
  std::vector<float> xb;       // (n, hidden)        normed input of a sub-block
  std::vector<float> q;        // (n, q_dim)
  std::vector<float> k;        // (n, kv_dim)
  std::vector<float> v;        // (n, kv_dim)
  std::vector<float> att;      // (n, q_dim)         attention output, before o_proj
  std::vector<float> proj;     // (n, hidden)        o_proj / down_proj output
  std::vector<float> gate;     // (n, intermediate)
  std::vector<float> up;       // (n, intermediate)
  std::vector<float> cos, sin; // (n, head_dim / 2)  RoPE angles of the n positions
  std::vector<float> sliding_cos, sliding_sin;  // likewise for sliding layers' RoPE (Gemma 3)
  // Experts (Qwen3-MoE): each row's chosen experts and weights, and one expert's rows gathered.
  std::vector<float> router;   // (n, num_experts)
  std::vector<int> expert_of;  // (n, experts_per_token)
  std::vector<float> expert_weight;  // (n, experts_per_token)
  std::vector<float> expert_in, expert_gate, expert_up, expert_out;
};

// Which logits a sequence of a forward pass wants.
enum class LogitRows { kNone, kLast, kAll };

// One sequence's part of a forward pass.
struct ForwardSequence {
  std::span<const int32_t> tokens;
  KvStore* kv = nullptr;
  LogitRows logits = LogitRows::kLast;
  ForwardObserver* observer = nullptr;
};

class LlamaModel {
 public:
  // model_dir: a Hugging Face directory, or a GGUF file (model/gguf_model.h).
  static Expected<std::unique_ptr<LlamaModel>> load(const std::string& model_dir);

  const ModelConfig& config() const { return config_; }
  const std::string& model_dir() const { return model_dir_; }
  KvShape kv_shape() const;  // the store this model needs, full context (ZACK: each head's ranks)
  const LlamaWeights& weights() const { return weights_; }
  // The model's fingerprint (model/model_identity.h), which files computed from it carry.
  Expected<std::string> identity() const;

  // ZACK (model/zack_projection.h): loads the calibration (refused if made for another model), picks
  // the ranks the options ask for and folds W_V / W_O. From then on q and k are projected after RoPE
  // and the store keeps each head's ranks. Once, before any forward.
  Status enable_zack(const ZackOptions& options);
  const ZackProjection* zack() const { return zack_.get(); }  // nullptr without

  // For the CPU forward, after enable_zack: where matmul runs BF16 on the AMX tiles (takes_bf16_panels),
  // packs every BF16 matrix the forward multiplies by (the layers' and lm_head) into the tiles' panel
  // layout once, so that decode reads the weights as stored, with a batched step's bits equal to each
  // sequence's own. The embedding's rows stay as stored (its lookup reads rows; a tied lm_head gets its
  // own packed copy). The mapped row-major pages of the packed matrices leave memory (WeightStore::
  // release_pages), so the weights are not held twice. The CUDA upload reads the row-major data and never
  // needs this.
  void pack_weights_for_cpu(ThreadPool& pool);

  // Runs every sequence's tokens at the end of its KV store (positions kv->num_tokens(0) ...) through the
  // model in one pass: every row of the batch goes through each weight matrix together (one pass over
  // the weights for B sequences), and each sequence attends to its own store. Appends their K/V.
  // logits: the rows the sequences ask for, in order ([n, vocab] for kAll, [vocab] for kLast). Token
  // ids, context lengths and distinct stores are checked by the caller (engine/cpu_device_model.cc).
  // An observer, when given, sees that sequence's q/k/v and attention output per layer. Under ZACK, q
  // and k are seen before their projection, but v and the attention output are already in the reduced
  // V space (W_V is folded): [n, Σ heads' v ranks].
  void forward(std::span<const ForwardSequence> batch, float* logits, RunState& state, ThreadPool& pool) const;

 private:
  LlamaModel(std::string model_dir, ModelConfig config, WeightStore store, LlamaWeights weights);

  std::string model_dir_;
  ModelConfig config_;
  WeightStore store_;  // owns the mappings that weights_ points into
  LlamaWeights weights_;
  Rope rope_;
  Rope sliding_rope_;  // the sliding layers' (Gemma 3); unused otherwise
  std::unique_ptr<ZackProjection> zack_;  // owns the folded W_V / W_O that weights_ points into
  std::vector<Bf16Panels> packed_weights_;  // owns the panels weights_' bf16_panels point into
};

}  // namespace slimkv
