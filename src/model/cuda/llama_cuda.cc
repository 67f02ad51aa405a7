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
  constexpr size_t kSlice = size_t(1) << 22;
  const size_t count = size_t(w.rows) * size_t(w.cols), in_bytes = dtype_size_bytes(w.dtype);
  std::vector<float> wide;
  for (size_t first = 0; first < count; first += kSlice) {
    const size_t n = std::min(kSlice, count - first);
    wide.resize(n);
    widen_to_f32(static_cast<const uint8_t*>(w.data) + first * in_bytes, w.dtype, wide.data(), n);
    SLIMKV_RETURN_IF_ERROR(f(first, wide.data(), n));
  }
  return Status::ok();
}

// Uploads `w` to `device` in `dtype`: as stored when the dtypes agree, else converted a slice at a time.
Status upload_matrix(const WeightMatrix& w, DType dtype, void* device) {
  if (w.dtype == dtype) return copy_to_device(device, w.data, size_t(w.rows) * size_t(w.cols) * dtype_size_bytes(dtype));
  std::vector<uint16_t> narrow;
  return for_each_widened_slice(w, [&](size_t first, const float* wide, size_t n) {
    narrow.resize(n);
    for (size_t i = 0; i < n; ++i) narrow[i] = dtype == DType::kBF16 ? float_to_bf16(wide[i]) : float_to_fp16(wide[i]);
    return copy_to_device(static_cast<uint16_t*>(device) + first, narrow.data(), n * 2);
  });
}

Status upload_floats(const std::vector<float>& values, float* device) {
  return copy_to_device(device, values.data(), values.size() * sizeof(float));
}

// FP16 when every matrix fits its range (FP16 keeps 10 mantissa bits to BF16's 7, and a BF16 weight
// in FP16's normal range converts exactly), else BF16. Measured on the HF golden models: BF16
// activations put logits 2.5e-2 of max |logit| from transformers' FP32 ones, FP16 ones 3e-3.
constexpr float kFp16Max = 65504.0f;

