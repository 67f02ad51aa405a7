#include "model/cuda/llama_cuda.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/vec_ops.h"
#include "backend/cuda/layer_kernels.h"
#include "backend/cuda/random_fill.h"
#include "model/rope.h"
#include "util/half.h"

namespace slimkv::cuda {
namespace {

constexpr size_t kArenaAlignment = 256;

size_t aligned(size_t bytes) { return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

// Calls f(first, values, n) for consecutive slices of w's elements widened to FP32 (bounded scratch:
// a BF16 checkpoint never needs an FP32 copy of itself); stops at the first non-ok Status.
template <typename F>
Status for_each_widened_slice(const WeightMatrix& w, F&& f) {
  const int64_t slice_rows = std::max<int64_t>(1, (int64_t(1) << 22) / w.cols);
  std::vector<float> wide;
  for (int64_t row = 0; row < w.rows; row += slice_rows) {
    const int64_t count = std::min(slice_rows, w.rows - row);
    wide.resize(size_t(count * w.cols));
    widen_rows(w, row, count, wide.data());  // quantized GGUF weights are dequantized here
    SLIMKV_RETURN_IF_ERROR(f(size_t(row * w.cols), wide.data(), wide.size()));
  }
  return Status::ok();
}

// Uploads `w` to `device` in `dtype`: as stored when the dtypes agree, else converted a slice at a time.
Status upload_matrix(const WeightMatrix& w, DType dtype, void* device) {
  if (w.quant == BlockQuant::kNone && w.dtype == dtype) return copy_to_device(device, w.data, size_t(w.rows) * size_t(w.cols) * dtype_size_bytes(dtype));
  std::vector<uint16_t> narrow;
  return for_each_widened_slice(w, [&](size_t first, const float* wide, size_t n) {
    narrow.resize(n);
    for (size_t i = 0; i < n; ++i) narrow[i] = dtype == DType::kBF16 ? float_to_bf16(wide[i]) : float_to_fp16(wide[i]);
    return copy_to_device(static_cast<uint16_t*>(device) + first, narrow.data(), n * 2);
  });
}

// Uploads W_o [hidden, num_heads · head_dim] as [hidden, num_heads · stored_dim]: each head's columns,
// then zero columns up to stored_dim (the attention output's padded dims, zero themselves, add nothing).
Status upload_padded_columns(const WeightMatrix& w, DType dtype, int num_heads, int head_dim, int stored_dim, void* device) {
  if (stored_dim == head_dim) return upload_matrix(w, dtype, device);
  const size_t stored_cols = size_t(num_heads) * size_t(stored_dim);
  std::vector<uint16_t> narrow;
  return for_each_widened_slice(w, [&](size_t first, const float* wide, size_t n) {
    const size_t rows = n / size_t(w.cols), first_row = first / size_t(w.cols);
    narrow.assign(rows * stored_cols, 0);
    for (size_t r = 0; r < rows; ++r) {
      for (int h = 0; h < num_heads; ++h) {
        for (int i = 0; i < head_dim; ++i) {
          const float x = wide[r * size_t(w.cols) + size_t(h) * size_t(head_dim) + size_t(i)];
          narrow[r * stored_cols + size_t(h) * size_t(stored_dim) + size_t(i)] =
              dtype == DType::kBF16 ? float_to_bf16(x) : float_to_fp16(x);
        }
      }
    }
    return copy_to_device(static_cast<uint16_t*>(device) + first_row * stored_cols, narrow.data(), narrow.size() * 2);
  });
}

Status upload_floats(const std::vector<float>& values, float* device) {
  return copy_to_device(device, values.data(), values.size() * sizeof(float));
}

// What the GPU's kernels cannot hold of the model's shape: heads over 256 dims; and a softmax scale
// never set (a config made by hand without attention_scale).
Status check_shape(const ModelConfig& c) {
  if (!(c.attention_scale > 0)) {
    return error(c.architecture_name, ": attention_scale ", c.attention_scale, " (expected 1/sqrt(head_dim) or the "
                 "family's; parse_model_config sets it)");
  }
  if (attention_head_dim_for(int(c.head_dim)) == 0) {
    return error(c.architecture_name, ": head_dim ", c.head_dim,
                 " does not run on device cuda yet (its attention kernels hold heads of at most 256 dims): use --device cpu");
  }
  return Status::ok();
}

// ZACK's Q–K bases [k_rank, head_dim] per (layer, KV head), each row zero-padded to stored_dim: the
// projection of a padded q or k then reads its head_dim values alone.
std::vector<float> padded_bases(const ZackKvOptions& zack, int head_dim, int stored_dim) {
  std::vector<float> padded;
  for (size_t row = 0; row < zack.qk_bases.size() / size_t(head_dim); ++row) {
    padded.insert(padded.end(), zack.qk_bases.begin() + ptrdiff_t(row * size_t(head_dim)),
                  zack.qk_bases.begin() + ptrdiff_t((row + 1) * size_t(head_dim)));
    padded.resize(padded.size() + size_t(stored_dim - head_dim), 0.0f);
  }
  return padded;
}

// What of the model's features (model_config.h) the GPU's layer does not run yet; empty: it runs them all.
std::string features_not_on_cuda(const ModelConfig& c) {
  return c.moe.num_experts > 0 ? "experts (Qwen3-MoE's routed MLP)" : "";
}

// FP16 when every matrix fits its range (FP16 keeps 10 mantissa bits to BF16's 7, and a BF16 weight
// in FP16's normal range converts exactly), else BF16. Measured on the HF golden models: BF16
// activations put logits 2.5e-2 of max |logit| from transformers' FP32 ones, FP16 ones 3e-3.
constexpr float kFp16Max = 65504.0f;

DType upload_dtype(const LlamaWeights& weights) {
  std::vector<const WeightMatrix*> matrices = {&weights.embedding, &weights.lm_head};
  for (const LayerWeights& l : weights.layers) {
    for (const WeightMatrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.mlp.gate, &l.mlp.up, &l.mlp.down}) matrices.push_back(w);
  }
  for (const WeightMatrix* w : matrices) {
    if (w->dtype == DType::kF16) continue;
    const Status fits = for_each_widened_slice(*w, [](size_t, const float* wide, size_t n) {
      for (size_t i = 0; i < n; ++i) {
        if (!(std::fabs(wide[i]) < kFp16Max)) return error("outside FP16's range");
      }
      return Status::ok();
    });
    if (!fits) return DType::kBF16;
  }
  return DType::kF16;
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// The weight arena

Status CudaLlamaModel::WeightArena::reserve(size_t bytes) {
  SLIMKV_ASSIGN_OR_RETURN(memory_, DeviceArray<uint8_t>::allocate(bytes, "the model's weights"));
  used_ = 0;
  return Status::ok();
}

void* CudaLlamaModel::WeightArena::take(size_t bytes) {
  void* at = memory_.data() + used_;
  used_ += aligned(bytes);
  return at;
}

// ----------------------------------------------------------------------------------------------
// Construction

CudaLlamaModel::CudaLlamaModel(const ModelConfig& config, DType dtype, const CudaModelOptions& options)
    : config_(config),
      dtype_(dtype),
      context_tokens_(options.max_context_tokens > 0 ? int(std::min<int64_t>(options.max_context_tokens,
                                                                             config.max_position_embeddings))
                                                     : int(config.max_position_embeddings)),
      max_step_tokens_(options.max_step_tokens),
      max_sequences_(options.max_sequences),
      rotate_heads_(options.rotate_heads),
      attention_dim_(attention_head_dim_for(int(config.head_dim))),
      embedding_scale_(config.embedding_scale()) {}

CudaLlamaModel::~CudaLlamaModel() = default;

Status CudaLlamaModel::allocate_weights() {
  const ModelConfig& c = config_;
  const size_t half = dtype_size_bytes(dtype_), hidden = size_t(c.hidden_size), inter = size_t(c.intermediate_size);
  const size_t qkv_rows = size_t(c.q_dim() + 2 * c.kv_dim());
  const size_t o_cols = size_t(c.num_heads) * size_t(attention_dim_), head_dim = size_t(c.head_dim);
  const bool sliding = !c.sliding_layers.empty();
  const size_t layer_bytes = aligned(hidden * 4) * (c.sandwich_norms ? 4 : 2) + aligned(qkv_rows * hidden * half) +
                             (c.attention_bias ? aligned(qkv_rows * 4) : 0) + (c.qk_norm ? 2 * aligned(head_dim * 4) : 0) +
                             aligned(hidden * o_cols * half) + aligned(2 * inter * hidden * half) +
                             aligned(hidden * inter * half);
  const size_t table_bytes = aligned(size_t(c.vocab_size) * hidden * half);
  const size_t total = layer_bytes * size_t(c.num_layers) + table_bytes * (c.tie_word_embeddings ? 1 : 2) +
                       aligned(hidden * 4) + aligned(head_dim / 2 * 4) * (sliding ? 2 : 1);
  SLIMKV_RETURN_IF_ERROR(weights_.reserve(total).with_context("uploading the model to the GPU"));
  embedding_ = weights_.take(size_t(c.vocab_size) * hidden * half);
  lm_head_ = c.tie_word_embeddings ? embedding_ : weights_.take(size_t(c.vocab_size) * hidden * half);
  final_norm_ = static_cast<float*>(weights_.take(hidden * 4));
  inv_freq_ = static_cast<float*>(weights_.take(head_dim / 2 * 4));
  sliding_inv_freq_ = sliding ? static_cast<float*>(weights_.take(head_dim / 2 * 4)) : nullptr;
  const auto floats = [&](bool used, size_t count) { return used ? static_cast<float*>(weights_.take(count * 4)) : nullptr; };
  layers_.resize(size_t(c.num_layers));
  for (LayerOnDevice& l : layers_) {
    l.attention_norm = floats(true, hidden);
    l.w_qkv = weights_.take(qkv_rows * hidden * half);
    l.b_qkv = floats(c.attention_bias, qkv_rows);
    l.q_norm = floats(c.qk_norm, head_dim);
    l.k_norm = floats(c.qk_norm, head_dim);
    l.w_o = weights_.take(hidden * o_cols * half);
    l.attention_out_norm = floats(c.sandwich_norms, hidden);
    l.mlp_norm = floats(true, hidden);
    l.mlp_out_norm = floats(c.sandwich_norms, hidden);
    l.w_gate_up = weights_.take(2 * inter * hidden * half);
    l.w_down = weights_.take(hidden * inter * half);
  }
  SLIMKV_RETURN_IF_ERROR(upload_floats(Rope(c.rope, int(c.head_dim)).inverse_frequencies(), inv_freq_));
  if (!sliding) return Status::ok();
  return upload_floats(Rope(c.sliding_rope, int(c.head_dim)).inverse_frequencies(), sliding_inv_freq_);
}

// KVPR recomputes this many rows of X at a time (bounded scratch; 2048 rows of an 8B model are a
// GEMM of 69 GFLOP, long enough to run near the GPU's peak).
constexpr int kRecomputeChunkRows = 2048;

Status CudaLlamaModel::allocate_runtime(const CudaModelOptions& options) {
  const ModelConfig& c = config_;
  if (options.max_sequences < 1 || options.max_step_tokens < options.max_sequences) {
    return error("CUDA model: max_sequences ", options.max_sequences, " and max_step_tokens ", options.max_step_tokens,
                 " must be positive, max_step_tokens >= max_sequences");
  }
  const size_t T = size_t(max_step_tokens_);
  const size_t qkv = size_t(c.q_dim() + 2 * c.kv_dim()), inter = size_t(c.intermediate_size);
  // q, k, v and the attention output as the KV cache and attention hold them (padded heads).
  const size_t q_width = size_t(c.num_heads) * attention_dim_, kv_width = size_t(c.num_kv_heads) * attention_dim_;
  const size_t widest_input = std::max({size_t(c.hidden_size), q_width, inter});
  SLIMKV_ASSIGN_OR_RETURN(gemm_, CublasGemm::create());
  SLIMKV_ASSIGN_OR_RETURN(step_ints_, DeviceArray<int32_t>::allocate(3 * T + size_t(max_sequences_), "step ids"));
  SLIMKV_ASSIGN_OR_RETURN(x_, DeviceArray<float>::allocate(T * size_t(c.hidden_size), "the residual stream"));
  SLIMKV_ASSIGN_OR_RETURN(h_, DeviceArray<uint16_t>::allocate(T * widest_input, "GEMM inputs"));
  SLIMKV_ASSIGN_OR_RETURN(projected_, DeviceArray<float>::allocate(T * std::max({qkv, 2 * inter, size_t(c.hidden_size)}),
                                                                  "projections"));
  SLIMKV_ASSIGN_OR_RETURN(q_, DeviceArray<uint16_t>::allocate(T * q_width, "queries"));
  SLIMKV_ASSIGN_OR_RETURN(k_, DeviceArray<uint16_t>::allocate(T * kv_width, "keys"));
  SLIMKV_ASSIGN_OR_RETURN(v_, DeviceArray<uint16_t>::allocate(T * kv_width, "values"));
  SLIMKV_ASSIGN_OR_RETURN(attended_, DeviceArray<uint16_t>::allocate(T * q_width, "attention outputs"));
  SLIMKV_ASSIGN_OR_RETURN(logits_, DeviceArray<float>::allocate(T * size_t(c.vocab_size), "logits"));
  SLIMKV_ASSIGN_OR_RETURN(sampling_, DeviceArray<RowSampling>::allocate(size_t(max_sequences_), "sampling settings"));
  if (options.tier && options.tier->recompute) {
    const size_t rows = kRecomputeChunkRows;
    SLIMKV_ASSIGN_OR_RETURN(recompute_projected_,
                            DeviceArray<float>::allocate(rows * 2 * size_t(c.kv_dim()), "recomputed projections"));
    SLIMKV_ASSIGN_OR_RETURN(recompute_k_, DeviceArray<uint16_t>::allocate(rows * kv_width, "recomputed keys"));
    SLIMKV_ASSIGN_OR_RETURN(recompute_v_, DeviceArray<uint16_t>::allocate(rows * kv_width, "recomputed values"));
  }
  GpuKvShape shape{int(c.num_layers), int(c.num_heads), int(c.num_kv_heads), attention_dim_, int(c.hidden_size),
                   dtype_, max_sequences_, max_step_tokens_, context_tokens_};
  if (!c.sliding_layers.empty()) {
    shape.layer_windows.assign(size_t(c.num_layers), 0);
    for (int l = 0; l < int(c.num_layers); ++l) {
      if (c.is_sliding(l)) shape.layer_windows[size_t(l)] = int(c.sliding_window);
    }
  }
  std::optional<ZackKvOptions> zack = options.zack;
  if (zack && attention_dim_ != c.head_dim) zack->qk_bases = padded_bases(*zack, int(c.head_dim), attention_dim_);
  SLIMKV_ASSIGN_OR_RETURN(kv_, make_gpu_kv_cache(shape, {options.quantized_kv, zack, options.tier, options.pq, options.kv_cache_bytes}, this));
  return Status::ok();
}

KvprCostModel kvpr_cost_model(const ModelConfig& config, DType dtype, double kv_bytes_per_token, double link_bytes_per_s,
                              double gemm_flops_per_s) {
  return kvpr_cost_model(int(config.hidden_size), int(config.kv_dim()), dtype, kv_bytes_per_token, link_bytes_per_s,
                         gemm_flops_per_s);
}

Expected<std::unique_ptr<CudaLlamaModel>> CudaLlamaModel::upload(const ModelConfig& config, const LlamaWeights& weights,
                                                                 const CudaModelOptions& options) {
  if (const std::string missing = features_not_on_cuda(config); !missing.empty()) {
    return error(config.architecture_name, " does not run on device cuda yet (the CUDA model lacks ", missing,
                 "): use --device cpu");
  }
  SLIMKV_RETURN_IF_ERROR(check_shape(config));
  SLIMKV_RETURN_IF_ERROR(device_usable());
  std::unique_ptr<CudaLlamaModel> model(new CudaLlamaModel(config, upload_dtype(weights), options));
  SLIMKV_RETURN_IF_ERROR(model->allocate_weights());
  const DType dtype = model->dtype_;
  const size_t half = dtype_size_bytes(dtype), hidden = size_t(config.hidden_size);
  SLIMKV_RETURN_IF_ERROR(upload_matrix(weights.embedding, dtype, model->embedding_));
  if (!config.tie_word_embeddings) {
    SLIMKV_RETURN_IF_ERROR(upload_matrix(weights.lm_head, dtype, model->lm_head_));
  }
  SLIMKV_RETURN_IF_ERROR(upload_floats(weights.final_norm, model->final_norm_));
  // Stacks matrices row-wise into one fused device matrix (same cols).
  const auto upload_stacked = [&](std::initializer_list<const WeightMatrix*> parts, void* device) -> Status {
    auto* at = static_cast<uint8_t*>(device);
    for (const WeightMatrix* w : parts) {
      SLIMKV_RETURN_IF_ERROR(upload_matrix(*w, dtype, at));
      at += size_t(w->rows) * hidden * half;
    }
    return Status::ok();
  };
  for (size_t i = 0; i < weights.layers.size(); ++i) {
    const LayerWeights& w = weights.layers[i];
    const LayerOnDevice& l = model->layers_[i];
    SLIMKV_RETURN_IF_ERROR(upload_floats(w.attention_norm, l.attention_norm));
    SLIMKV_RETURN_IF_ERROR(upload_stacked({&w.wq, &w.wk, &w.wv}, l.w_qkv));
    if (l.b_qkv != nullptr) {
      std::vector<float> bias(w.bq);
      bias.insert(bias.end(), w.bk.begin(), w.bk.end());
      bias.insert(bias.end(), w.bv.begin(), w.bv.end());
      SLIMKV_RETURN_IF_ERROR(upload_floats(bias, l.b_qkv));
    }
    if (l.q_norm != nullptr) {
      SLIMKV_RETURN_IF_ERROR(upload_floats(w.q_norm, l.q_norm));
      SLIMKV_RETURN_IF_ERROR(upload_floats(w.k_norm, l.k_norm));
    }
    SLIMKV_RETURN_IF_ERROR(
        upload_padded_columns(w.wo, dtype, int(config.num_heads), int(config.head_dim), model->attention_dim_, l.w_o));
    if (l.attention_out_norm != nullptr) {
      SLIMKV_RETURN_IF_ERROR(upload_floats(w.attention_out_norm, l.attention_out_norm));
      SLIMKV_RETURN_IF_ERROR(upload_floats(w.mlp_out_norm, l.mlp_out_norm));
    }
    SLIMKV_RETURN_IF_ERROR(upload_floats(w.mlp_norm, l.mlp_norm));
    SLIMKV_RETURN_IF_ERROR(upload_stacked({&w.mlp.gate, &w.mlp.up}, l.w_gate_up));
    SLIMKV_RETURN_IF_ERROR(upload_matrix(w.mlp.down, dtype, l.w_down));
  }
  SLIMKV_RETURN_IF_ERROR(model->allocate_runtime(options));
  return Expected<std::unique_ptr<CudaLlamaModel>>(std::move(model));
}

Expected<std::unique_ptr<CudaLlamaModel>> CudaLlamaModel::random(const ModelConfig& config, uint64_t seed,
                                                                 const CudaModelOptions& options) {
  if (const std::string missing = features_not_on_cuda(config); !missing.empty()) {
    return error("a random ", config.architecture_name, " on device cuda: the CUDA model lacks ", missing);
  }
  SLIMKV_RETURN_IF_ERROR(check_shape(config));
  SLIMKV_RETURN_IF_ERROR(device_usable());
  std::unique_ptr<CudaLlamaModel> model(new CudaLlamaModel(config, DType::kF16, options));
  SLIMKV_RETURN_IF_ERROR(model->allocate_weights());
  uint64_t matrix = 0;
  // Uniform in ±sqrt(3 / cols): unit variance over cols products keeps activations in FP16's range.
  const auto fill = [&](void* device, int64_t rows, int64_t cols) {
    return fill_random_fp16(static_cast<uint16_t*>(device), size_t(rows) * size_t(cols),
                            seed + 0x9e3779b97f4a7c15ull * ++matrix, std::sqrt(3.0f / float(cols)));
  };
  const ModelConfig& c = config;
  const std::vector<float> ones(size_t(c.hidden_size), 1.0f);
  const std::vector<float> head_ones(size_t(c.head_dim), 1.0f);
  SLIMKV_RETURN_IF_ERROR(fill(model->embedding_, c.vocab_size, c.hidden_size));
  if (!c.tie_word_embeddings) SLIMKV_RETURN_IF_ERROR(fill(model->lm_head_, c.vocab_size, c.hidden_size));
  SLIMKV_RETURN_IF_ERROR(upload_floats(ones, model->final_norm_));
  for (const LayerOnDevice& l : model->layers_) {
    SLIMKV_RETURN_IF_ERROR(upload_floats(ones, l.attention_norm));
    SLIMKV_RETURN_IF_ERROR(fill(l.w_qkv, c.q_dim() + 2 * c.kv_dim(), c.hidden_size));
    if (l.b_qkv != nullptr) {
      SLIMKV_RETURN_IF_ERROR(device_fill_bytes(l.b_qkv, 0, size_t(c.q_dim() + 2 * c.kv_dim()) * 4));
    }
    for (float* norm : {l.q_norm, l.k_norm}) {
      if (norm != nullptr) SLIMKV_RETURN_IF_ERROR(upload_floats(head_ones, norm));
    }
    // Padded heads: the attention output's padded dims are zero, whatever their columns of W_o hold.
    SLIMKV_RETURN_IF_ERROR(fill(l.w_o, c.hidden_size, c.num_heads * model->attention_dim_));
    for (float* norm : {l.attention_out_norm, l.mlp_out_norm}) {
      if (norm != nullptr) SLIMKV_RETURN_IF_ERROR(upload_floats(ones, norm));
    }
    SLIMKV_RETURN_IF_ERROR(upload_floats(ones, l.mlp_norm));
    SLIMKV_RETURN_IF_ERROR(fill(l.w_gate_up, 2 * c.intermediate_size, c.hidden_size));
    SLIMKV_RETURN_IF_ERROR(fill(l.w_down, c.hidden_size, c.intermediate_size));
  }
  SLIMKV_RETURN_IF_ERROR(model->allocate_runtime(options));
  return Expected<std::unique_ptr<CudaLlamaModel>>(std::move(model));
}

size_t CudaLlamaModel::kv_cache_bytes() const { return kv_->device_bytes(); }

size_t CudaLlamaModel::recompute_bytes() const {
  if (recompute_k_.size() == 0) return 0;
  return kv_->kvpr().x_staging_bytes + recompute_projected_.bytes() + recompute_k_.bytes() + recompute_v_.bytes();
}

// ----------------------------------------------------------------------------------------------
// Steps

namespace {

// The step as the KV cache and attention plan it: each sequence's tokens after the step and new ones.
PagedAttentionBatch kv_step(std::span<const SequenceTokens> batch, const GpuKvCache& kv) {
  PagedAttentionBatch step;
  for (const SequenceTokens& s : batch) {
    const int held = kv.sequences().num_tokens(s.sequence), n = int(s.tokens.size());
    step.sequence_ids.push_back(s.sequence);
    step.kv_lens.push_back(held + n);
    step.query_counts.push_back(n);
  }
  return step;
}

}  // namespace

Status CudaLlamaModel::check_batch(std::span<const SequenceTokens> batch) const {
  if (batch.empty()) return error("a step of no sequences");
  if (int(batch.size()) > max_sequences_) {
    return error("a step of ", batch.size(), " sequences, over the model's max_sequences ", max_sequences_);
  }
  size_t total = 0;
  std::vector<bool> seen(size_t(max_sequences_), false);
  for (const SequenceTokens& s : batch) {
    if (!held().is_live(s.sequence) || seen[size_t(s.sequence)]) {
      return error("sequence ", s.sequence, " is not a sequence of this model, or is twice in one step");
    }
    seen[size_t(s.sequence)] = true;
    if (s.tokens.empty()) return error("sequence ", s.sequence, ": no tokens to run");
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      if (s.tokens[i] < 0 || s.tokens[i] >= config_.vocab_size) {
        return error("token id ", s.tokens[i], " at index ", i, " is outside the vocabulary [0, ", config_.vocab_size, ")");
      }
    }
    const int held_tokens = num_tokens(s.sequence);
    if (held_tokens + int64_t(s.tokens.size()) > context_tokens_) {
      return error("sequence would have ", held_tokens + int64_t(s.tokens.size()), " tokens (", held_tokens, " already + ",
                   s.tokens.size(), " new), more than the context of ", context_tokens_, " tokens");
    }
    total += s.tokens.size();
  }
  if (total > size_t(max_step_tokens_)) {
    return error("a step of ", total, " tokens, over the model's max_step_tokens ", max_step_tokens_,
                 " (run long prompts in chunks)");
  }
  return kv_->check_step(kv_step(batch, *kv_));
}

Expected<int> CudaLlamaModel::forward(std::span<const SequenceTokens> batch, std::span<const StepRows> wanted,
                                      std::vector<int64_t>& first_row) {
  SLIMKV_RETURN_IF_ERROR(check_batch(batch));
  const ModelConfig& c = config_;
  const int hidden = int(c.hidden_size), inter = int(c.intermediate_size);
  const int o_cols = int(c.num_heads) * attention_dim_, qkv_rows = int(c.q_dim() + 2 * c.kv_dim());

  // The step's ids in one upload: tokens, positions, and the rows whose logits are wanted (sampled
  // items' first, so that the sampler reads one run of rows).
  std::vector<int32_t> tokens, positions, logit_rows;
  first_row.assign(batch.size(), -1);
  for (const bool sampled : {true, false}) {
    int32_t row = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      const int n = int(batch[i].tokens.size());
      const StepRows w = wanted[i];
      if ((w == StepRows::kSample) == sampled && w != StepRows::kNone) {
        first_row[i] = int64_t(logit_rows.size());
        for (int t = w == StepRows::kAll ? 0 : n - 1; t < n; ++t) logit_rows.push_back(row + t);
      }
      row += n;
    }
  }
  for (const SequenceTokens& s : batch) {
    const int held = num_tokens(s.sequence), n = int(s.tokens.size());
    for (int i = 0; i < n; ++i) {
      tokens.push_back(s.tokens[size_t(i)]);
      positions.push_back(held + i);
    }
  }
  const int n = int(tokens.size()), rows = int(logit_rows.size());
  std::vector<int32_t> ids = tokens;
  ids.insert(ids.end(), positions.begin(), positions.end());
  ids.insert(ids.end(), logit_rows.begin(), logit_rows.end());
  SLIMKV_RETURN_IF_ERROR(step_ints_.upload(ids.data(), ids.size()));
  const int32_t* token_ids = step_ints_.data();
  const int32_t* token_positions = token_ids + n;
  const int32_t* rows_wanted = token_positions + n;
  SLIMKV_RETURN_IF_ERROR(kv_->begin_step(kv_step(batch, *kv_)));

