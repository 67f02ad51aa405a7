#include "slimkv/zack_calibration.h"

#include <cmath>
#include <cstring>
#include <map>
#include <span>

#include "tensor/safetensors.h"

namespace slimkv {
namespace {

std::span<const uint8_t> bytes_of(const std::vector<float>& values) {
  return {reinterpret_cast<const uint8_t*>(values.data()), values.size() * sizeof(float)};
}

// The F32 tensor `name` of exactly `shape`, copied out of the file.
Expected<std::vector<float>> read_tensor(const SafetensorsFile& file, const std::string& name,
                                         const std::vector<int64_t>& shape) {
  const TensorInfo* tensor = file.find(name);
  if (!tensor) return error(file.path(), ": no tensor '", name, "' (not a ZACK calibration file?)");
  if (tensor->stored_dtype != "F32" || tensor->shape != shape) {
    std::string expected = "F32 [", found = tensor->stored_dtype + " [";
    for (int64_t d : shape) expected += str_cat(d, " ");
    for (int64_t d : tensor->shape) found += str_cat(d, " ");
    return error(file.path(), ": tensor '", name, "' is ", found, "], expected ", expected, "]");
  }
  std::vector<float> values(size_t(tensor->num_elements()));
  std::memcpy(values.data(), tensor->data, values.size() * sizeof(float));
  return values;
}

Expected<std::string> read_metadata(const SafetensorsFile& file, const std::string& key) {
  const auto found = file.metadata().find(key);
  if (found == file.metadata().end()) return error(file.path(), ": metadata has no '", key, "'");
  return found->second;
}

Expected<int> read_dim(const SafetensorsFile& file, const std::string& key) {
  SLIMKV_ASSIGN_OR_RETURN(std::string text, read_metadata(file, key));
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < 1 || value > (1 << 20)) {
    return error(file.path(), ": metadata '", key, "' = '", text, "' is not a positive integer");
  }
  return int(value);
}

// Mean |a| and mean |a - sign·b| over the bases of every layer and head, b's rows signed to agree with a's.
void mean_abs_and_difference(const std::vector<float>& a, const std::vector<float>& b, int head_dim, double& epsilon,
                          double& delta) {
  double sum_abs = 0, sum_diff = 0;
  const size_t d = size_t(head_dim);
  for (size_t row = 0; row < a.size() / d; ++row) {
    const float* x = a.data() + row * d;
    const float* y = b.data() + row * d;
    double dot = 0;
    for (size_t c = 0; c < d; ++c) dot += double(x[c]) * double(y[c]);
    const double sign = dot < 0 ? -1.0 : 1.0;
    for (size_t c = 0; c < d; ++c) {
      sum_abs += std::fabs(double(x[c]));
      sum_diff += std::fabs(double(x[c]) - sign * double(y[c]));
    }
  }
  epsilon = sum_abs / double(a.size());
  delta = sum_diff / double(a.size());
}

// Mean over heads of: energy of b's stack (basis rows b_i, singular values s_i) along a's first k rows,
// over the energy along b's own first k rows (the most any k directions hold).
double energy_captured(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& s,
                       int head_dim) {
  const size_t d = size_t(head_dim), k = d / 2, heads = s.size() / d;
  double sum = 0;
  for (size_t head = 0; head < heads; ++head) {
    const float* a_rows = a.data() + head * d * d;
    const float* b_rows = b.data() + head * d * d;
    const float* values = s.data() + head * d;
    double captured = 0, best = 0;
    for (size_t i = 0; i < d; ++i) {
      const double energy = double(values[i]) * double(values[i]);
      if (i < k) best += energy;
      for (size_t j = 0; j < k; ++j) {
        double dot = 0;
        for (size_t c = 0; c < d; ++c) dot += double(a_rows[j * d + c]) * double(b_rows[i * d + c]);
        captured += energy * dot * dot;
      }
    }
    sum += best > 0 ? captured / best : 1.0;
  }
  return sum / double(heads);
}

}  // namespace