DType upload_dtype(const LlamaWeights& weights) {
  std::vector<const WeightMatrix*> matrices = {&weights.embedding, &weights.lm_head};
  for (const LayerWeights& l : weights.layers) {
    for (const WeightMatrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) matrices.push_back(w);
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
      rotate_heads_(options.rotate_heads) {}

CudaLlamaModel::~CudaLlamaModel() = default;

Status CudaLlamaModel::allocate_weights() {
  const ModelConfig& c = config_;
  const size_t half = dtype_size_bytes(dtype_), hidden = size_t(c.hidden_size), inter = size_t(c.intermediate_size);
  const size_t qkv_rows = size_t(c.q_dim() + 2 * c.kv_dim());
  const size_t layer_bytes = aligned(hidden * 4) * 2 + aligned(qkv_rows * hidden * half) +
                             (c.attention_bias ? aligned(qkv_rows * 4) : 0) + aligned(hidden * size_t(c.q_dim()) * half) +
                             aligned(2 * inter * hidden * half) + aligned(hidden * inter * half);
  const size_t table_bytes = aligned(size_t(c.vocab_size) * hidden * half);
  const size_t total = layer_bytes * size_t(c.num_layers) + table_bytes * (c.tie_word_embeddings ? 1 : 2) +
                       aligned(hidden * 4) + aligned(size_t(c.head_dim / 2) * 4);
  SLIMKV_RETURN_IF_ERROR(weights_.reserve(total).with_context("uploading the model to the GPU"));
  embedding_ = weights_.take(size_t(c.vocab_size) * hidden * half);
  lm_head_ = c.tie_word_embeddings ? embedding_ : weights_.take(size_t(c.vocab_size) * hidden * half);
  final_norm_ = static_cast<float*>(weights_.take(hidden * 4));
  inv_freq_ = static_cast<float*>(weights_.take(size_t(c.head_dim / 2) * 4));
  layers_.resize(size_t(c.num_layers));
  for (LayerOnDevice& l : layers_) {
    l.attention_norm = static_cast<float*>(weights_.take(hidden * 4));
    l.w_qkv = weights_.take(qkv_rows * hidden * half);
    l.b_qkv = c.attention_bias ? static_cast<float*>(weights_.take(qkv_rows * 4)) : nullptr;
    l.w_o = weights_.take(hidden * size_t(c.q_dim()) * half);
    l.mlp_norm = static_cast<float*>(weights_.take(hidden * 4));
    l.w_gate_up = weights_.take(2 * inter * hidden * half);
    l.w_down = weights_.take(hidden * inter * half);
  }
  const Rope rope(c);
  return upload_floats(rope.inverse_frequencies(), inv_freq_);
}

Status CudaLlamaModel::allocate_runtime(const CudaModelOptions& options) {
  const ModelConfig& c = config_;
  if (options.max_sequences < 1 || options.max_step_tokens < options.max_sequences) {
    return error("CUDA model: max_sequences ", options.max_sequences, " and max_step_tokens ", options.max_step_tokens,
                 " must be positive, max_step_tokens >= max_sequences");
  }
  const size_t T = size_t(max_step_tokens_);
  const size_t qkv = size_t(c.q_dim() + 2 * c.kv_dim()), inter = size_t(c.intermediate_size);
  const size_t widest_input = std::max({size_t(c.hidden_size), size_t(c.q_dim()), inter});
  SLIMKV_ASSIGN_OR_RETURN(gemm_, CublasGemm::create());
  SLIMKV_ASSIGN_OR_RETURN(step_ints_, DeviceArray<int32_t>::allocate(3 * T + size_t(max_sequences_), "step ids"));
  SLIMKV_ASSIGN_OR_RETURN(x_, DeviceArray<float>::allocate(T * size_t(c.hidden_size), "the residual stream"));
  SLIMKV_ASSIGN_OR_RETURN(h_, DeviceArray<uint16_t>::allocate(T * widest_input, "GEMM inputs"));
  SLIMKV_ASSIGN_OR_RETURN(projected_, DeviceArray<float>::allocate(T * std::max(qkv, 2 * inter), "projections"));
  SLIMKV_ASSIGN_OR_RETURN(q_, DeviceArray<uint16_t>::allocate(T * size_t(c.q_dim()), "queries"));
  SLIMKV_ASSIGN_OR_RETURN(k_, DeviceArray<uint16_t>::allocate(T * size_t(c.kv_dim()), "keys"));
  SLIMKV_ASSIGN_OR_RETURN(v_, DeviceArray<uint16_t>::allocate(T * size_t(c.kv_dim()), "values"));
  SLIMKV_ASSIGN_OR_RETURN(attended_, DeviceArray<uint16_t>::allocate(T * size_t(c.q_dim()), "attention outputs"));
  SLIMKV_ASSIGN_OR_RETURN(logits_, DeviceArray<float>::allocate(T * size_t(c.vocab_size), "logits"));
  SLIMKV_ASSIGN_OR_RETURN(sampling_, DeviceArray<RowSampling>::allocate(size_t(max_sequences_), "sampling settings"));

  const PagedAttentionShape attention_shape{int(c.num_heads), int(c.num_kv_heads), int(c.head_dim), max_sequences_,
                                            max_step_tokens_};
  attention_.resize(1);
  SLIMKV_ASSIGN_OR_RETURN(attention_[0], CudaPagedAttention::create(attention_shape));
  const int blocks_per_sequence = (context_tokens_ + kCudaBlockTokens - 1) / kCudaBlockTokens;
  if (options.tier) return allocate_tier(options, blocks_per_sequence);

  // The block pool: what was asked for, or the full contexts of every sequence within 90% of what is
  // free. Quantized KV: the FP16 window (sized by the step, not the context) first, sealed blocks in the rest.
  CudaKvShape kv_shape{int(c.num_layers), int(c.num_kv_heads), int(c.head_dim), 0, max_sequences_, blocks_per_sequence,
                       max_step_tokens_};
  const size_t fp16_block_bytes = size_t(c.num_layers) * 2 * size_t(c.num_kv_heads) * kCudaBlockTokens * size_t(c.head_dim) * 2;
  size_t block_bytes = fp16_block_bytes, window_bytes = 0;
  if (const auto& q = options.quantized_kv) {
    SLIMKV_ASSIGN_OR_RETURN(block_bytes, CudaQuantizedKvCache::sealed_block_bytes(kv_shape, q->config));
    window_bytes = size_t(CudaQuantizedKvCache::window_blocks(kv_shape)) * fp16_block_bytes;
  }
  size_t budget = options.kv_cache_bytes;
  if (budget == 0) {
    SLIMKV_ASSIGN_OR_RETURN(size_t free_bytes, device_free_memory());
    budget = free_bytes / 10 * 9;
  }
  const size_t fitting = budget > window_bytes ? (budget - window_bytes) / block_bytes : 0;
  const size_t blocks = options.kv_cache_bytes > 0 ? fitting
                                                   : std::min(size_t(options.max_sequences) * size_t(blocks_per_sequence), fitting);
  if (blocks == 0) {
    return error("CUDA model: no room for a single KV block of ", block_bytes, " bytes (kv_cache_bytes ",
                 options.kv_cache_bytes, ", of which the quantized KV's FP16 window takes ", window_bytes, ")");
  }
  kv_shape.num_blocks = int(std::min<size_t>(blocks, 1u << 30));
  if (const auto& q = options.quantized_kv) {
    SLIMKV_ASSIGN_OR_RETURN(quantized_, CudaQuantizedKvCache::create(kv_shape, q->config, q->hack, q->seed));
    return Status::ok();
  }
  SLIMKV_ASSIGN_OR_RETURN(cache_, CudaPagedKvCache::create(kv_shape));
  return Status::ok();
}

KvprCostModel kvpr_cost_model(const ModelConfig& config, DType dtype, double kv_bytes_per_token, double link_bytes_per_s,
                              double gemm_flops_per_s) {
  return KvprCostModel{link_bytes_per_s,
                       gemm_flops_per_s,
                       double(size_t(config.hidden_size) * dtype_size_bytes(dtype)),
                       kv_bytes_per_token,
                       2.0 * double(config.hidden_size) * 2.0 * double(config.kv_dim()),
                       KvprCostModel::Overlap::kPipelined};
}

// KVPR recomputes this many rows of X at a time (bounded scratch; 2048 rows of an 8B model are a
// GEMM of 69 GFLOP, long enough to run near the GPU's peak).
constexpr int kRecomputeChunkRows = 2048;

Status CudaLlamaModel::allocate_tier(const CudaModelOptions& model_options, int blocks_per_sequence) {
  const ModelConfig& c = config_;
  const KvTierOptions& options = *model_options.tier;
  const size_t gpu_kv_bytes = model_options.kv_cache_bytes;
  std::optional<QuantizedBlockSealer> sealer;
  if (const auto& q = model_options.quantized_kv) {
    SLIMKV_ASSIGN_OR_RETURN(sealer, QuantizedBlockSealer::create(q->config, q->hack, q->seed, int(c.num_kv_heads),
                                                                 int(c.head_dim)));
  }
  const size_t sealed_block_bytes = sealer ? size_t(c.num_kv_heads) * sealer->layout().block_bytes : 0;
  const size_t kv_block_bytes = 2 * size_t(c.num_kv_heads) * kCudaBlockTokens * size_t(c.head_dim) * 2 + sealed_block_bytes;
  const size_t x_block_bytes = size_t(kCudaBlockTokens) * size_t(c.hidden_size) * dtype_size_bytes(dtype_);
  const size_t per_token_all_layers = size_t(c.num_layers) * (kv_block_bytes + (options.recompute ? x_block_bytes : 0)) /
                                      kCudaBlockTokens;
  const size_t host_blocks = options.host_bytes > 0
                                 ? options.host_bytes / (per_token_all_layers * kCudaBlockTokens)
                                 : size_t(max_sequences_) * size_t(blocks_per_sequence);
  // Staging: two buffers of K|V (and X rows for kvpr) of one layer.
  const size_t staging_block_bytes = 2 * (kv_block_bytes + (options.recompute ? x_block_bytes : 0));
  size_t staging_blocks = size_t(max_sequences_) * size_t(blocks_per_sequence);
  if (gpu_kv_bytes > 0) {
    staging_blocks = gpu_kv_bytes / (2 * kv_block_bytes);
  } else {
    SLIMKV_ASSIGN_OR_RETURN(size_t free_bytes, device_free_memory());
    staging_blocks = std::min(staging_blocks, free_bytes / 10 * 8 / staging_block_bytes);
  }
  if (host_blocks == 0 || staging_blocks == 0) {
    return error("CUDA model: the KV tier has no room (host pool ", options.host_bytes, " bytes, GPU KV budget ",
                 gpu_kv_bytes, " bytes: a block of 64 tokens takes ", per_token_all_layers * kCudaBlockTokens,
                 " bytes of host memory, ", 2 * kv_block_bytes, " of GPU memory)");
  }
  const HostKvTierShape shape{int(c.num_layers), int(c.num_kv_heads), int(c.head_dim), int(c.hidden_size), dtype_,
                              max_sequences_, blocks_per_sequence, max_step_tokens_,
                              int(std::min<size_t>(host_blocks, 1u << 30)), int(std::min<size_t>(staging_blocks, 1u << 30)),
                              options.recompute, options.micro_batches};
  SLIMKV_ASSIGN_OR_RETURN(tier_, CudaHostKvTier::create(shape, sealer));
  tier_options_ = options;
  kvpr_cost_ = cuda::kvpr_cost_model(c, dtype_, tier_->kv_bytes_per_token(), options.link_bytes_per_s,
                                     options.gemm_flops_per_s);
  if (options.recompute) {
    const size_t rows = kRecomputeChunkRows, kv = size_t(c.kv_dim());
    SLIMKV_ASSIGN_OR_RETURN(recompute_projected_, DeviceArray<float>::allocate(rows * 2 * kv, "recomputed projections"));
    SLIMKV_ASSIGN_OR_RETURN(recompute_k_, DeviceArray<uint16_t>::allocate(rows * kv, "recomputed keys"));
    SLIMKV_ASSIGN_OR_RETURN(recompute_v_, DeviceArray<uint16_t>::allocate(rows * kv, "recomputed values"));
  }
  return Status::ok();
}

Expected<std::unique_ptr<CudaLlamaModel>> CudaLlamaModel::upload(const ModelConfig& config, const LlamaWeights& weights,
                                                                 const CudaModelOptions& options) {
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
    SLIMKV_RETURN_IF_ERROR(upload_matrix(w.wo, dtype, l.w_o));
    SLIMKV_RETURN_IF_ERROR(upload_floats(w.mlp_norm, l.mlp_norm));
    SLIMKV_RETURN_IF_ERROR(upload_stacked({&w.w_gate, &w.w_up}, l.w_gate_up));
    SLIMKV_RETURN_IF_ERROR(upload_matrix(w.w_down, dtype, l.w_down));
  }
  SLIMKV_RETURN_IF_ERROR(model->allocate_runtime(options));
  return Expected<std::unique_ptr<CudaLlamaModel>>(std::move(model));
}

Expected<std::unique_ptr<CudaLlamaModel>> CudaLlamaModel::random(const ModelConfig& config, uint64_t seed,
                                                                 const CudaModelOptions& options) {
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
  SLIMKV_RETURN_IF_ERROR(fill(model->embedding_, c.vocab_size, c.hidden_size));
  if (!c.tie_word_embeddings) SLIMKV_RETURN_IF_ERROR(fill(model->lm_head_, c.vocab_size, c.hidden_size));
  SLIMKV_RETURN_IF_ERROR(upload_floats(ones, model->final_norm_));
  for (const LayerOnDevice& l : model->layers_) {
    SLIMKV_RETURN_IF_ERROR(upload_floats(ones, l.attention_norm));
    SLIMKV_RETURN_IF_ERROR(fill(l.w_qkv, c.q_dim() + 2 * c.kv_dim(), c.hidden_size));
    if (l.b_qkv != nullptr) {
      SLIMKV_RETURN_IF_ERROR(device_fill_bytes(l.b_qkv, 0, size_t(c.q_dim() + 2 * c.kv_dim()) * 4));
    }
    SLIMKV_RETURN_IF_ERROR(fill(l.w_o, c.hidden_size, c.q_dim()));
    SLIMKV_RETURN_IF_ERROR(upload_floats(ones, l.mlp_norm));
    SLIMKV_RETURN_IF_ERROR(fill(l.w_gate_up, 2 * c.intermediate_size, c.hidden_size));
    SLIMKV_RETURN_IF_ERROR(fill(l.w_down, c.hidden_size, c.intermediate_size));
  }
  SLIMKV_RETURN_IF_ERROR(model->allocate_runtime(options));
  return Expected<std::unique_ptr<CudaLlamaModel>>(std::move(model));
}

size_t CudaLlamaModel::kv_cache_bytes() const {
  if (tier_) return tier_->staging_bytes();
  if (quantized_) return quantized_->bytes();
  const CudaKvShape& s = cache_->shape();
  return size_t(s.num_layers) * size_t(s.num_blocks) * size_t(s.num_kv_heads) * 2 * kCudaBlockTokens * size_t(s.head_dim) * 2;
}

Expected<int> CudaLlamaModel::add_sequence() {
  if (tier_) return tier_->sequences().add_sequence();
  if (quantized_) return quantized_->add_sequence();
  return cache_->sequences().add_sequence();
}

void CudaLlamaModel::remove_sequence(int sequence) {
  if (tier_) return tier_->sequences().remove_sequence(sequence);
  if (quantized_) return quantized_->remove_sequence(sequence);
  cache_->sequences().remove_sequence(sequence);
}

size_t CudaLlamaModel::recompute_bytes() const {
  if (!tier_) return 0;
  return tier_->staging_x_bytes() + recompute_projected_.bytes() + recompute_k_.bytes() + recompute_v_.bytes();
}

// ----------------------------------------------------------------------------------------------
// Steps

Status CudaLlamaModel::check_batch(std::span<const SequenceTokens> batch) const {
  if (batch.empty()) return error("a step of no sequences");
  if (int(batch.size()) > max_sequences_) {
    return error("a step of ", batch.size(), " sequences, over the model's max_sequences ", max_sequences_);
  }
  size_t total = 0, blocks_needed = 0;
  std::vector<bool> seen(size_t(max_sequences_), false);
  std::vector<int> sequences, counts;
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
    blocks_needed += size_t(held().blocks_to_grow(s.sequence, held_tokens + int(s.tokens.size())));
    total += s.tokens.size();
    sequences.push_back(s.sequence);
    counts.push_back(int(s.tokens.size()));
  }
  if (total > size_t(max_step_tokens_)) {
    return error("a step of ", total, " tokens, over the model's max_step_tokens ", max_step_tokens_,
                 " (run long prompts in chunks)");
  }
  if (quantized_) return quantized_->check_step(sequences, counts);
  if (blocks_needed > size_t(held().free_blocks())) {
    return error("the ", tier_ ? "host" : "GPU", " KV cache is full: the step needs ", blocks_needed, " more blocks of ",
                 kCudaBlockTokens, " tokens, ", held().free_blocks(), " are free (of ", held().num_blocks(), ")");
  }
  if (tier_) return tier_->plan_micro_batches(sequences, counts).status();
  return Status::ok();
}

