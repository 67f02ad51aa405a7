#include "model/zack_projection.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/vec_ops.h"

namespace slimkv {
namespace {

// Rows [first_row, first_row + count) of a weight matrix, widened to FP32 [count, w.cols].
std::vector<float> widened_rows(const WeightMatrix& w, int64_t first_row, int64_t count) {
  std::vector<float> rows(size_t(count * w.cols));
  widen_rows(w, first_row, count, rows.data());
  return rows;
}

// c[m, r] (row stride ldc) = a[m, d] (row stride lda) · basis[r, d]ᵀ
void times_basis_transposed(const float* a, int m, int lda, const float* basis, int r, int d, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r, d, 1.0f, a, lda, basis, d, 0.0f, c, ldc);
}

}  // namespace

std::unique_ptr<ZackProjection> ZackProjection::fold(const ZackCalibration& calibration, const ZackRanks& ranks,
                                                     const ModelConfig& config, LlamaWeights& weights) {
  const int d = int(config.head_dim), hidden = int(config.hidden_size);
  const int heads = int(config.num_heads), kv_heads = int(config.num_kv_heads), group = heads / kv_heads;
  std::unique_ptr<ZackProjection> zack(new ZackProjection(ranks, heads, d));
  zack->hidden_ = hidden;
  zack->layers_.resize(size_t(config.num_layers));
  for (int l = 0; l < int(config.num_layers); ++l) {
    Layer& layer = zack->layers_[size_t(l)];
    LayerWeights& w = weights.layers[size_t(l)];
    int v_dims = 0;  // Σ_g v_rank
    for (int g = 0; g < kv_heads; ++g) v_dims += ranks.v_rank(l, g);
    const std::vector<float> wo = widened_rows(w.wo, 0, hidden);  // [hidden, heads · d]
    layer.wv.resize(size_t(v_dims) * hidden);
    layer.wo.resize(size_t(hidden) * group * v_dims);
    std::vector<float> bv;
    int v_row = 0, o_column = 0;
    for (int g = 0; g < kv_heads; ++g) {
      const int r = ranks.v_rank(l, g);
      const float* basis = calibration.vw_basis_of(l, g);  // the first r rows: B_g[:r] [r, d]
      // W_V,g' = B_g[:r] · W_V,g: [r, d] · [d, hidden]
      const std::vector<float> wv = widened_rows(w.wv, int64_t(g) * d, d);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, hidden, d, 1.0f, basis, d, wv.data(), hidden, 0.0f,
                  layer.wv.data() + size_t(v_row) * hidden, hidden);
      if (config.attention_bias) {
        for (int i = 0; i < r; ++i) bv.push_back(dot(basis + size_t(i) * d, w.bv.data() + size_t(g) * d, size_t(d)));
      }
      v_row += r;
      // W_O,h' = W_O,h · B_g[:r]ᵀ for each query head h of the group: [hidden, d] · [d, r]
      for (int h = g * group; h < (g + 1) * group; ++h) {
        times_basis_transposed(wo.data() + size_t(h) * d, hidden, heads * d, basis, r, d, layer.wo.data() + o_column,
                               group * v_dims);
        o_column += r;
      }
    }
    w.wv = {layer.wv.data(), DType::kF32, v_dims, hidden};
    w.wo = {layer.wo.data(), DType::kF32, hidden, int64_t(group) * v_dims};
    if (config.attention_bias) w.bv = std::move(bv);
    // The bases, truncated, for project_qk (and project_v / lift_output).
    for (int g = 0; g < kv_heads; ++g) {
      const float* qk_basis = calibration.qk_basis_of(l, g);
      layer.qk_bases.insert(layer.qk_bases.end(), qk_basis, qk_basis + size_t(ranks.k_rank(l, g)) * d);
      const float* vw_basis = calibration.vw_basis_of(l, g);
      layer.vw_bases.insert(layer.vw_bases.end(), vw_basis, vw_basis + size_t(ranks.v_rank(l, g)) * d);
    }
  }
  return zack;
}

