#include "engine/zack_calibrator.h"

#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <cmath>

namespace slimkv {
namespace {

// gram[d, d] (upper triangle) += Aᵀ A for A = rows [n, d] with row stride `stride`, FP64.
void add_gram(const double* rows, int n, int d, int stride, double* gram) {
  cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, d, n, 1.0, rows, stride, 1.0, gram, d);
}

void widen(const float* in, size_t size, std::vector<double>& out) {
  out.resize(size);
  for (size_t i = 0; i < size; ++i) out[i] = double(in[i]);
}

// The eigenvectors of gram [d, d] (upper triangle) as rows of `basis`, by descending eigenvalue, and the
// singular values sqrt(max(eigenvalue, 0)) of the stack the Gram matrix came from.
Status decompose(const double* gram, int d, float* basis, float* singular_values) {
  std::vector<double> a(gram, gram + size_t(d) * d);
  std::vector<double> eigenvalues(static_cast<size_t>(d));
  // dsyevd on a row-major upper triangle: eigenvalues ascending, eigenvectors in the columns of a.
  const lapack_int info = LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'V', 'U', d, a.data(), d, eigenvalues.data());
  if (info != 0) return error("LAPACK dsyevd failed (info ", info, ") on a ", d, "x", d, " Gram matrix");
  for (int i = 0; i < d; ++i) {
    const int column = d - 1 - i;  // descending
    int largest = 0;
    for (int c = 1; c < d; ++c) {
      if (std::fabs(a[size_t(c) * d + column]) > std::fabs(a[size_t(largest) * d + column])) largest = c;
    }
    const double sign = a[size_t(largest) * d + column] < 0 ? -1.0 : 1.0;
    for (int c = 0; c < d; ++c) basis[size_t(i) * d + c] = float(sign * a[size_t(c) * d + column]);
    singular_values[i] = float(std::sqrt(std::max(eigenvalues[size_t(column)], 0.0)));
  }
  return Status::ok();
}

}  // namespace

ZackCalibrator::ZackCalibrator(int num_layers, int num_heads, int num_kv_heads, int head_dim)
    : num_layers_(num_layers),
      num_heads_(num_heads),
      num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      qk_gram_(size_t(num_layers) * num_kv_heads * head_dim * head_dim, 0.0),
      vw_gram_(qk_gram_.size(), 0.0) {}

void ZackCalibrator::on_qkv(int layer, const float* q, const float* k, const float* v, int n) {
  const int d = head_dim_, group = num_heads_ / num_kv_heads_;
  const int q_stride = num_heads_ * d, kv_stride = num_kv_heads_ * d;
  widen(q, size_t(n) * q_stride, widened_);
  for (int h = 0; h < num_heads_; ++h) add_gram(widened_.data() + size_t(h) * d, n, d, q_stride, qk_gram(layer, h / group));
  widen(k, size_t(n) * kv_stride, widened_);
  for (int g = 0; g < num_kv_heads_; ++g) add_gram(widened_.data() + size_t(g) * d, n, d, kv_stride, qk_gram(layer, g));
  widen(v, size_t(n) * kv_stride, widened_);
  for (int g = 0; g < num_kv_heads_; ++g) add_gram(widened_.data() + size_t(g) * d, n, d, kv_stride, vw_gram(layer, g));
  if (layer == 0) tokens_seen_ += n;
}

void ZackCalibrator::add_output_projection(int layer, const float* o_proj, int hidden) {
  const int d = head_dim_, group = num_heads_ / num_kv_heads_, stride = num_heads_ * d;
  widen(o_proj, size_t(hidden) * stride, widened_);
  // Head h's columns of o_proj are W_L^h transposed (§4.2): rows of the stack are its `hidden` rows.
  for (int h = 0; h < num_heads_; ++h) add_gram(widened_.data() + size_t(h) * d, hidden, d, stride, vw_gram(layer, h / group));
}

Expected<ZackCalibration> ZackCalibrator::finish(const std::string& model_identity, const std::string& source) const {
  ZackCalibration c;
  c.num_layers = num_layers_;
  c.num_kv_heads = num_kv_heads_;
  c.head_dim = head_dim_;
  c.model_identity = model_identity;
  c.calibration_tokens = tokens_seen_;
  c.source = source;
  const size_t d = size_t(head_dim_);
  c.qk_basis.resize(qk_gram_.size());
  c.vw_basis.resize(vw_gram_.size());
  c.qk_singular_values.resize(size_t(num_layers_) * num_kv_heads_ * d);
  c.vw_singular_values.resize(c.qk_singular_values.size());
  for (int l = 0; l < num_layers_; ++l) {
    for (int g = 0; g < num_kv_heads_; ++g) {
      const size_t head = size_t(l) * num_kv_heads_ + size_t(g);
      SLIMKV_RETURN_IF_ERROR(decompose(qk_gram_.data() + gram_offset(l, g), head_dim_, c.qk_basis.data() + head * d * d,
                                       c.qk_singular_values.data() + head * d));
      SLIMKV_RETURN_IF_ERROR(decompose(vw_gram_.data() + gram_offset(l, g), head_dim_, c.vw_basis.data() + head * d * d,
                                       c.vw_singular_values.data() + head * d));
    }
  }
  return c;
}

}  // namespace slimkv
