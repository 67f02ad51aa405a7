#include "model/llama.h"

#include <cmath>

#include "backend/cpu/vec_ops.h"
#include "kv/store_attention.h"
#include "model/gguf_model.h"
#include "model/model_identity.h"

namespace slimkv {

// ----------------------------------------------------------------------------------------------
// Loading

Expected<std::unique_ptr<LlamaModel>> LlamaModel::load(const std::string& model_dir) {
  if (has_gguf_magic(model_dir)) {
    SLIMKV_ASSIGN_OR_RETURN(GgufModel gguf, load_gguf_model(model_dir));
    SLIMKV_ASSIGN_OR_RETURN(LlamaWeights weights, LlamaWeights::load(gguf.weights, gguf.config));
    return std::unique_ptr<LlamaModel>(
        new LlamaModel(model_dir, std::move(gguf.config), std::move(gguf.weights), std::move(weights)));
  }
  SLIMKV_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(model_dir));
  SLIMKV_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open(model_dir));
  SLIMKV_ASSIGN_OR_RETURN(LlamaWeights weights, LlamaWeights::load(store, config));
  return std::unique_ptr<LlamaModel>(
      new LlamaModel(model_dir, std::move(config), std::move(store), std::move(weights)));
}

LlamaModel::LlamaModel(std::string model_dir, ModelConfig config, WeightStore store, LlamaWeights weights)
    : model_dir_(std::move(model_dir)),
      config_(std::move(config)),
      store_(std::move(store)),
      weights_(std::move(weights)),
      rope_(config_) {}

KvShape LlamaModel::kv_shape() const {
  KvShape shape{int(config_.num_layers), int(config_.num_kv_heads), int(config_.head_dim), int(config_.head_dim),
                int(config_.max_position_embeddings)};
  if (zack_) {
    shape.head_k_dims = zack_->ranks().k_ranks;
    shape.head_v_dims = zack_->ranks().v_ranks;
  }
  return shape;
}

Expected<std::string> LlamaModel::identity() const { return model_identity(model_dir_, store_); }

Status LlamaModel::enable_zack(const ZackOptions& options) {
  if (zack_) return error("ZACK is already enabled on this model (weights are folded once)");
  const std::string path = options.calibration_path.empty() ? model_dir_ + "/zack.safetensors" : options.calibration_path;
  SLIMKV_ASSIGN_OR_RETURN(std::string model, identity());
  SLIMKV_ASSIGN_OR_RETURN(ZackCalibration calibration, ZackCalibration::load(path, model));
  if (calibration.num_layers != config_.num_layers || calibration.num_kv_heads != config_.num_kv_heads ||
      calibration.head_dim != config_.head_dim) {
    return error(path, ": calibration of ", calibration.num_layers, " layers x ", calibration.num_kv_heads,
                 " KV heads x head_dim ", calibration.head_dim, " does not fit the model's ", config_.num_layers, " x ",
                 config_.num_kv_heads, " x ", config_.head_dim);
  }
  SLIMKV_ASSIGN_OR_RETURN(ZackRanks ranks, select_zack_ranks(calibration, options));
  zack_ = ZackProjection::fold(calibration, ranks, config_, weights_);
  return Status::ok();
}

// ----------------------------------------------------------------------------------------------
// Building blocks, in order of use