Expected<int> CudaLlamaModel::forward(std::span<const SequenceTokens> batch, bool all_logits) {
  SLIMKV_RETURN_IF_ERROR(check_batch(batch));
  const ModelConfig& c = config_;
  const int hidden = int(c.hidden_size), inter = int(c.intermediate_size);
  const int q_dim = int(c.q_dim()), qkv_rows = int(c.q_dim() + 2 * c.kv_dim());

  // The step's ids in one upload: tokens, positions, and the rows whose logits are wanted.
  PagedAttentionBatch attention_batch;  // also the cache's step: sequence_ids and their query (new token) counts
  std::vector<int32_t> tokens, positions, logit_rows;
  for (const SequenceTokens& s : batch) {
    const int held = num_tokens(s.sequence), n = int(s.tokens.size());
    for (int i = 0; i < n; ++i) {
      if (all_logits || i == n - 1) logit_rows.push_back(int32_t(tokens.size()));
      tokens.push_back(s.tokens[size_t(i)]);
      positions.push_back(held + i);
    }
    attention_batch.sequence_ids.push_back(s.sequence);
    attention_batch.kv_lens.push_back(held + n);
    attention_batch.query_counts.push_back(n);
  }
  const int n = int(tokens.size()), rows = int(logit_rows.size());
  std::vector<int32_t> ids = tokens;
  ids.insert(ids.end(), positions.begin(), positions.end());
  ids.insert(ids.end(), logit_rows.begin(), logit_rows.end());
  SLIMKV_RETURN_IF_ERROR(step_ints_.upload(ids.data(), ids.size()));
  const int32_t* token_ids = step_ints_.data();
  const int32_t* token_positions = token_ids + n;
  const int32_t* rows_wanted = token_positions + n;
  SLIMKV_RETURN_IF_ERROR(begin_kv_step(attention_batch));

  const float eps = float(c.rms_norm_eps);
  const AttentionHeads heads{int(c.num_heads), int(c.num_kv_heads), int(c.head_dim)};
  // o_proj reads the FP16 attention output; a BF16 model's gets a BF16 copy.
  void* attention_output_in_dtype = dtype_ == DType::kF16 ? static_cast<void*>(attended_.data()) : h_.data();

  SLIMKV_RETURN_IF_ERROR(embed(token_ids, n, embedding_, dtype_, hidden, x_.data()));
  for (int l = 0; l < int(c.num_layers); ++l) {
    const LayerOnDevice& w = layers_[size_t(l)];
    SLIMKV_RETURN_IF_ERROR(rmsnorm(x_.data(), w.attention_norm, eps, n, hidden, h_.data(), dtype_));
    if (tier_) SLIMKV_RETURN_IF_ERROR(tier_->store_x(l, h_.data()));
    SLIMKV_RETURN_IF_ERROR(gemm_->multiply(h_.data(), n, w.w_qkv, dtype_, qkv_rows, hidden, projected_.data()));
    SLIMKV_RETURN_IF_ERROR(attention_inputs(projected_.data(), n, heads, w.b_qkv, token_positions, inv_freq_,
                                            rotate_heads_, q_.data(), k_.data(), v_.data()));
    SLIMKV_RETURN_IF_ERROR(attend(l));
    if (rotate_heads_) SLIMKV_RETURN_IF_ERROR(rotate_heads(attended_.data(), size_t(n) * c.num_heads, int(c.head_dim)));
    if (dtype_ != DType::kF16) {
      SLIMKV_RETURN_IF_ERROR(
          convert_half(attended_.data(), DType::kF16, size_t(n) * q_dim, attention_output_in_dtype, dtype_));
    }
    SLIMKV_RETURN_IF_ERROR(
        gemm_->multiply(attention_output_in_dtype, n, w.w_o, dtype_, hidden, q_dim, x_.data(), /*accumulate=*/true));

    SLIMKV_RETURN_IF_ERROR(rmsnorm(x_.data(), w.mlp_norm, eps, n, hidden, h_.data(), dtype_));
    SLIMKV_RETURN_IF_ERROR(gemm_->multiply(h_.data(), n, w.w_gate_up, dtype_, 2 * inter, hidden, projected_.data()));
    SLIMKV_RETURN_IF_ERROR(swiglu(projected_.data(), n, inter, h_.data(), dtype_));
    SLIMKV_RETURN_IF_ERROR(
        gemm_->multiply(h_.data(), n, w.w_down, dtype_, hidden, inter, x_.data(), /*accumulate=*/true));
  }
  SLIMKV_RETURN_IF_ERROR(rmsnorm(x_.data(), final_norm_, eps, rows, hidden, h_.data(), dtype_, rows_wanted));
  SLIMKV_RETURN_IF_ERROR(gemm_->multiply(h_.data(), rows, lm_head_, dtype_, c.vocab_size, hidden, logits_.data()));
  return rows;
}