void ZackProjection::project_rows(const std::vector<float>& bases, bool k_ranks, int l, float* rows, int n, int heads,
                                  int heads_per_basis) const {
  const int d = head_dim_;
  const auto rank = [&](int g) { return k_ranks ? ranks_.k_rank(l, g) : ranks_.v_rank(l, g); };
  int width = 0;  // of a projected row
  for (int h = 0; h < heads; ++h) width += rank(h / heads_per_basis);
  thread_local std::vector<float> projected;
  projected.resize(size_t(n) * width);
  int column = 0;
  for (int h = 0; h < heads; ++h) {
    const int g = h / heads_per_basis, r = rank(g);
    size_t basis_offset = 0;
    for (int before = 0; before < g; ++before) basis_offset += size_t(rank(before)) * d;
    times_basis_transposed(rows + size_t(h) * d, n, heads * d, bases.data() + basis_offset, r, d,
                           projected.data() + column, width);
    column += r;
  }
  std::memcpy(rows, projected.data(), projected.size() * sizeof(float));
}

void ZackProjection::project_qk(int l, float* q, float* k, int n) const {
  const Layer& layer = layers_[size_t(l)];
  const int kv_heads = ranks_.num_kv_heads;
  project_rows(layer.qk_bases, true, l, q, n, num_heads_, num_heads_ / kv_heads);
  project_rows(layer.qk_bases, true, l, k, n, kv_heads, 1);
}

void ZackProjection::project_v(int l, float* v, int n) const {
  project_rows(layers_[size_t(l)].vw_bases, false, l, v, n, ranks_.num_kv_heads, 1);
}

void ZackProjection::lift_output(int l, const float* reduced, int n, float* out) const {
  const Layer& layer = layers_[size_t(l)];
  const int d = head_dim_, group = num_heads_ / ranks_.num_kv_heads;
  int width = 0;
  for (int h = 0; h < num_heads_; ++h) width += ranks_.v_rank(l, h / group);
  int column = 0;
  for (int h = 0; h < num_heads_; ++h) {
    const int g = h / group, r = ranks_.v_rank(l, g);
    size_t basis_offset = 0;
    for (int before = 0; before < g; ++before) basis_offset += size_t(ranks_.v_rank(l, before)) * d;
    // out_h [n, d] = reduced_h [n, r] · B_g[:r] [r, d]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, r, 1.0f, reduced + column, width,
                layer.vw_bases.data() + basis_offset, d, 0.0f, out + size_t(h) * d, num_heads_ * d);
    column += r;
  }
}

std::vector<float> ZackProjection::full_width_wv(int l) const {
  const Layer& layer = layers_[size_t(l)];
  const int kv_heads = ranks_.num_kv_heads;
  std::vector<float> wv(size_t(kv_heads) * head_dim_ * hidden_, 0.0f);
  size_t folded_row = 0;
  for (int g = 0; g < kv_heads; ++g) {
    const size_t r = size_t(ranks_.v_rank(l, g));
    std::copy_n(layer.wv.data() + folded_row * hidden_, r * hidden_, wv.data() + size_t(g) * head_dim_ * hidden_);
    folded_row += r;
  }
  return wv;
}

std::vector<float> ZackProjection::full_width_bv(int l, const std::vector<float>& folded_bv) const {
  std::vector<float> bv(size_t(ranks_.num_kv_heads) * head_dim_, 0.0f);
  size_t folded = 0;
  for (int g = 0; g < ranks_.num_kv_heads; ++g) {
    const size_t r = size_t(ranks_.v_rank(l, g));
    std::copy_n(folded_bv.data() + folded, r, bv.data() + size_t(g) * head_dim_);
    folded += r;
  }
  return bv;
}

std::vector<float> ZackProjection::full_width_wo(int l) const {
  const Layer& layer = layers_[size_t(l)];
  const int group = num_heads_ / ranks_.num_kv_heads;
  const size_t folded_width = layer.wo.size() / size_t(hidden_), width = size_t(num_heads_) * head_dim_;
  std::vector<float> wo(size_t(hidden_) * width, 0.0f);
  size_t folded_column = 0;
  for (int h = 0; h < num_heads_; ++h) {
    const size_t r = size_t(ranks_.v_rank(l, h / group));
    for (int row = 0; row < hidden_; ++row) {
      std::copy_n(layer.wo.data() + size_t(row) * folded_width + folded_column, r,
                  wo.data() + size_t(row) * width + size_t(h) * head_dim_);
    }
    folded_column += r;
  }
  return wo;
}

}  // namespace slimkv