namespace {

// out = x / rms(x) · weight, per row of `dim` (transformers' LlamaRMSNorm, FP32).
void rmsnorm(const float* x, const std::vector<float>& weight, float eps, int n, int dim, float* out) {
  for (int t = 0; t < n; ++t) {
    const float* row = x + size_t(t) * dim;
    const float mean_square = dot(row, row, size_t(dim)) / float(dim);
    const float inv_rms = 1.0f / std::sqrt(mean_square + eps);
    float* o = out + size_t(t) * dim;
    for (int i = 0; i < dim; ++i) o[i] = weight[size_t(i)] * (row[i] * inv_rms);
  }
}

void add_bias(float* x, const std::vector<float>& bias, int n) {
  for (int t = 0; t < n; ++t) mul_add_to(1.0f, bias.data(), x + size_t(t) * bias.size(), bias.size());
}

// gate = silu(gate) · up, elementwise (SwiGLU).
void swiglu(float* gate, const float* up, size_t size) {
  for (size_t i = 0; i < size; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void add_to(float* x, const float* delta, size_t size) { mul_add_to(1.0f, delta, x, size); }

}  // namespace

// ----------------------------------------------------------------------------------------------
// The forward pass

namespace {

// Row widths of one layer's q and attention output: each query head's k / v dims back to back (ZACK's
// ranks differ per KV head; without ZACK they are q_dim both).
int query_dims(const KvShape& shape, int layer, int num_heads) {
  const int group = num_heads / shape.num_kv_heads;
  int dims = 0;
  for (int h = 0; h < num_heads; ++h) dims += shape.k_dim_of(layer, h / group);
  return dims;
}

int output_dims(const KvShape& shape, int layer, int num_heads) {
  const int group = num_heads / shape.num_kv_heads;
  int dims = 0;
  for (int h = 0; h < num_heads; ++h) dims += shape.v_dim_of(layer, h / group);
  return dims;
}

}  // namespace

void LlamaModel::forward(std::span<const ForwardSequence> batch, float* logits, RunState& s, ThreadPool& pool) const {
  const ModelConfig& c = config_;
  // The batch's rows back to back: sequence i owns rows [first_row[i], first_row[i] + its tokens).
  std::vector<int> first_row(batch.size() + 1, 0);
  for (size_t i = 0; i < batch.size(); ++i) first_row[i + 1] = first_row[i] + int(batch[i].tokens.size());
  const int n = first_row.back();
  const int hidden = int(c.hidden_size), inter = int(c.intermediate_size);
  const int q_dim = int(c.q_dim()), kv_dim = int(c.kv_dim());
  const float eps = float(c.rms_norm_eps);
  s.x.resize(size_t(n) * hidden);
  s.xb.resize(size_t(n) * hidden);
  s.q.resize(size_t(n) * q_dim);
  s.k.resize(size_t(n) * kv_dim);
  s.v.resize(size_t(n) * kv_dim);
  s.att.resize(size_t(n) * q_dim);
  s.proj.resize(size_t(n) * hidden);
  s.gate.resize(size_t(n) * inter);
  s.up.resize(size_t(n) * inter);

  // x = embed(tokens); each sequence's RoPE angles from its own first position
  const size_t half = size_t(c.head_dim) / 2;
  s.cos.resize(size_t(n) * half);
  s.sin.resize(size_t(n) * half);
  std::vector<int> first_position(batch.size());
  thread_local std::vector<float> cos, sin;
  for (size_t i = 0; i < batch.size(); ++i) {
    for (size_t t = 0; t < batch[i].tokens.size(); ++t) {
      widen_rows(weights_.embedding, batch[i].tokens[t], 1, s.x.data() + (size_t(first_row[i]) + t) * hidden);
    }
    first_position[i] = batch[i].kv->num_tokens(0);
    rope_.angles(first_position[i], int(batch[i].tokens.size()), cos, sin);
    std::copy(cos.begin(), cos.end(), s.cos.begin() + ptrdiff_t(size_t(first_row[i]) * half));
    std::copy(sin.begin(), sin.end(), s.sin.begin() + ptrdiff_t(size_t(first_row[i]) * half));
  }
  const AttentionParams attention_params{int(c.num_heads), 1.0f / std::sqrt(float(c.head_dim)), &pool};

  for (int l = 0; l < int(c.num_layers); ++l) {
    const LayerWeights& w = weights_.layers[size_t(l)];

    // Attention block: h = rmsnorm(x); q, k, v = project(h); rope(q, k); append; attend; x += o_proj(o)
    rmsnorm(s.x.data(), w.attention_norm, eps, n, hidden, s.xb.data());
    matmul(s.xb.data(), n, w.wq, s.q.data(), pool);
    matmul(s.xb.data(), n, w.wk, s.k.data(), pool);
    matmul(s.xb.data(), n, w.wv, s.v.data(), pool);
    if (c.attention_bias) {
      add_bias(s.q.data(), w.bq, n);
      add_bias(s.k.data(), w.bk, n);
      add_bias(s.v.data(), w.bv, n);
    }
    rope_.rotate(s.q.data(), n, int(c.num_heads), s.cos, s.sin);
    rope_.rotate(s.k.data(), n, int(c.num_kv_heads), s.cos, s.sin);
    const KvShape& shape = batch[0].kv->shape();
    const int v_dims = shape.layer_v_dims(l), out_dims = output_dims(shape, l, int(c.num_heads));
    for (size_t i = 0; i < batch.size(); ++i) {
      if (ForwardObserver* observer = batch[i].observer) {
        const size_t row = size_t(first_row[i]);
        observer->on_qkv(l, s.q.data() + row * q_dim, s.k.data() + row * kv_dim, s.v.data() + row * v_dims,
                         int(batch[i].tokens.size()));
      }
    }
    if (zack_) zack_->project_qk(l, s.q.data(), s.k.data(), n);  // ZACK: q, k to each head's rank (v, o folded)
    const int q_dims = query_dims(shape, l, int(c.num_heads)), k_dims = shape.layer_k_dims(l);
    for (size_t i = 0; i < batch.size(); ++i) {  // each sequence appends to and attends over its own store
      KvStore& kv = *batch[i].kv;
      const size_t row = size_t(first_row[i]);
      const int rows = int(batch[i].tokens.size());
      const float* q = s.q.data() + row * size_t(q_dims);
      kv.append(l, s.k.data() + row * size_t(k_dims), s.v.data() + row * size_t(v_dims), rows);
      const std::vector<HeadSelection>& selection = kv.select(l, q, rows, int(c.num_heads), pool);
      float* out = s.att.data() + row * size_t(out_dims);
      attend(kv, l, q, rows, first_position[i], attention_params, out, &selection);
      if (batch[i].observer) batch[i].observer->on_attention_output(l, out, rows);
    }
    matmul(s.att.data(), n, w.wo, s.proj.data(), pool);
    add_to(s.x.data(), s.proj.data(), size_t(n) * hidden);

    // MLP block: x += down(silu(gate(h)) · up(h)), h = rmsnorm(x)
    rmsnorm(s.x.data(), w.mlp_norm, eps, n, hidden, s.xb.data());
    matmul(s.xb.data(), n, w.w_gate, s.gate.data(), pool);
    matmul(s.xb.data(), n, w.w_up, s.up.data(), pool);
    swiglu(s.gate.data(), s.up.data(), size_t(n) * inter);
    matmul(s.gate.data(), n, w.w_down, s.proj.data(), pool);
    add_to(s.x.data(), s.proj.data(), size_t(n) * hidden);
  }

  // logits = lm_head(rmsnorm(x)) for the rows the sequences ask for, gathered in order
  int rows = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int count = batch[i].logits == LogitRows::kAll ? int(batch[i].tokens.size())
                      : batch[i].logits == LogitRows::kLast ? 1 : 0;
    const int first = first_row[i + 1] - count;
    rmsnorm(s.x.data() + size_t(first) * hidden, weights_.final_norm, eps, count, hidden,
            s.xb.data() + size_t(rows) * hidden);
    rows += count;
  }
  if (rows > 0) matmul(s.xb.data(), rows, weights_.lm_head, logits, pool);
}

}  // namespace slimkv