Status ZackCalibration::write(const std::string& path) const {
  const int64_t l = num_layers, g = num_kv_heads, d = head_dim;
  const std::vector<TensorToWrite> tensors = {
      {"qk_basis", DType::kF32, {l, g, d, d}, bytes_of(qk_basis)},
      {"vw_basis", DType::kF32, {l, g, d, d}, bytes_of(vw_basis)},
      {"qk_singular_values", DType::kF32, {l, g, d}, bytes_of(qk_singular_values)},
      {"vw_singular_values", DType::kF32, {l, g, d}, bytes_of(vw_singular_values)},
  };
  const std::map<std::string, std::string> metadata = {
      {"format", kZackCalibrationFormat},
      {"model_identity", model_identity},
      {"calibration_tokens", std::to_string(calibration_tokens)},
      {"source", source},
      {"num_layers", std::to_string(num_layers)},
      {"num_kv_heads", std::to_string(num_kv_heads)},
      {"head_dim", std::to_string(head_dim)},
  };
  return write_safetensors(path, tensors, metadata);
}

Expected<ZackCalibration> ZackCalibration::load(const std::string& path, const std::string& expected_identity) {
  SLIMKV_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
  SLIMKV_ASSIGN_OR_RETURN(std::string format, read_metadata(file, "format"));
  if (format != kZackCalibrationFormat) {
    return error(path, ": format '", format, "' is not '", kZackCalibrationFormat, "'");
  }
  ZackCalibration c;
  SLIMKV_ASSIGN_OR_RETURN(c.model_identity, read_metadata(file, "model_identity"));
  if (!expected_identity.empty() && c.model_identity != expected_identity) {
    return error(path, ": this ZACK calibration was made for another model (identity ", c.model_identity,
                 "; the model being loaded is ", expected_identity,
                 "): run `slimkv calibrate --model DIR --text FILE --out FILE` for this model");
  }
  SLIMKV_ASSIGN_OR_RETURN(std::string tokens, read_metadata(file, "calibration_tokens"));
  c.calibration_tokens = std::strtoll(tokens.c_str(), nullptr, 10);
  SLIMKV_ASSIGN_OR_RETURN(c.source, read_metadata(file, "source"));
  SLIMKV_ASSIGN_OR_RETURN(c.num_layers, read_dim(file, "num_layers"));
  SLIMKV_ASSIGN_OR_RETURN(c.num_kv_heads, read_dim(file, "num_kv_heads"));
  SLIMKV_ASSIGN_OR_RETURN(c.head_dim, read_dim(file, "head_dim"));
  const int64_t l = c.num_layers, g = c.num_kv_heads, d = c.head_dim;
  SLIMKV_ASSIGN_OR_RETURN(c.qk_basis, read_tensor(file, "qk_basis", {l, g, d, d}));
  SLIMKV_ASSIGN_OR_RETURN(c.vw_basis, read_tensor(file, "vw_basis", {l, g, d, d}));
  SLIMKV_ASSIGN_OR_RETURN(c.qk_singular_values, read_tensor(file, "qk_singular_values", {l, g, d}));
  SLIMKV_ASSIGN_OR_RETURN(c.vw_singular_values, read_tensor(file, "vw_singular_values", {l, g, d}));
  for (const std::vector<float>* values : {&c.qk_basis, &c.vw_basis, &c.qk_singular_values, &c.vw_singular_values}) {
    for (float x : *values) {
      if (!std::isfinite(x)) return error(path, ": holds a non-finite value");
    }
  }
  return c;
}

Expected<RotationAgreement> compare_rotations(const ZackCalibration& a, const ZackCalibration& b) {
  if (a.num_layers != b.num_layers || a.num_kv_heads != b.num_kv_heads || a.head_dim != b.head_dim) {
    return error("ZACK calibrations of different shapes: ", a.num_layers, "x", a.num_kv_heads, "x", a.head_dim,
                 " and ", b.num_layers, "x", b.num_kv_heads, "x", b.head_dim);
  }
  RotationAgreement agreement;
  mean_abs_and_difference(a.qk_basis, b.qk_basis, a.head_dim, agreement.qk_epsilon, agreement.qk_delta);
  mean_abs_and_difference(a.vw_basis, b.vw_basis, a.head_dim, agreement.vw_epsilon, agreement.vw_delta);
  agreement.qk_energy_captured = energy_captured(a.qk_basis, b.qk_basis, b.qk_singular_values, a.head_dim);
  agreement.vw_energy_captured = energy_captured(a.vw_basis, b.vw_basis, b.vw_singular_values, a.head_dim);
  return agreement;
}

}  // namespace slimkv