Status CudaLlamaModel::begin_kv_step(const PagedAttentionBatch& batch) {
  if (!tier_) {
    SLIMKV_RETURN_IF_ERROR(begin_resident_step(batch.sequence_ids, batch.query_counts));
    return attention_[0]->plan(batch);
  }
  // KVPR's split: the cost model's (Eq. 10 over the step's held tokens, which it treats as one batch),
  // or the one asked for.
  last_recompute_fraction_ = 0;
  if (tier_options_->recompute) {
    if (tier_options_->split >= 0) {
      last_recompute_fraction_ = tier_options_->split;
    } else {
      long held_tokens = 0;
      for (size_t i = 0; i < batch.kv_lens.size(); ++i) held_tokens += batch.kv_lens[i] - batch.query_counts[i];
      if (held_tokens > 0) last_recompute_fraction_ = double(kvpr_cost_.best_split(held_tokens)) / double(held_tokens);
    }
  }
  SLIMKV_RETURN_IF_ERROR(tier_->begin_step(batch.sequence_ids, batch.query_counts, last_recompute_fraction_));
  // One attention plan per micro-batch; its sequences are named by step index (the tier's tables).
  const std::vector<MicroBatch>& micro_batches = tier_->micro_batches();
  while (attention_.size() < micro_batches.size()) {
    SLIMKV_ASSIGN_OR_RETURN(auto attention, CudaPagedAttention::create(attention_[0]->shape()));
    attention_.push_back(std::move(attention));
  }
  for (size_t m = 0; m < micro_batches.size(); ++m) {
    const MicroBatch& mb = micro_batches[m];
    PagedAttentionBatch part;
    for (int i = mb.first_sequence; i < mb.first_sequence + mb.num_sequences; ++i) {
      part.sequence_ids.push_back(i);
      part.kv_lens.push_back(batch.kv_lens[size_t(i)]);
      part.query_counts.push_back(batch.query_counts[size_t(i)]);
    }
    SLIMKV_RETURN_IF_ERROR(attention_[m]->plan(part));
  }
  return Status::ok();
}

