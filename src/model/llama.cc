#include "model/llama.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/vec_ops.h"
#include "kv/store_attention.h"
#include "model/expert_routing.h"
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
      rope_(config_.rope, int(config_.head_dim)),
      sliding_rope_(config_.sliding_rope, int(config_.head_dim)) {}

KvShape LlamaModel::kv_shape() const {
  KvShape shape{int(config_.num_layers), int(config_.num_kv_heads), int(config_.head_dim), int(config_.head_dim),
                int(config_.max_position_embeddings)};
  if (zack_) {
    shape.head_k_dims = zack_->ranks().k_ranks;
    shape.head_v_dims = zack_->ranks().v_ranks;
  }
  if (!config_.sliding_layers.empty()) {
    shape.window_tokens.assign(size_t(config_.num_layers), 0);
    for (int l = 0; l < int(config_.num_layers); ++l) {
      if (config_.is_sliding(l)) shape.window_tokens[size_t(l)] = int(config_.sliding_window);
    }
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

void LlamaModel::pack_weights_for_cpu(ThreadPool& pool) {
  std::vector<WeightMatrix*> matrices = {&weights_.lm_head};
  for (LayerWeights& layer : weights_.layers) {
    for (WeightMatrix* w : {&layer.wq, &layer.wk, &layer.wv, &layer.wo, &layer.mlp.gate, &layer.mlp.up,
                            &layer.mlp.down, &layer.router}) {
      matrices.push_back(w);
    }
    for (MlpWeights& expert : layer.experts) {
      for (WeightMatrix* w : {&expert.gate, &expert.up, &expert.down}) matrices.push_back(w);
    }
  }
  std::erase_if(matrices, [](const WeightMatrix* w) {
    return w->data == nullptr || w->bf16_panels != nullptr || !takes_bf16_panels(*w);
  });
  const size_t first = packed_weights_.size();
  packed_weights_.resize(first + matrices.size());
  pool.run(int64_t(matrices.size()), [&](int64_t m, int) {
    const WeightMatrix& w = *matrices[size_t(m)];
    packed_weights_[first + size_t(m)] = bf16_pack_panels(static_cast<const uint16_t*>(w.data), w.rows, w.cols);
  });
  for (size_t m = 0; m < matrices.size(); ++m) {
    WeightMatrix& w = *matrices[m];
    w.bf16_panels = packed_weights_[first + m].get();
    // The packed copy replaces the mapped rows in memory (they stay readable, from the file); not the
    // embedding's, which its lookup reads (a tied lm_head's).
    if (w.data != weights_.embedding.data) store_.release_pages(w.data, size_t(w.rows * w.cols) * sizeof(uint16_t));
  }
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

// gate = act(gate) · up, elementwise: silu (SwiGLU), or GELU's tanh approximation (GeGLU, as PyTorch's
// gelu(approximate="tanh")). In pieces over the pool: one exp or tanh per element made it 4-5% of a
// 16-sequence decode step while the other threads waited.
void gated_activation(Activation activation, float* gate, const float* up, size_t size, ThreadPool& pool) {
  // Elements per task at least: a decode step of one sequence (a row of 768 in the bundled model) stays
  // on the calling thread, where handing pieces to the pool gained nothing measurable.
  constexpr size_t kPiece = 1024;
  const size_t pieces = std::min(size_t(pool.threads()) * 4, (size + kPiece - 1) / kPiece);
  const size_t piece = (size + pieces - 1) / pieces;
  pool.run(int64_t(pieces), [&](int64_t p, int) {
    const size_t end = std::min(size, (size_t(p) + 1) * piece);
    if (activation == Activation::kSilu) {
      for (size_t i = size_t(p) * piece; i < end; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
      return;
    }
    const float sqrt_2_over_pi = 0.7978845608028654f;
    for (size_t i = size_t(p) * piece; i < end; ++i) {
      const float x = gate[i];
      gate[i] = 0.5f * x * (1.0f + std::tanh(sqrt_2_over_pi * (x + 0.044715f * x * x * x))) * up[i];
    }
  });
}

// The MLP of one layer over n rows of h, into out: dense, or routed to experts (Qwen3-MoE: softmax over
// the router's logits, the top k, optionally renormalised; each expert runs once over the rows routed to
// it, so only those rows are computed). `items`: the rows of the batch's sequences (MatmulItems).
void mlp(const ModelConfig& c, const LayerWeights& w, const float* h, int n, MatmulItems items, float* out, RunState& s,
         ThreadPool& pool) {
  const int hidden = int(c.hidden_size);
  if (w.experts.empty()) {
    const size_t inter = size_t(c.intermediate_size);
    const MatmulProduct gate_up[] = {{&w.mlp.gate, s.gate.data()}, {&w.mlp.up, s.up.data()}};
    matmul_shared_input(h, n, gate_up, pool, items);
    gated_activation(c.activation, s.gate.data(), s.up.data(), size_t(n) * inter, pool);
    matmul(s.gate.data(), n, w.mlp.down, out, pool, items);
    return;
  }
  const MoeConfig& moe = c.moe;
  const int experts = int(moe.num_experts), k = int(moe.experts_per_token);
  s.router.resize(size_t(n) * experts);
  s.expert_of.resize(size_t(n) * k);
  s.expert_weight.resize(size_t(n) * k);
  matmul(h, n, w.router, s.router.data(), pool, items);
  route_to_experts(moe, n, s.router.data(), s.expert_of.data(), s.expert_weight.data());
  std::fill(out, out + size_t(n) * hidden, 0.0f);
  const size_t inter = size_t(moe.expert_intermediate_size);
  std::vector<int> rows, expert_items;
  std::vector<float> row_weight;
  for (int e = 0; e < experts; ++e) {
    rows.clear();
    row_weight.clear();
    for (int i = 0; i < n * k; ++i) {
      if (s.expert_of[size_t(i)] == e) {
        rows.push_back(i / k);
        row_weight.push_back(s.expert_weight[size_t(i)]);
      }
    }
    if (rows.empty()) continue;
    const int m = int(rows.size());
    // The expert's rows by sequence (rows ascend, a sequence's rows are consecutive): each sequence's on
    // the path its routed rows take alone (MatmulItems).
    expert_items.assign(items.size(), 0);
    for (size_t r = 0, j = 0, first = 0; !items.empty() && r < rows.size(); ++r) {
      while (size_t(rows[r]) >= first + size_t(items[j])) first += size_t(items[j++]);
      ++expert_items[j];
    }
    s.expert_in.resize(size_t(m) * hidden);
    s.expert_gate.resize(size_t(m) * inter);
    s.expert_up.resize(size_t(m) * inter);
    s.expert_out.resize(size_t(m) * hidden);
    for (int r = 0; r < m; ++r) {
      std::copy_n(h + size_t(rows[size_t(r)]) * hidden, hidden, s.expert_in.data() + size_t(r) * hidden);
    }
    const MlpWeights& expert = w.experts[size_t(e)];
    const MatmulProduct gate_up[] = {{&expert.gate, s.expert_gate.data()}, {&expert.up, s.expert_up.data()}};
    matmul_shared_input(s.expert_in.data(), m, gate_up, pool, expert_items);
    gated_activation(c.activation, s.expert_gate.data(), s.expert_up.data(), size_t(m) * inter, pool);
    matmul(s.expert_gate.data(), m, expert.down, s.expert_out.data(), pool, expert_items);
    for (int r = 0; r < m; ++r) {
      mul_add_to(row_weight[size_t(r)], s.expert_out.data() + size_t(r) * hidden,
                 out + size_t(rows[size_t(r)]) * hidden, size_t(hidden));
    }
  }
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
  std::vector<int> first_row(batch.size() + 1, 0), item_rows(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    item_rows[i] = int(batch[i].tokens.size());
    first_row[i + 1] = first_row[i] + item_rows[i];
  }
  const int n = first_row.back();
  const int hidden = int(c.hidden_size), inter = int(c.intermediate_size), head_dim = int(c.head_dim);
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
  const bool sliding = !c.sliding_layers.empty();
  for (auto* angles : {&s.cos, &s.sin, &s.sliding_cos, &s.sliding_sin}) {
    if (sliding || angles == &s.cos || angles == &s.sin) angles->resize(size_t(n) * half);
  }
  const float embed_scale = c.embedding_scale();  // x = embed(token) (× √hidden where the family scales)
  std::vector<int> first_position(batch.size());
  thread_local std::vector<float> cos, sin;
  const auto angles = [&](const Rope& rope, size_t i, std::vector<float>& all_cos, std::vector<float>& all_sin) {
    rope.angles(first_position[i], int(batch[i].tokens.size()), cos, sin);
    std::copy(cos.begin(), cos.end(), all_cos.begin() + ptrdiff_t(size_t(first_row[i]) * half));
    std::copy(sin.begin(), sin.end(), all_sin.begin() + ptrdiff_t(size_t(first_row[i]) * half));
  };
  for (size_t i = 0; i < batch.size(); ++i) {
    for (size_t t = 0; t < batch[i].tokens.size(); ++t) {
      float* x = s.x.data() + (size_t(first_row[i]) + t) * hidden;
      widen_rows(weights_.embedding, batch[i].tokens[t], 1, x);
      if (c.scale_embeddings) {
        for (int j = 0; j < hidden; ++j) x[j] *= embed_scale;
      }
    }
    first_position[i] = batch[i].kv->num_tokens(0);
    angles(rope_, i, s.cos, s.sin);
    if (sliding) angles(sliding_rope_, i, s.sliding_cos, s.sliding_sin);
  }
  std::vector<AttendCall> calls;  // [batch] one layer's attention, a call per sequence

  for (int l = 0; l < int(c.num_layers); ++l) {
    const LayerWeights& w = weights_.layers[size_t(l)];
    const bool sliding_layer = c.is_sliding(l);
    const AttentionParams attention_params{int(c.num_heads), float(c.attention_scale), &pool, true,
                                           sliding_layer ? int(c.sliding_window) : 0};

    // Attention block: h = rmsnorm(x); q, k, v = project(h); rope(q, k); append; attend; x += o_proj(o)
    rmsnorm(s.x.data(), w.attention_norm, eps, n, hidden, s.xb.data());
    const MatmulProduct qkv[] = {{&w.wq, s.q.data()}, {&w.wk, s.k.data()}, {&w.wv, s.v.data()}};
    matmul_shared_input(s.xb.data(), n, qkv, pool, item_rows);
    if (c.attention_bias) {
      add_bias(s.q.data(), w.bq, n);
      add_bias(s.k.data(), w.bk, n);
      add_bias(s.v.data(), w.bv, n);
    }
    if (c.qk_norm) {  // each head's q and k normed over head_dim (Qwen3, Gemma 3)
      rmsnorm(s.q.data(), w.q_norm, eps, n * int(c.num_heads), head_dim, s.q.data());
      rmsnorm(s.k.data(), w.k_norm, eps, n * int(c.num_kv_heads), head_dim, s.k.data());
    }
    const Rope& rope = sliding_layer ? sliding_rope_ : rope_;
    const std::vector<float>& cos_l = sliding_layer ? s.sliding_cos : s.cos;
    const std::vector<float>& sin_l = sliding_layer ? s.sliding_sin : s.sin;
    rope.rotate(s.q.data(), n, int(c.num_heads), cos_l, sin_l);
    rope.rotate(s.k.data(), n, int(c.num_kv_heads), cos_l, sin_l);
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
    // Each sequence appends to and attends over its own store. The appends run in the pool, a sequence a
    // task: a store is one sequence's alone, and sealing a block (quantizing it) is a step's largest
    // serial work otherwise.
    pool.run(int64_t(batch.size()), [&](int64_t i, int) {
      const size_t row = size_t(first_row[size_t(i)]);
      batch[size_t(i)].kv->append(l, s.k.data() + row * size_t(k_dims), s.v.data() + row * size_t(v_dims),
                                  int(batch[size_t(i)].tokens.size()));
    });
    calls.clear();
    for (size_t i = 0; i < batch.size(); ++i) {
      KvStore& kv = *batch[i].kv;
      const size_t row = size_t(first_row[i]);
      const int rows = int(batch[i].tokens.size());
      const float* q = s.q.data() + row * size_t(q_dims);
      const std::vector<HeadSelection>& selection = kv.select(l, q, rows, int(c.num_heads), pool);
      calls.push_back({&kv, q, rows, first_position[i], s.att.data() + row * size_t(out_dims), &selection});
    }
    attend_many(calls, l, attention_params);  // all sequences' attention in one pool loop
    for (size_t i = 0; i < batch.size(); ++i) {
      batch[i].kv->release_outside_window(l);  // a sliding layer frees the blocks no later query can see
      if (batch[i].observer) batch[i].observer->on_attention_output(l, calls[i].out, calls[i].n);
    }
    matmul(s.att.data(), n, w.wo, s.proj.data(), pool, item_rows);
    if (c.sandwich_norms) rmsnorm(s.proj.data(), w.attention_out_norm, eps, n, hidden, s.proj.data());
    add_to(s.x.data(), s.proj.data(), size_t(n) * hidden);

    // MLP block: x += mlp(rmsnorm(x)) (Gemma 3: normed again before the add)
    rmsnorm(s.x.data(), w.mlp_norm, eps, n, hidden, s.xb.data());
    mlp(c, w, s.xb.data(), n, item_rows, s.proj.data(), s, pool);
    for (size_t i = 0; i < batch.size() && !w.experts.empty(); ++i) {  // mlp left the probabilities in s.router
      if (batch[i].observer) {
        batch[i].observer->on_routing(l, s.router.data() + size_t(first_row[i]) * size_t(c.moe.num_experts),
                                      int(batch[i].tokens.size()));
      }
    }
    if (c.sandwich_norms) rmsnorm(s.proj.data(), w.mlp_out_norm, eps, n, hidden, s.proj.data());
    add_to(s.x.data(), s.proj.data(), size_t(n) * hidden);
  }

  // logits = lm_head(rmsnorm(x)) for the rows the sequences ask for, gathered in order
  int rows = 0;
  std::vector<int> logit_rows;  // each sequence's rows of them
  for (size_t i = 0; i < batch.size(); ++i) {
    const int count = batch[i].logits == LogitRows::kAll ? int(batch[i].tokens.size())
                      : batch[i].logits == LogitRows::kLast ? 1 : 0;
    logit_rows.push_back(count);
    const int first = first_row[i + 1] - count;
    rmsnorm(s.x.data() + size_t(first) * hidden, weights_.final_norm, eps, count, hidden,
            s.xb.data() + size_t(rows) * hidden);
    rows += count;
  }
  if (rows > 0) matmul(s.xb.data(), rows, weights_.lm_head, logits, pool, logit_rows);
  if (c.final_logit_softcap > 0) {  // Gemma: logits = cap · tanh(logits / cap)
    const float cap = float(c.final_logit_softcap);
    for (size_t i = 0; i < size_t(rows) * size_t(c.vocab_size); ++i) logits[i] = cap * std::tanh(logits[i] / cap);
  }
}

}  // namespace slimkv