  const float eps = float(c.rms_norm_eps), scale = float(c.attention_scale);  // 1/√head_dim, Gemma's 1/√query_pre_attn_scalar
  const AttentionHeads heads{int(c.num_heads), int(c.num_kv_heads), int(c.head_dim), attention_dim_};
  const GateActivation activation = c.activation == Activation::kGeluTanh ? GateActivation::kGeluTanh : GateActivation::kSilu;
  // o_proj reads the FP16 attention output; a BF16 model's gets a BF16 copy.
  void* attention_output_in_dtype = dtype_ == DType::kF16 ? static_cast<void*>(attended_.data()) : h_.data();
  // A sublayer's output W · input: added to x by the GEMM, or (sandwich norms) normed first, then added.
  const auto add_sublayer = [&](const void* input, const void* weight, int rows_out, int cols, const float* out_norm) {
    if (out_norm == nullptr) {
      return gemm_->multiply(input, n, weight, dtype_, rows_out, cols, x_.data(), /*accumulate=*/true);
    }
    SLIMKV_RETURN_IF_ERROR(gemm_->multiply(input, n, weight, dtype_, rows_out, cols, projected_.data()));
    return add_rmsnorm(projected_.data(), out_norm, eps, n, hidden, x_.data());
  };

  SLIMKV_RETURN_IF_ERROR(embed(token_ids, n, embedding_, dtype_, hidden, embedding_scale_, x_.data()));
  for (int l = 0; l < int(c.num_layers); ++l) {
    const LayerOnDevice& w = layers_[size_t(l)];
    // Attention block: h = rmsnorm(x); q, k, v = rope(qk_norm(project(h))); attend (sliding layers:
    // their window, their RoPE); x += o_proj(o)
    SLIMKV_RETURN_IF_ERROR(rmsnorm(x_.data(), w.attention_norm, eps, n, hidden, h_.data(), dtype_));
    SLIMKV_RETURN_IF_ERROR(kv_->keep_layer_input(l, h_.data()));
    SLIMKV_RETURN_IF_ERROR(gemm_->multiply(h_.data(), n, w.w_qkv, dtype_, qkv_rows, hidden, projected_.data()));
    SLIMKV_RETURN_IF_ERROR(attention_inputs(projected_.data(), n, heads, w.b_qkv, {w.q_norm, w.k_norm, eps},
                                            token_positions, c.is_sliding(l) ? sliding_inv_freq_ : inv_freq_,
                                            rotate_heads_, q_.data(), k_.data(), v_.data()));
    SLIMKV_RETURN_IF_ERROR(kv_->attend(l, q_.data(), k_.data(), v_.data(), scale, attended_.data()));
    if (rotate_heads_) SLIMKV_RETURN_IF_ERROR(rotate_heads(attended_.data(), size_t(n) * c.num_heads, attention_dim_));
    if (dtype_ != DType::kF16) {
      SLIMKV_RETURN_IF_ERROR(
          convert_half(attended_.data(), DType::kF16, size_t(n) * o_cols, attention_output_in_dtype, dtype_));
    }
    SLIMKV_RETURN_IF_ERROR(add_sublayer(attention_output_in_dtype, w.w_o, hidden, o_cols, w.attention_out_norm));

    // MLP block: x += down(act(gate(h)) · up(h)), h = rmsnorm(x)
    SLIMKV_RETURN_IF_ERROR(rmsnorm(x_.data(), w.mlp_norm, eps, n, hidden, h_.data(), dtype_));
    SLIMKV_RETURN_IF_ERROR(gemm_->multiply(h_.data(), n, w.w_gate_up, dtype_, 2 * inter, hidden, projected_.data()));
    SLIMKV_RETURN_IF_ERROR(gated_activation(projected_.data(), n, inter, activation, h_.data(), dtype_));
    SLIMKV_RETURN_IF_ERROR(add_sublayer(h_.data(), w.w_down, hidden, inter, w.mlp_out_norm));
  }
  if (rows == 0) return 0;
  SLIMKV_RETURN_IF_ERROR(rmsnorm(x_.data(), final_norm_, eps, rows, hidden, h_.data(), dtype_, rows_wanted));
  SLIMKV_RETURN_IF_ERROR(gemm_->multiply(h_.data(), rows, lm_head_, dtype_, c.vocab_size, hidden, logits_.data()));
  if (c.final_logit_softcap > 0) {  // Gemma: logits = cap · tanh(logits / cap)
    SLIMKV_RETURN_IF_ERROR(soft_cap(logits_.data(), size_t(rows) * size_t(c.vocab_size), float(c.final_logit_softcap)));
  }
  return rows;
}

int CudaLlamaModel::max_rows() const { return kRecomputeChunkRows; }

Status CudaLlamaModel::project_kv(int layer, const void* x, int n, const int32_t* positions, const uint16_t** k,
                                  const uint16_t** v) {
  const ModelConfig& c = config_;
  const LayerOnDevice& w = layers_[size_t(layer)];
  const size_t half = dtype_size_bytes(dtype_), hidden = size_t(c.hidden_size), q_dim = size_t(c.q_dim());
  // W_k and W_v are the rows of W_qkv after W_q's; their biases follow likewise.
  const void* w_kv = static_cast<const uint8_t*>(w.w_qkv) + q_dim * hidden * half;
  const float* b_kv = w.b_qkv != nullptr ? w.b_qkv + q_dim : nullptr;
  const AttentionHeads kv_heads{0, int(c.num_kv_heads), int(c.head_dim), attention_dim_};
  SLIMKV_RETURN_IF_ERROR(
      gemm_->multiply(x, n, w_kv, dtype_, 2 * c.kv_dim(), c.hidden_size, recompute_projected_.data()));
  SLIMKV_RETURN_IF_ERROR(attention_inputs(recompute_projected_.data(), n, kv_heads, b_kv,
                                          {nullptr, w.k_norm, float(c.rms_norm_eps)}, positions,
                                          c.is_sliding(layer) ? sliding_inv_freq_ : inv_freq_, rotate_heads_, nullptr,
                                          recompute_k_.data(), recompute_v_.data()));
  *k = recompute_k_.data();
  *v = recompute_v_.data();
  return Status::ok();
}

Status CudaLlamaModel::append_random_kv(int sequence, int tokens, uint64_t seed) {
  if (!held().is_live(sequence)) return error("sequence ", sequence, " is not a sequence of this model");
  const int held_tokens = num_tokens(sequence);
  if (held_tokens + int64_t(tokens) > context_tokens_) {
    return error("sequence would have ", held_tokens + int64_t(tokens), " tokens, more than the context of ",
                 context_tokens_);
  }
  const int blocks_needed = held().blocks_to_grow(sequence, held_tokens + tokens);
  if (blocks_needed > held().free_blocks()) {
    return error("the KV cache is full: ", blocks_needed, " more blocks needed, ", held().free_blocks(), " free");
  }
  const size_t kv_width = size_t(config_.num_kv_heads) * size_t(attention_dim_), hidden = size_t(config_.hidden_size);
  for (int done = 0; done < tokens;) {
    const int n = std::min(tokens - done, max_step_tokens_);
    SLIMKV_RETURN_IF_ERROR(kv_->begin_fill(sequence, n));
    for (int l = 0; l < int(config_.num_layers); ++l) {
      const uint64_t stream = seed + 0x9e3779b97f4a7c15ull * uint64_t(1 + 2 * (size_t(done) * 997 + size_t(l)));
      SLIMKV_RETURN_IF_ERROR(fill_random_fp16(k_.data(), size_t(n) * kv_width, stream, 1.732f));
      SLIMKV_RETURN_IF_ERROR(fill_random_fp16(v_.data(), size_t(n) * kv_width, stream + 1, 1.732f));
      // A tier keeps X too (kvpr): random rows of the same bytes, which recomputation reads.
      if (kv_->keeps_layer_input()) SLIMKV_RETURN_IF_ERROR(fill_random_fp16(h_.data(), size_t(n) * hidden, stream + 2, 1.0f));
      SLIMKV_RETURN_IF_ERROR(kv_->fill(l, k_.data(), v_.data(), h_.data()));
    }
    done += n;
  }
  return Status::ok();
}

Status CudaLlamaModel::step(std::span<const SequenceTokens> batch, bool all_logits, std::vector<float>& logits) {
  const std::vector<StepRows> wanted(batch.size(), all_logits ? StepRows::kAll : StepRows::kLast);
  std::vector<int64_t> first_row;
  SLIMKV_ASSIGN_OR_RETURN(int rows, forward(batch, wanted, first_row));
  logits.resize(size_t(rows) * size_t(config_.vocab_size));
  return logits_.download(logits.data(), logits.size());
}

Status CudaLlamaModel::step_sample(std::span<const SequenceTokens> batch, std::span<const RowSampling> sampling,
                                   std::vector<int32_t>& next_tokens) {
  if (!sampling.empty() && sampling.size() != batch.size()) {
    return error("sampling settings for ", sampling.size(), " sequences in a step of ", batch.size());
  }
  const std::vector<StepRows> wanted(batch.size(), StepRows::kSample);
  std::vector<int64_t> first_row;
  SLIMKV_ASSIGN_OR_RETURN(int rows, forward(batch, wanted, first_row));
  int32_t* next = step_ints_.data() + 3 * max_step_tokens_;
  if (sampling.empty()) {
    SLIMKV_RETURN_IF_ERROR(argmax_rows(logits_.data(), rows, int(config_.vocab_size), next));
  } else {
    SLIMKV_RETURN_IF_ERROR(sampling_.upload(sampling.data(), sampling.size()));
    SLIMKV_RETURN_IF_ERROR(sample_rows(logits_.data(), rows, int(config_.vocab_size), sampling_.data(), next));
  }
  next_tokens.resize(size_t(rows));
  return copy_to_host(next_tokens.data(), next, size_t(rows) * sizeof(int32_t));
}

Status CudaLlamaModel::run_step(std::span<const SequenceStep> items, StepOutputs& out) {
  std::vector<SequenceTokens> batch;
  std::vector<StepRows> wanted;
  std::vector<RowSampling> sampling;  // of the sampled items, in order: their rows lead the logits
  for (const SequenceStep& item : items) {
    batch.push_back({item.sequence, item.tokens});
    wanted.push_back(item.rows);
    if (item.rows == StepRows::kSample) sampling.push_back(item.sampling);
  }
  SLIMKV_ASSIGN_OR_RETURN(int rows, forward(batch, wanted, out.first_row));
  const int vocab = int(config_.vocab_size), sampled = int(sampling.size());
  out.tokens.assign(items.size(), -1);
  if (sampled > 0) {
    int32_t* next = step_ints_.data() + 3 * max_step_tokens_;
    std::vector<int32_t> drawn(static_cast<size_t>(sampled));
    SLIMKV_RETURN_IF_ERROR(sampling_.upload(sampling.data(), sampling.size()));
    SLIMKV_RETURN_IF_ERROR(sample_rows(logits_.data(), sampled, vocab, sampling_.data(), next));
    SLIMKV_RETURN_IF_ERROR(copy_to_host(drawn.data(), next, drawn.size() * sizeof(int32_t)));
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i].rows == StepRows::kSample) out.tokens[i] = drawn[size_t(out.first_row[i])];
    }
  }
  // The logits rows asked for follow the sampled ones: only those come back.
  out.logits.resize(size_t(rows - sampled) * size_t(vocab));
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].rows == StepRows::kSample) out.first_row[i] = -1;
    else if (out.first_row[i] >= 0) out.first_row[i] -= sampled;
  }
  if (rows == sampled) return Status::ok();
  return copy_to_host(out.logits.data(), logits_.data() + size_t(sampled) * size_t(vocab), out.logits.size() * sizeof(float));
}

}  // namespace slimkv::cuda