Status CudaLlamaModel::attend(int layer) {
  const float scale = 1.0f / std::sqrt(float(config_.head_dim));
  if (!tier_) {
    SLIMKV_RETURN_IF_ERROR(append_kv(layer));
    if (quantized_) {
      return attention_[0]->run_quantized(quantized_->view(layer), quantized_->sealed_view(layer), q_.data(), scale,
                                          attended_.data());
    }
    return attention_[0]->run(cache_->view(layer), q_.data(), scale, attended_.data());
  }
  // The tier's units of this layer, one per micro-batch: the next unit's copies go out first, so the
  // link stays busy while this one recomputes and attends.
  const std::vector<MicroBatch>& micro_batches = tier_->micro_batches();
  const size_t q_width = size_t(config_.q_dim());
  for (size_t m = 0; m < micro_batches.size(); ++m) {
    const int unit = layer * int(micro_batches.size()) + int(m);
    if (unit + 1 < tier_->num_units()) SLIMKV_RETURN_IF_ERROR(tier_->prefetch(unit + 1));
    SLIMKV_RETURN_IF_ERROR(recompute_kv(unit, layers_[size_t(layer)]));
    SLIMKV_RETURN_IF_ERROR(tier_->append(unit, k_.data(), v_.data()));
    const size_t first = size_t(micro_batches[m].first_query) * q_width;
    const uint16_t* q = q_.data() + first;
    uint16_t* out = attended_.data() + first;
    if (tier_->attends_sealed()) {
      SLIMKV_RETURN_IF_ERROR(attention_[m]->run_quantized(tier_->view(unit), tier_->sealed_view(unit), q, scale, out));
    } else {
      SLIMKV_RETURN_IF_ERROR(attention_[m]->run(tier_->view(unit), q, scale, out));
    }
    SLIMKV_RETURN_IF_ERROR(tier_->release(unit));
  }
  return Status::ok();
}

