#include "slimkv/zack_ranks.h"

#include <algorithm>

namespace slimkv {

std::string ZackOptions::describe() const {
  const std::string amount =
      target_compression > 0 ? str_cat("rate=", target_compression)
                             : str_cat("r=", removal_rate, v_removal_rate >= 0 ? str_cat(",vr=", v_removal_rate) : "");
  return str_cat("zack:", amount, ",align=", align, calibration_path.empty() ? "" : ",calib=", calibration_path);
}

int zack_rank(const float* singular_values, int head_dim, double removal_rate, int align) {
  int kept = head_dim;
  if (removal_rate > 0) {
    double total = 0;
    for (int i = 0; i < head_dim; ++i) total += double(singular_values[i]);
    double removed = 0;
    while (kept > 1 && removed + double(singular_values[kept - 1]) <= removal_rate * total) {
      removed += double(singular_values[kept - 1]);
      --kept;
    }
  }
  return std::min(head_dim, (kept + align - 1) / align * align);
}

double ZackRanks::kv_compression() const {
  double stored = 0;
  for (size_t i = 0; i < k_ranks.size(); ++i) stored += k_ranks[i] + v_ranks[i];
  return 1.0 - stored / (2.0 * double(k_ranks.size()) * head_dim);
}

ZackRanks select_zack_ranks(const ZackCalibration& c, double removal_rate, double v_removal_rate, int align) {
  ZackRanks ranks{c.num_layers, c.num_kv_heads, c.head_dim, removal_rate, v_removal_rate, {}, {}};
  for (int l = 0; l < c.num_layers; ++l) {
    for (int g = 0; g < c.num_kv_heads; ++g) {
      ranks.k_ranks.push_back(zack_rank(c.qk_singular_values_of(l, g), c.head_dim, removal_rate, align));
      ranks.v_ranks.push_back(zack_rank(c.vw_singular_values_of(l, g), c.head_dim, v_removal_rate, align));
    }
  }
  return ranks;
}

Expected<ZackRanks> ranks_for_compression(const ZackCalibration& c, double target_compression, int align) {
  const auto ranks_at = [&](double r) { return select_zack_ranks(c, r, r, align); };
  const double most = ranks_at(1.0).kv_compression();
  if (most < target_compression) {
    return error("ZACK cannot compress this model's KV by ", target_compression, " with align=", align,
                 ": keeping one aligned dim per head gives ", most);
  }
  double low = 0.0, high = 1.0;  // compression(low) < target <= compression(high)
  if (ranks_at(0.0).kv_compression() >= target_compression) high = 0.0;
  for (int step = 0; step < 60 && high > 0; ++step) {
    const double middle = 0.5 * (low + high);
    (ranks_at(middle).kv_compression() >= target_compression ? high : low) = middle;
  }
  return ranks_at(high);
}

Expected<ZackRanks> select_zack_ranks(const ZackCalibration& calibration, const ZackOptions& options) {
  if (options.target_compression > 0) return ranks_for_compression(calibration, options.target_compression, options.align);
  const double v_rate = options.v_removal_rate >= 0 ? options.v_removal_rate : options.removal_rate;
  return select_zack_ranks(calibration, options.removal_rate, v_rate, options.align);
}

}  // namespace slimkv
