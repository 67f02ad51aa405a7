#include "model/cuda/llama_cuda.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cpu/vec_ops.h"
#include "backend/cuda/expert_routing.h"
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

// What the GPU's kernels cannot hold of the model's shape: heads over 256 dims, more experts than the
// routing kernel holds; and a softmax scale never set (a config made by hand without attention_scale).
Status check_shape(const ModelConfig& c) {
  if (!(c.attention_scale > 0)) {
    return error(c.architecture_name, ": attention_scale ", c.attention_scale, " (expected 1/sqrt(head_dim) or the "
                 "family's; parse_model_config sets it)");
  }
  if (c.moe.num_experts > kMaxRoutedExperts) {
    return error(c.architecture_name, ": ", c.moe.num_experts, " experts do not run on device cuda yet (its routing "
                 "kernel holds at most ", kMaxRoutedExperts, "): use --device cpu");
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

GateActivation gate_activation(const ModelConfig& c) {
  return c.activation == Activation::kGeluTanh ? GateActivation::kGeluTanh : GateActivation::kSilu;
}

// FP16 when every matrix fits its range (FP16 keeps 10 mantissa bits to BF16's 7, and a BF16 weight
// in FP16's normal range converts exactly), else BF16. Measured on the HF golden models: BF16
// activations put logits 2.5e-2 of max |logit| from transformers' FP32 ones, FP16 ones 3e-3.
constexpr float kFp16Max = 65504.0f;

DType upload_dtype(const LlamaWeights& weights) {
  std::vector<const WeightMatrix*> matrices = {&weights.embedding, &weights.lm_head};
  for (const LayerWeights& l : weights.layers) {
    for (const WeightMatrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.mlp.gate, &l.mlp.up, &l.mlp.down, &l.router}) {
      matrices.push_back(w);
    }
    for (const MlpWeights& expert : l.experts) {
      for (const WeightMatrix* w : {&expert.gate, &expert.up, &expert.down}) matrices.push_back(w);
    }
  }
  for (const WeightMatrix* w : matrices) {
    if (w->dtype == DType::kF16 || w->data == nullptr) continue;  // no data: a sparse layer's dense MLP, a dense one's router
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

// ----------------------------------------------------------------------------------------------
// The kind each matrix is kept in

constexpr BlockQuant kPlain = BlockQuant::kNone;

// Every matrix of the model's shape with its name and kind, for the shape checks: f(name, kind, rows, cols).
template <typename Kinds, typename F>
Status for_each_matrix(const ModelConfig& c, int64_t o_cols, const Kinds& kinds, F&& f) {
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size;
  SLIMKV_RETURN_IF_ERROR(f("token_embd (the embedding)", kinds.embedding, c.vocab_size, hidden));
  if (!c.tie_word_embeddings) SLIMKV_RETURN_IF_ERROR(f("output (the lm_head)", kinds.lm_head, c.vocab_size, hidden));
  for (size_t i = 0; i < kinds.layers.size(); ++i) {
    const auto& k = kinds.layers[i];
    const std::string layer = "layer " + std::to_string(i) + " ";
    SLIMKV_RETURN_IF_ERROR(f(layer + "attn_q (W_q)", k.q, c.q_dim(), hidden));
    SLIMKV_RETURN_IF_ERROR(f(layer + "attn_k (W_k)", k.k, c.kv_dim(), hidden));
    SLIMKV_RETURN_IF_ERROR(f(layer + "attn_v (W_v)", k.v, c.kv_dim(), hidden));
    SLIMKV_RETURN_IF_ERROR(f(layer + "attn_output (W_o)", k.o, hidden, o_cols));
    if (c.is_sparse(int64_t(i))) {  // every expert's matrices alike: one kind and shape for all
      const int64_t expert_inter = c.moe.expert_intermediate_size;
      SLIMKV_RETURN_IF_ERROR(f(layer + "ffn_gate_inp (the router)", k.router, c.moe.num_experts, hidden));
      SLIMKV_RETURN_IF_ERROR(f(layer + "ffn_gate_exps (the experts' W_gate)", k.gate, expert_inter, hidden));
      SLIMKV_RETURN_IF_ERROR(f(layer + "ffn_up_exps (the experts' W_up)", k.up, expert_inter, hidden));
      SLIMKV_RETURN_IF_ERROR(f(layer + "ffn_down_exps (the experts' W_down)", k.down, hidden, expert_inter));
      continue;
    }
    SLIMKV_RETURN_IF_ERROR(f(layer + "ffn_gate (W_gate)", k.gate, inter, hidden));
    SLIMKV_RETURN_IF_ERROR(f(layer + "ffn_up (W_up)", k.up, inter, hidden));
    SLIMKV_RETURN_IF_ERROR(f(layer + "ffn_down (W_down)", k.down, hidden, inter));
  }
  return Status::ok();
}

// Whether every matrix kept in blocks has rows of whole blocks (the GPU's kernels read whole blocks);
// the error names the first that has not.
template <typename Kinds>
Status check_block_shapes(const ModelConfig& c, int64_t o_cols, const Kinds& kinds) {
  return for_each_matrix(c, o_cols, kinds, [](const std::string& name, BlockQuant kind, int64_t rows, int64_t cols) {
    return check_quantized_shape(name, kind, rows, cols);
  });
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// The weight arena

Status CudaLlamaModel::WeightArena::reserve() {
  SLIMKV_ASSIGN_OR_RETURN(memory_, DeviceArray<uint8_t>::allocate(used_, "the model's weights"));
  used_ = 0;
  return Status::ok();
}

void* CudaLlamaModel::WeightArena::take(size_t bytes) {
  void* at = memory_.size() > 0 ? static_cast<void*>(memory_.data() + used_) : nullptr;
  used_ += aligned(bytes);
  return at;
}

CudaLlamaModel::StackedMatrix CudaLlamaModel::StackedMatrix::row_range(int64_t first, int64_t count) const {
  StackedMatrix part;
  part.rows = count;
  int64_t run_first = 0;
  for (const DeviceMatrix& run : runs) {
    const int64_t from = std::max(first, run_first), to = std::min(first + count, run_first + run.rows);
    if (from < to) part.runs.push_back(run.row_range(from - run_first, to - from));
    run_first += run.rows;
  }
  return part;
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
      embedding_scale_(config.embedding_scale()),
      grouped_experts_(options.grouped_experts) {}

CudaLlamaModel::~CudaLlamaModel() = default;

Status CudaLlamaModel::allocate_weights(const WeightKinds& kinds) {
  lay_out_weights(kinds);  // counting
  SLIMKV_RETURN_IF_ERROR(weights_.reserve().with_context("uploading the model to the GPU"));
  lay_out_weights(kinds);
  SLIMKV_RETURN_IF_ERROR(index_experts());
  const ModelConfig& c = config_;
  SLIMKV_RETURN_IF_ERROR(upload_floats(Rope(c.rope, int(c.head_dim)).inverse_frequencies(), inv_freq_));
  if (sliding_inv_freq_ == nullptr) return Status::ok();
  return upload_floats(Rope(c.sliding_rope, int(c.head_dim)).inverse_frequencies(), sliding_inv_freq_);
}

void CudaLlamaModel::lay_out_weights(const WeightKinds& kinds) {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size, head_dim = c.head_dim;
  const int64_t qkv_rows = c.q_dim() + 2 * c.kv_dim(), o_cols = int64_t(c.num_heads) * attention_dim_;
  largest_quantized_values_ = 0;
  block_types_.clear();
  plain_matrices_ = false;
  embedding_ = take_stacked({{c.vocab_size, kinds.embedding}}, hidden).runs.front();
  lm_head_ = c.tie_word_embeddings ? embedding_ : take_stacked({{c.vocab_size, kinds.lm_head}}, hidden).runs.front();
  const auto floats = [&](bool used, int64_t count) {
    return used ? static_cast<float*>(weights_.take(size_t(count) * 4)) : nullptr;
  };
  final_norm_ = floats(true, hidden);
  inv_freq_ = floats(true, head_dim / 2);
  sliding_inv_freq_ = floats(!c.sliding_layers.empty(), head_dim / 2);
  layers_.assign(size_t(c.num_layers), LayerOnDevice());
  const auto take_mlp = [&](const LayerKinds& k, int64_t intermediate) {
    return MlpOnDevice{take_stacked({{intermediate, k.gate}, {intermediate, k.up}}, hidden),
                       take_stacked({{hidden, k.down}}, intermediate)};
  };
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerKinds& k = kinds.layers[i];
    LayerOnDevice& l = layers_[i];
    l.attention_norm = floats(true, hidden);
    l.w_qkv = take_stacked({{c.q_dim(), k.q}, {c.kv_dim(), k.k}, {c.kv_dim(), k.v}}, hidden);
    l.b_qkv = floats(c.attention_bias, qkv_rows);
    l.q_norm = floats(c.qk_norm, head_dim);
    l.k_norm = floats(c.qk_norm, head_dim);
    l.w_o = take_stacked({{hidden, k.o}}, o_cols);
    l.attention_out_norm = floats(c.sandwich_norms, hidden);
    l.mlp_norm = floats(true, hidden);
    l.mlp_out_norm = floats(c.sandwich_norms, hidden);
    if (!c.is_sparse(int64_t(i))) {
      l.mlp = take_mlp(k, inter);
      continue;
    }
    l.router = take_stacked({{c.moe.num_experts, k.router}}, hidden);
    l.experts.resize(size_t(c.moe.num_experts));
    for (MlpOnDevice& expert : l.experts) expert = take_mlp(k, c.moe.expert_intermediate_size);
  }
}

Status CudaLlamaModel::index_experts() {
  for (size_t i = 0; i < layers_.size(); ++i) {
    LayerOnDevice& l = layers_[i];
    if (l.experts.empty()) continue;
    // Run r of matrix `which` of every expert, as expert 0's moved on by a stride (take_stacked lays each
    // expert out as the one before: the check guards that).
    const auto index = [&](auto which, std::vector<ExpertMatrices>& runs) -> Status {
      runs.clear();
      for (size_t r = 0; r < (l.experts.front().*which).runs.size(); ++r) {
        const auto run_of = [&](size_t e) { return (l.experts[e].*which).runs[r]; };
        ExpertMatrices m{run_of(0), 0, int(l.experts.size())};
        if (l.experts.size() > 1) {
          m.stride_bytes = size_t(static_cast<uint8_t*>(run_of(1).data) - static_cast<uint8_t*>(m.first.data));
        }
        for (size_t e = 0; e < l.experts.size(); ++e) {
          const DeviceMatrix want = m.expert(int(e)), got = run_of(e);
          if (got.data != want.data || got.scales != want.scales || got.quant != want.quant || got.rows != want.rows) {
            return error("layer ", i, " expert ", e, ": its matrices are not laid out as expert 0's (internal)");
          }
        }
        grouped_experts_ = grouped_experts_ && check_grouped_expert_shape(m).is_ok();
        runs.push_back(m);
      }
      return Status::ok();
    };
    SLIMKV_RETURN_IF_ERROR(index(&MlpOnDevice::w_gate_up, l.experts_gate_up));
    std::vector<ExpertMatrices> down;  // one run: W_down is one part
    SLIMKV_RETURN_IF_ERROR(index(&MlpOnDevice::w_down, down));
    l.experts_down = down.front();
  }
  return Status::ok();
}

CudaLlamaModel::StackedMatrix CudaLlamaModel::take_stacked(std::initializer_list<std::pair<int64_t, BlockQuant>> parts,
                                                           int64_t cols) {
  StackedMatrix m;
  for (const auto& [rows, kind] : parts) {
    if (m.runs.empty() || m.runs.back().quant != kind) {
      DeviceMatrix run;
      run.dtype = dtype_;
      run.quant = kind;
      run.cols = cols;
      m.runs.push_back(run);
    }
    m.runs.back().rows += rows;
    m.rows += rows;
  }
  for (DeviceMatrix& run : m.runs) {
    if (!run.quantized()) {
      plain_matrices_ = true;
      run.data = weights_.take(size_t(run.rows) * size_t(cols) * dtype_size_bytes(dtype_));
      continue;
    }
    largest_quantized_values_ = std::max(largest_quantized_values_, size_t(run.rows) * size_t(cols));
    if (std::find(block_types_.begin(), block_types_.end(), run.quant) == block_types_.end()) {
      block_types_.push_back(run.quant);
    }
    void* at = weights_.take(quantized_matrix_bytes(run.quant, run.rows, cols));
    if (at != nullptr) run = quantized_matrix_at(at, run.quant, run.rows, cols);  // nullptr: the counting pass
  }
  return m;
}

namespace {

// product(run, y at its first column) for every run of a stacked matrix, whose columns of y they write.
template <typename Stacked, typename Product>
Status for_each_run(const Stacked& w, float* y, const Product& product) {
  int64_t first = 0;
  for (const DeviceMatrix& run : w.runs) {
    SLIMKV_RETURN_IF_ERROR(product(run, y + first));
    first += run.rows;
  }
  return Status::ok();
}

}  // namespace

Status CudaLlamaModel::multiply(const void* x, int n, const StackedMatrix& w, float* y, bool accumulate) {
  return for_each_run(w, y, [&](const DeviceMatrix& run, float* out) {
    return gemm_->multiply(x, n, dtype_, run, out, accumulate, w.rows);
  });
}

Status CudaLlamaModel::multiply_items(const void* x, const std::vector<int>& items, const StackedMatrix& w, float* y,
                                      bool accumulate, PlainItems plain) {
  return for_each_run(w, y, [&](const DeviceMatrix& run, float* out) {
    return item_products_->multiply(*gemm_, x, items, dtype_, run, out, accumulate, w.rows, plain);
  });
}

std::string CudaLlamaModel::weight_description() const {
  std::string kinds;
  for (BlockQuant quant : block_types_) kinds += std::string(kinds.empty() ? "" : "+") + std::string(block_quant_name(quant));
  if (plain_matrices_) kinds += std::string(kinds.empty() ? "" : "+") + (dtype_ == DType::kBF16 ? "BF16" : "FP16");
  return kinds;
}

Expected<RandomWeights> parse_random_weights(std::string_view name) {
  if (name == "f16") return RandomWeights::kF16;
  if (name == "q8_0") return RandomWeights::kQ8_0;
  if (name == "q4_0") return RandomWeights::kQ4_0;
  if (name == "q4_k_m") return RandomWeights::kQ4_K_M;
  return error("random weights '", name, "': expected f16, q8_0, q4_0 or q4_k_m");
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
  // Prefill of quantized weights dequantizes tiles of rows into a scratch: up to 64 MB (an 8B model's
  // widest matrix in 16 tiles), none where no step runs past the matrix-vector kernel.
  const size_t tile_scratch = max_step_tokens_ > kQuantizedGemvMaxInputs
                                  ? std::min<size_t>(size_t(64) << 20, largest_quantized_values_ * 2)
                                  : 0;
  SLIMKV_ASSIGN_OR_RETURN(gemm_, WeightGemm::create(tile_scratch));
  const size_t widest_output = std::max({qkv, 2 * inter, size_t(c.hidden_size), size_t(c.vocab_size), size_t(c.moe.num_experts)});
  SLIMKV_ASSIGN_OR_RETURN(item_products_, ItemProducts::create(widest_input, widest_output));
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
  if (c.moe.num_experts > 0) {
    const size_t experts = size_t(c.moe.num_experts), choices = T * size_t(c.moe.experts_per_token);
    const size_t hidden = size_t(c.hidden_size), expert_inter = size_t(c.moe.expert_intermediate_size);
    SLIMKV_ASSIGN_OR_RETURN(router_logits_, DeviceArray<float>::allocate(T * experts, "router logits"));
    SLIMKV_ASSIGN_OR_RETURN(expert_of_, DeviceArray<int32_t>::allocate(choices, "routed experts"));
    SLIMKV_ASSIGN_OR_RETURN(expert_weight_, DeviceArray<float>::allocate(choices, "routed experts' weights"));
    SLIMKV_ASSIGN_OR_RETURN(expert_plan_, DeviceArray<int32_t>::allocate(expert_plan_values(int(choices), int(experts)),
                                                                         "the experts' rows"));
    SLIMKV_RETURN_IF_ERROR(device_fill_bytes(expert_plan_.data(), 0, expert_plan_.bytes()));  // the routing's count
    SLIMKV_ASSIGN_OR_RETURN(expert_sum_counts_, DeviceArray<uint32_t>::allocate(
                                                    size_t(grouped_sum_counters(int64_t(hidden))), "the experts' sums"));
    SLIMKV_RETURN_IF_ERROR(device_fill_bytes(expert_sum_counts_.data(), 0, expert_sum_counts_.bytes()));
    SLIMKV_ASSIGN_OR_RETURN(expert_inputs_,
                            DeviceArray<uint16_t>::allocate(choices * std::max(hidden, expert_inter), "expert inputs"));
    SLIMKV_ASSIGN_OR_RETURN(expert_products_, DeviceArray<float>::allocate(choices * std::max(2 * expert_inter, hidden),
                                                                          "expert products"));
  }
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
  SLIMKV_RETURN_IF_ERROR(check_shape(config));
  SLIMKV_RETURN_IF_ERROR(device_usable());
  std::unique_ptr<CudaLlamaModel> model(new CudaLlamaModel(config, upload_dtype(weights), options));
  const bool padded_heads = model->attention_dim_ != config.head_dim;
  // Each matrix as stored: quantized GGUF matrices in their blocks (unless the options widen them),
  // the rest in dtype_. Widened all the same: W_o of padded heads, which gains zero columns between
  // heads that blocks along a row cannot hold. (ZACK's folded W_V and W_O arrive as F32 matrices,
  // engine/cuda/cuda_device_model.cc, so they are plain already.)
  const auto kept = [&](const WeightMatrix& w) { return options.widen_quantized_weights ? kPlain : w.quant; };
  WeightKinds kinds{kept(weights.embedding), kept(weights.lm_head), {}};
  for (size_t i = 0; i < weights.layers.size(); ++i) {
    const LayerWeights& w = weights.layers[i];
    // A sparse layer's experts are held in the kinds of its first (a GGUF file's are one stacked tensor).
    const MlpWeights& mlp = config.is_sparse(int64_t(i)) ? w.experts.front() : w.mlp;
    kinds.layers.push_back({kept(w.wq), kept(w.wk), kept(w.wv), padded_heads ? kPlain : kept(w.wo), kept(mlp.gate),
                            kept(mlp.up), kept(mlp.down), kept(w.router)});
    for (size_t e = 1; e < w.experts.size(); ++e) {
      const MlpWeights& expert = w.experts[e];
      if (kept(expert.gate) != kept(mlp.gate) || kept(expert.up) != kept(mlp.up) || kept(expert.down) != kept(mlp.down)) {
        return error("layer ", i, " expert ", e, ": gate/up/down ", block_quant_name(expert.gate.quant), "/",
                     block_quant_name(expert.up.quant), "/", block_quant_name(expert.down.quant), " unlike expert 0's ",
                     block_quant_name(mlp.gate.quant), "/", block_quant_name(mlp.up.quant), "/",
                     block_quant_name(mlp.down.quant), " (device cuda holds a layer's experts in one kind)");
      }
    }
  }
  SLIMKV_RETURN_IF_ERROR(check_block_shapes(config, int64_t(config.num_heads) * model->attention_dim_, kinds));
  SLIMKV_RETURN_IF_ERROR(model->allocate_weights(kinds));
  const DType dtype = model->dtype_;
  const auto upload_one = [&](const WeightMatrix& w, const DeviceMatrix& to) {
    return to.quantized() ? upload_quantized(w.data, to) : upload_matrix(w, dtype, to.data);
  };
  // Stacked matrices: each part into its rows (a part never straddles two runs: runs join whole parts).
  const auto upload_stacked = [&](std::initializer_list<const WeightMatrix*> parts, const StackedMatrix& to) -> Status {
    int64_t first = 0;
    for (const WeightMatrix* w : parts) {
      SLIMKV_RETURN_IF_ERROR(upload_one(*w, to.row_range(first, w->rows).runs.front()));
      first += w->rows;
    }
    return Status::ok();
  };
  SLIMKV_RETURN_IF_ERROR(upload_one(weights.embedding, model->embedding_));
  if (!config.tie_word_embeddings) SLIMKV_RETURN_IF_ERROR(upload_one(weights.lm_head, model->lm_head_));
  SLIMKV_RETURN_IF_ERROR(upload_floats(weights.final_norm, model->final_norm_));
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
    if (l.w_o.runs.front().quantized()) {
      SLIMKV_RETURN_IF_ERROR(upload_one(w.wo, l.w_o.runs.front()));
    } else {
      SLIMKV_RETURN_IF_ERROR(upload_padded_columns(w.wo, dtype, int(config.num_heads), int(config.head_dim),
                                                   model->attention_dim_, l.w_o.runs.front().data));
    }
    if (l.attention_out_norm != nullptr) {
      SLIMKV_RETURN_IF_ERROR(upload_floats(w.attention_out_norm, l.attention_out_norm));
      SLIMKV_RETURN_IF_ERROR(upload_floats(w.mlp_out_norm, l.mlp_out_norm));
    }
    SLIMKV_RETURN_IF_ERROR(upload_floats(w.mlp_norm, l.mlp_norm));
    const auto upload_mlp = [&](const MlpWeights& from, const MlpOnDevice& to) -> Status {
      SLIMKV_RETURN_IF_ERROR(upload_stacked({&from.gate, &from.up}, to.w_gate_up));
      return upload_one(from.down, to.w_down.runs.front());
    };
    if (l.experts.empty()) {
      SLIMKV_RETURN_IF_ERROR(upload_mlp(w.mlp, l.mlp));
      continue;
    }
    SLIMKV_RETURN_IF_ERROR(upload_one(w.router, l.router.runs.front()));
    for (size_t e = 0; e < l.experts.size(); ++e) SLIMKV_RETURN_IF_ERROR(upload_mlp(w.experts[e], l.experts[e]));
  }
  SLIMKV_RETURN_IF_ERROR(model->allocate_runtime(options));
  return Expected<std::unique_ptr<CudaLlamaModel>>(std::move(model));
}

Expected<std::unique_ptr<CudaLlamaModel>> CudaLlamaModel::random(const ModelConfig& config, uint64_t seed,
                                                                 const CudaModelOptions& options, RandomWeights weights) {
  SLIMKV_RETURN_IF_ERROR(check_shape(config));
  SLIMKV_RETURN_IF_ERROR(device_usable());
  std::unique_ptr<CudaLlamaModel> model(new CudaLlamaModel(config, DType::kF16, options));
  // One block type throughout, or Q4_K_M's mix: Q6_K where llama.cpp spends more bits (W_v, W_down,
  // the lm_head). W_o of padded heads stays FP16 (as upload() keeps it), and the routers of sparse layers
  // (as llama.cpp's quantizer leaves them).
  const BlockQuant most = weights == RandomWeights::kQ8_0     ? BlockQuant::kQ8_0
                          : weights == RandomWeights::kQ4_0   ? BlockQuant::kQ4_0
                          : weights == RandomWeights::kQ4_K_M ? BlockQuant::kQ4_K
                                                              : kPlain;
  const BlockQuant more_bits = weights == RandomWeights::kQ4_K_M ? BlockQuant::kQ6_K : most;
  const BlockQuant o = model->attention_dim_ != config.head_dim ? kPlain : most;
  const WeightKinds kinds{
      most, more_bits,
      std::vector<LayerKinds>(size_t(config.num_layers), {most, most, more_bits, o, most, most, more_bits, kPlain})};
  SLIMKV_RETURN_IF_ERROR(check_block_shapes(config, int64_t(config.num_heads) * model->attention_dim_, kinds));
  SLIMKV_RETURN_IF_ERROR(model->allocate_weights(kinds));
  uint64_t matrix = 0;
  // Uniform in ±sqrt(3 / cols) (blocks: about that spread): unit variance over cols products keeps
  // activations in FP16's range.
  const auto fill = [&](const StackedMatrix& w) -> Status {
    for (const DeviceMatrix& run : w.runs) {
      const uint64_t stream = seed + 0x9e3779b97f4a7c15ull * ++matrix;
      const float amplitude = std::sqrt(3.0f / float(run.cols));
      SLIMKV_RETURN_IF_ERROR(run.quantized() ? fill_random_quantized(run, stream, amplitude)
                                             : fill_random_fp16(static_cast<uint16_t*>(run.data),
                                                                size_t(run.rows) * size_t(run.cols), stream, amplitude));
    }
    return Status::ok();
  };
  const ModelConfig& c = config;
  const std::vector<float> ones(size_t(c.hidden_size), 1.0f);
  const std::vector<float> head_ones(size_t(c.head_dim), 1.0f);
  SLIMKV_RETURN_IF_ERROR(fill(StackedMatrix{{model->embedding_}, c.vocab_size}));
  if (!c.tie_word_embeddings) SLIMKV_RETURN_IF_ERROR(fill(StackedMatrix{{model->lm_head_}, c.vocab_size}));
  SLIMKV_RETURN_IF_ERROR(upload_floats(ones, model->final_norm_));
  for (const LayerOnDevice& l : model->layers_) {
    SLIMKV_RETURN_IF_ERROR(upload_floats(ones, l.attention_norm));
    SLIMKV_RETURN_IF_ERROR(fill(l.w_qkv));
    if (l.b_qkv != nullptr) {
      SLIMKV_RETURN_IF_ERROR(device_fill_bytes(l.b_qkv, 0, size_t(c.q_dim() + 2 * c.kv_dim()) * 4));
    }
    for (float* norm : {l.q_norm, l.k_norm}) {
      if (norm != nullptr) SLIMKV_RETURN_IF_ERROR(upload_floats(head_ones, norm));
    }
    // Padded heads: the attention output's padded dims are zero, whatever their columns of W_o hold.
    SLIMKV_RETURN_IF_ERROR(fill(l.w_o));
    for (float* norm : {l.attention_out_norm, l.mlp_out_norm}) {
      if (norm != nullptr) SLIMKV_RETURN_IF_ERROR(upload_floats(ones, norm));
    }
    SLIMKV_RETURN_IF_ERROR(upload_floats(ones, l.mlp_norm));
    const auto fill_mlp = [&](const MlpOnDevice& mlp) -> Status {
      SLIMKV_RETURN_IF_ERROR(fill(mlp.w_gate_up));
      return fill(mlp.w_down);
    };
    SLIMKV_RETURN_IF_ERROR(fill_mlp(l.mlp));  // a sparse layer's has no runs
    SLIMKV_RETURN_IF_ERROR(fill(l.router));   // nor a dense layer's router
    for (const MlpOnDevice& expert : l.experts) SLIMKV_RETURN_IF_ERROR(fill_mlp(expert));
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
                                      std::vector<int64_t>& first_row, const LayerHook& after_attention) {
  SLIMKV_RETURN_IF_ERROR(check_batch(batch));
  const ModelConfig& c = config_;
  const int hidden = int(c.hidden_size), inter = int(c.intermediate_size);
  const int o_cols = int(c.num_heads) * attention_dim_;

  // The step's ids in one upload: tokens, positions, and the rows whose logits are wanted (sampled
  // items' first, so that the sampler reads one run of rows).
  std::vector<int32_t> tokens, positions, logit_rows;
  first_row.assign(batch.size(), -1);
  logit_items_.clear();
  for (const bool sampled : {true, false}) {
    int32_t row = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      const int n = int(batch[i].tokens.size());
      const StepRows w = wanted[i];
      if ((w == StepRows::kSample) == sampled && w != StepRows::kNone) {
        first_row[i] = int64_t(logit_rows.size());
        for (int t = w == StepRows::kAll ? 0 : n - 1; t < n; ++t) logit_rows.push_back(row + t);
        logit_items_.push_back(w == StepRows::kAll ? n : 1);
      }
      row += n;
    }
  }
  step_items_.clear();
  for (const SequenceTokens& s : batch) {
    const int held = num_tokens(s.sequence), n = int(s.tokens.size());
    for (int i = 0; i < n; ++i) {
      tokens.push_back(s.tokens[size_t(i)]);
      positions.push_back(held + i);
    }
    step_items_.push_back(n);
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
  const GateActivation activation = gate_activation(c);
  // o_proj reads the FP16 attention output; a BF16 model's gets a BF16 copy.
  void* attention_output_in_dtype = dtype_ == DType::kF16 ? static_cast<void*>(attended_.data()) : h_.data();
  // A sublayer's output, written by `output(y, accumulate)`: added to x where it is written (the GEMM's
  // or the experts' sum adds), or (sandwich norms) normed first, then added.
  const auto add_sublayer = [&](const float* out_norm, const auto& output) -> Status {
    if (out_norm == nullptr) return output(x_.data(), /*accumulate=*/true);
    SLIMKV_RETURN_IF_ERROR(output(projected_.data(), /*accumulate=*/false));
    return add_rmsnorm(projected_.data(), out_norm, eps, n, hidden, x_.data());
  };

  if (embedding_.quantized()) {  // the rows of the tokens dequantized (FP32, as the CPU's lookup widens them)
    SLIMKV_RETURN_IF_ERROR(dequantize_rows(embedding_, token_ids, 0, n, embedding_scale_, x_.data(), DType::kF32));
  } else {
    SLIMKV_RETURN_IF_ERROR(embed(token_ids, n, embedding_.data, dtype_, hidden, embedding_scale_, x_.data()));
  }
  for (int l = 0; l < int(c.num_layers); ++l) {
    const LayerOnDevice& w = layers_[size_t(l)];
    // Attention block: h = rmsnorm(x); q, k, v = rope(qk_norm(project(h))); attend (sliding layers:
    // their window, their RoPE); x += o_proj(o)
    SLIMKV_RETURN_IF_ERROR(rmsnorm(x_.data(), w.attention_norm, eps, n, hidden, h_.data(), dtype_));
    SLIMKV_RETURN_IF_ERROR(kv_->keep_layer_input(l, h_.data()));
    SLIMKV_RETURN_IF_ERROR(multiply_items(h_.data(), step_items_, w.w_qkv, projected_.data()));
    SLIMKV_RETURN_IF_ERROR(attention_inputs(projected_.data(), n, heads, w.b_qkv, {w.q_norm, w.k_norm, eps},
                                            token_positions, c.is_sliding(l) ? sliding_inv_freq_ : inv_freq_,
                                            rotate_heads_, q_.data(), k_.data(), v_.data()));
    SLIMKV_RETURN_IF_ERROR(kv_->attend(l, q_.data(), k_.data(), v_.data(), scale, attended_.data()));
    if (after_attention) SLIMKV_RETURN_IF_ERROR(after_attention(l));
    if (rotate_heads_) SLIMKV_RETURN_IF_ERROR(rotate_heads(attended_.data(), size_t(n) * c.num_heads, attention_dim_));
    if (dtype_ != DType::kF16) {
      SLIMKV_RETURN_IF_ERROR(
          convert_half(attended_.data(), DType::kF16, size_t(n) * o_cols, attention_output_in_dtype, dtype_));
    }
    SLIMKV_RETURN_IF_ERROR(add_sublayer(w.attention_out_norm, [&](float* y, bool accumulate) {
      return multiply_items(attention_output_in_dtype, step_items_, w.w_o, y, accumulate);
    }));

    // MLP block: x += down(act(gate(h)) · up(h)), h = rmsnorm(x); a sparse layer's: its routed experts'
    SLIMKV_RETURN_IF_ERROR(rmsnorm(x_.data(), w.mlp_norm, eps, n, hidden, h_.data(), dtype_));
    if (c.is_sparse(l)) {
      SLIMKV_RETURN_IF_ERROR(add_sublayer(w.mlp_out_norm, [&](float* y, bool accumulate) {
        return add_routed_experts(w, y, accumulate);
      }));
      continue;
    }
    SLIMKV_RETURN_IF_ERROR(multiply_items(h_.data(), step_items_, w.mlp.w_gate_up, projected_.data()));
    SLIMKV_RETURN_IF_ERROR(gated_activation(projected_.data(), n, inter, activation, h_.data(), dtype_));
    SLIMKV_RETURN_IF_ERROR(add_sublayer(w.mlp_out_norm, [&](float* y, bool accumulate) {
      return multiply_items(h_.data(), step_items_, w.mlp.w_down, y, accumulate);
    }));
  }
  if (rows == 0) return 0;
  SLIMKV_RETURN_IF_ERROR(rmsnorm(x_.data(), final_norm_, eps, rows, hidden, h_.data(), dtype_, rows_wanted));
  SLIMKV_RETURN_IF_ERROR(item_products_->multiply(*gemm_, h_.data(), logit_items_, dtype_, lm_head_, logits_.data()));
  if (c.final_logit_softcap > 0) {  // Gemma: logits = cap · tanh(logits / cap)
    SLIMKV_RETURN_IF_ERROR(soft_cap(logits_.data(), size_t(rows) * size_t(c.vocab_size), float(c.final_logit_softcap)));
  }
  return rows;
}

// Items of up to this many rows (decode rows, a short prompt's piece) multiply every expert's rows in one
// grouped launch per matrix, planned on the device: no wait for the routing, a few launches a layer
// whatever the experts chosen. Past it (prefill) an expert's rows are many and cuBLAS's tiles serve them
// better: the plan's offsets come back to the host (one wait a layer, small beside the GEMMs) and each
// expert runs its own GEMMs.
constexpr int kGroupedExpertsMaxRows = 64;

Status CudaLlamaModel::multiply_experts(const void* x, const int32_t* x_rows, const std::vector<ExpertMatrices>& runs,
                                        const ExpertRowsPlan& plan, int slots, float* y) {
  int64_t width = 0, first = 0;
  for (const ExpertMatrices& run : runs) width += run.first.rows;
  for (const ExpertMatrices& run : runs) {
    SLIMKV_RETURN_IF_ERROR(grouped_expert_gemv(x, x_rows, dtype_, run, plan, slots, y + first, width));
    first += run.first.rows;
  }
  return Status::ok();
}

// Each item (a sequence's rows) takes the path it takes alone, so that its output has the bits it has
// alone (issue 22): consecutive items of up to kGroupedExpertsMaxRows rows together through the grouped
// GEMVs, whose product of a row does not depend on the rows beside it (weight_rows.cuh: each input's sums
// in one fixed order, whatever the other inputs; the weighted sum of a row's k outputs in its choices'
// order), the others through each expert's products of each item's rows apart. Routing is a row's own
// (route_to_experts: a warp per row); each run of items on one path is routed and planned by itself.
Status CudaLlamaModel::add_routed_experts(const LayerOnDevice& layer, float* y, bool accumulate) {
  SLIMKV_RETURN_IF_ERROR(multiply_items(h_.data(), step_items_, layer.router, router_logits_.data()));
  const auto on_grouped_gemvs = [&](int rows) { return grouped_experts_ && rows <= kGroupedExpertsMaxRows; };
  int first_row = 0;
  for (size_t i = 0; i < step_items_.size();) {
    const bool grouped = on_grouped_gemvs(step_items_[i]);
    std::vector<int> items;  // a run of consecutive items on one path
    int rows = 0;
    for (; i < step_items_.size() && on_grouped_gemvs(step_items_[i]) == grouped; ++i) {
      items.push_back(step_items_[i]);
      rows += step_items_[i];
    }
    if (rows == 0) continue;
    SLIMKV_RETURN_IF_ERROR(grouped ? add_grouped_experts(layer, first_row, rows, y, accumulate)
                                   : add_expert_products(layer, first_row, items, y, accumulate));
    first_row += rows;
  }
  return Status::ok();
}

Expected<ExpertRowsPlan> CudaLlamaModel::route_rows(int first_row, int rows) {
  const ModelConfig& c = config_;
  const int experts = int(c.moe.num_experts), k = int(c.moe.experts_per_token);
  // The choices grouped by expert, each expert's rows in token order (as the CPU runs them).
  const ExpertRowsPlan plan = expert_plan_at(expert_plan_.data(), rows * k, experts);
  SLIMKV_RETURN_IF_ERROR(route_to_experts(router_logits_.data() + size_t(first_row) * size_t(experts), rows, experts, k,
                                          c.moe.normalize_top_k, expert_of_.data(), expert_weight_.data(), plan));
  return plan;
}

// Each place's row through its expert's W_gate|W_up (into the inputs' buffer, activated [choices, inter],
// or the products [choices, 2·inter] then activated); each place through its expert's W_down (into the
// products [choices, hidden]), each row's k outputs summed into y, weighted, as the last CTA of each
// block of columns finishes.
Status CudaLlamaModel::add_grouped_experts(const LayerOnDevice& layer, int first_row, int rows, float* y, bool accumulate) {
  const ModelConfig& c = config_;
  const int experts = int(c.moe.num_experts), k = int(c.moe.experts_per_token), choices = rows * k;
  const size_t hidden = size_t(c.hidden_size), inter = size_t(c.moe.expert_intermediate_size);
  SLIMKV_ASSIGN_OR_RETURN(const ExpertRowsPlan plan, route_rows(first_row, rows));
  const uint16_t* x = h_.data() + size_t(first_row) * hidden;
  const int slots = expert_slots(choices, experts);
  if (layer.experts_gate_up.size() == 1) {  // W_gate, W_up of one kind: the activation applied as they are written
    SLIMKV_RETURN_IF_ERROR(grouped_expert_gated_gemv(x, plan.row_of_place, dtype_, layer.experts_gate_up.front(),
                                                     gate_activation(c), plan, slots, expert_inputs_.data()));
  } else {
    SLIMKV_RETURN_IF_ERROR(multiply_experts(x, plan.row_of_place, layer.experts_gate_up, plan, slots, expert_products_.data()));
    SLIMKV_RETURN_IF_ERROR(gated_activation(expert_products_.data(), choices, int(inter), gate_activation(c),
                                            expert_inputs_.data(), dtype_));
  }
  const WeightedRowSum sum{y + size_t(first_row) * hidden, accumulate, expert_weight_.data(), rows, k, expert_sum_counts_.data()};
  return grouped_expert_gemv(expert_inputs_.data(), nullptr, dtype_, layer.experts_down, plan, slots, expert_products_.data(),
                             int64_t(hidden), sum);
}

// Each expert's rows gathered back to back, through its own GEMMs, each item's rows among them a product
// of their own (as the item alone gives them: plain rows unpadded, quantized ones on the matrix-vector
// kernel up to its inputs, item_products.h), then the weighted sum.
Status CudaLlamaModel::add_expert_products(const LayerOnDevice& layer, int first_row, const std::vector<int>& items,
                                           float* y, bool accumulate) {
  const ModelConfig& c = config_;
  const int experts = int(c.moe.num_experts), k = int(c.moe.experts_per_token);
  const size_t hidden = size_t(c.hidden_size), inter = size_t(c.moe.expert_intermediate_size);
  int rows = 0;
  for (int n : items) rows += n;
  SLIMKV_ASSIGN_OR_RETURN(const ExpertRowsPlan plan, route_rows(first_row, rows));
  std::vector<int32_t> first_place(static_cast<size_t>(experts) + 1);
  SLIMKV_RETURN_IF_ERROR(copy_to_host(first_place.data(), plan.first_place, first_place.size() * sizeof(int32_t)));
  // The places hold first_place[experts] choices: fewer than rows·k where a row's logits hold a NaN.
  const int places = first_place.back();
  // Each expert's rows by item: an expert's places hold its rows ascending, so an item's rows among them
  // are consecutive, a run of its own (0 where the item chose the expert for none).
  std::vector<std::vector<int>> item_runs(static_cast<size_t>(experts), std::vector<int>(items.size(), 0));
  if (items.size() == 1) {
    for (int e = 0; e < experts; ++e) item_runs[size_t(e)][0] = first_place[size_t(e) + 1] - first_place[size_t(e)];
  } else {
    std::vector<int32_t> row_of_place(static_cast<size_t>(places));
    SLIMKV_RETURN_IF_ERROR(copy_to_host(row_of_place.data(), plan.row_of_place, row_of_place.size() * sizeof(int32_t)));
    std::vector<int> item_end(items.size());  // the first row after each item
    for (size_t i = 0, end = 0; i < items.size(); ++i) item_end[i] = int(end += size_t(items[i]));
    for (int e = 0; e < experts; ++e) {
      for (int place = first_place[size_t(e)]; place < first_place[size_t(e) + 1]; ++place) {
        const auto item = std::upper_bound(item_end.begin(), item_end.end(), row_of_place[size_t(place)]) - item_end.begin();
        ++item_runs[size_t(e)][size_t(item)];
      }
    }
  }
  SLIMKV_RETURN_IF_ERROR(
      gather_rows(h_.data() + size_t(first_row) * hidden, int(hidden), plan.row_of_place, places, expert_inputs_.data()));
  const auto for_each_expert = [&](const auto& run) -> Status {
    for (int e = 0; e < experts; ++e) {
      const int first = first_place[size_t(e)];
      if (first_place[size_t(e) + 1] > first) SLIMKV_RETURN_IF_ERROR(run(layer.experts[size_t(e)], size_t(first), item_runs[size_t(e)]));
    }
    return Status::ok();
  };
  SLIMKV_RETURN_IF_ERROR(for_each_expert([&](const MlpOnDevice& expert, size_t first, const std::vector<int>& runs) {
    return multiply_items(expert_inputs_.data() + first * hidden, runs, expert.w_gate_up,
                          expert_products_.data() + first * 2 * inter, false, PlainItems::kAlone);
  }));
  SLIMKV_RETURN_IF_ERROR(gated_activation(expert_products_.data(), rows * k, int(inter), gate_activation(c),
                                          expert_inputs_.data(), dtype_));
  SLIMKV_RETURN_IF_ERROR(for_each_expert([&](const MlpOnDevice& expert, size_t first, const std::vector<int>& runs) {
    return multiply_items(expert_inputs_.data() + first * inter, runs, expert.w_down, expert_products_.data() + first * hidden,
                          false, PlainItems::kAlone);
  }));
  return add_weighted_rows(expert_products_.data(), plan.place_of_choice, expert_weight_.data(), rows, k, int(hidden),
                           y + size_t(first_row) * hidden, accumulate);
}

int CudaLlamaModel::max_rows() const { return kRecomputeChunkRows; }

Status CudaLlamaModel::project_kv(int layer, const void* x, int n, const int32_t* positions, const uint16_t** k,
                                  const uint16_t** v) {
  const ModelConfig& c = config_;
  const LayerOnDevice& w = layers_[size_t(layer)];
  // W_k and W_v are the rows of W_qkv after W_q's; their biases follow likewise.
  const float* b_kv = w.b_qkv != nullptr ? w.b_qkv + c.q_dim() : nullptr;
  const AttentionHeads kv_heads{0, int(c.num_kv_heads), int(c.head_dim), attention_dim_};
  SLIMKV_RETURN_IF_ERROR(multiply(x, n, w.w_qkv.row_range(c.q_dim(), 2 * c.kv_dim()), recompute_projected_.data()));
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

Status CudaLlamaModel::run_step(std::span<const SequenceStep> items, StepOutputs& out, const LayerHook& after_attention) {
  std::vector<SequenceTokens> batch;
  std::vector<StepRows> wanted;
  std::vector<RowSampling> sampling;  // of the sampled items, in order: their rows lead the logits
  for (const SequenceStep& item : items) {
    batch.push_back({item.sequence, item.tokens});
    wanted.push_back(item.rows);
    if (item.rows == StepRows::kSample) sampling.push_back(item.sampling);
  }
  SLIMKV_ASSIGN_OR_RETURN(int rows, forward(batch, wanted, out.first_row, after_attention));
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