Status CudaLlamaModel::recompute_kv(int unit, const LayerOnDevice& w) {
  SLIMKV_ASSIGN_OR_RETURN(RecomputeRows rows, tier_->recompute_rows(unit));
  const ModelConfig& c = config_;
  const size_t half = dtype_size_bytes(dtype_), hidden = size_t(c.hidden_size), q_dim = size_t(c.q_dim());
  // W_k and W_v are the rows of W_qkv after W_q's; their biases follow likewise.
  const void* w_kv = static_cast<const uint8_t*>(w.w_qkv) + q_dim * hidden * half;
  const float* b_kv = w.b_qkv != nullptr ? w.b_qkv + q_dim : nullptr;
  const AttentionHeads kv_heads{0, int(c.num_kv_heads), int(c.head_dim)};
  for (int first = 0; first < rows.rows; first += kRecomputeChunkRows) {
    const int n = std::min(kRecomputeChunkRows, rows.rows - first);
    SLIMKV_RETURN_IF_ERROR(gemm_->multiply(static_cast<const uint8_t*>(rows.x) + size_t(first) * hidden * half, n, w_kv,
                                           dtype_, 2 * c.kv_dim(), c.hidden_size, recompute_projected_.data()));
    SLIMKV_RETURN_IF_ERROR(attention_inputs(recompute_projected_.data(), n, kv_heads, b_kv, rows.positions + first,
                                            inv_freq_, rotate_heads_, nullptr, recompute_k_.data(), recompute_v_.data()));
    SLIMKV_RETURN_IF_ERROR(tier_->write_recomputed(unit, recompute_k_.data(), recompute_v_.data(), rows.slots + first, n));
  }
  return tier_->seal_recomputed(unit);
}

Status CudaLlamaModel::begin_resident_step(const std::vector<int>& sequences, const std::vector<int>& counts) {
  return quantized_ ? quantized_->begin_step(sequences, counts) : cache_->begin_step(sequences, counts);
}

Status CudaLlamaModel::append_kv(int layer) {
  return quantized_ ? quantized_->append(layer, k_.data(), v_.data()) : cache_->append(layer, k_.data(), v_.data());
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
  const size_t kv_width = size_t(config_.kv_dim()), hidden = size_t(config_.hidden_size);
  for (int done = 0; done < tokens;) {
    const int n = std::min(tokens - done, max_step_tokens_);
    const std::vector<int> sequences = {sequence}, counts = {n};
    if (tier_) {
      SLIMKV_RETURN_IF_ERROR(tier_->begin_step(sequences, counts, 0, /*stage=*/false));
    } else {
      SLIMKV_RETURN_IF_ERROR(begin_resident_step(sequences, counts));
    }
    for (int l = 0; l < int(config_.num_layers); ++l) {
      const uint64_t stream = seed + 0x9e3779b97f4a7c15ull * uint64_t(1 + 2 * (size_t(done) * 997 + size_t(l)));
      SLIMKV_RETURN_IF_ERROR(fill_random_fp16(k_.data(), size_t(n) * kv_width, stream, 1.732f));
      SLIMKV_RETURN_IF_ERROR(fill_random_fp16(v_.data(), size_t(n) * kv_width, stream + 1, 1.732f));
      if (!tier_) {
        SLIMKV_RETURN_IF_ERROR(append_kv(l));
        continue;
      }
      // The tier keeps X too (kvpr): random rows of the same bytes, which recomputation reads.
      SLIMKV_RETURN_IF_ERROR(fill_random_fp16(h_.data(), size_t(n) * hidden, stream + 2, 1.0f));
      SLIMKV_RETURN_IF_ERROR(tier_->store_x(l, h_.data()));
      SLIMKV_RETURN_IF_ERROR(tier_->store_kv(l, k_.data(), v_.data()));
    }
    done += n;
  }
  return Status::ok();
}

Status CudaLlamaModel::step(std::span<const SequenceTokens> batch, bool all_logits, std::vector<float>& logits) {
  SLIMKV_ASSIGN_OR_RETURN(int rows, forward(batch, all_logits));
  logits.resize(size_t(rows) * size_t(config_.vocab_size));
  return logits_.download(logits.data(), logits.size());
}

Status CudaLlamaModel::step_sample(std::span<const SequenceTokens> batch, std::span<const RowSampling> sampling,
                                   std::vector<int32_t>& next_tokens) {
  if (!sampling.empty() && sampling.size() != batch.size()) {
    return error("sampling settings for ", sampling.size(), " sequences in a step of ", batch.size());
  }
  SLIMKV_ASSIGN_OR_RETURN(int rows, forward(batch, /*all_logits=*/false));
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

}  // namespace slimkv::cuda
