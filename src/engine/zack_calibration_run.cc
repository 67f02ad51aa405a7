#include "slimkv/zack_calibration_run.h"

#include <algorithm>

#include "backend/cpu/vec_ops.h"
#include "engine/zack_calibrator.h"
#include "kv/kv_factory.h"
#include "model/llama.h"

namespace slimkv {

Expected<ZackCalibration> run_zack_calibration(Engine& engine, std::span<const int32_t> tokens,
                                               const ZackCalibrationRun& run) {
  if (engine.kv_pipeline().zack) return error("calibrating ZACK needs an engine without a zack KV stage");
  if (tokens.empty()) return error("calibrating ZACK: no tokens");
  const ModelConfig& config = engine.model_config();
  ZackCalibrator calibrator(int(config.num_layers), int(config.num_heads), int(config.num_kv_heads),
                            int(config.head_dim));
  const size_t window = size_t(run.window_tokens > 0 ? run.window_tokens : config.max_position_embeddings);
  for (size_t first = 0; first < tokens.size(); first += window) {
    auto session = engine.new_session();  // each window is a sequence of its own
    SLIMKV_RETURN_IF_ERROR(session->set_observer(&calibrator));
    SLIMKV_RETURN_IF_ERROR(session->prefill(tokens.subspan(first, std::min(window, tokens.size() - first))).status());
    if (run.progress) run.progress(int64_t(std::min(first + window, tokens.size())), int64_t(tokens.size()));
  }
  // The W_O half of each V–W_O stack (§4.3, Fig. 9).
  const int hidden = int(config.hidden_size);
  std::vector<float> o_proj(size_t(hidden) * size_t(config.q_dim()));
  for (int l = 0; l < int(config.num_layers); ++l) {
    const WeightMatrix& wo = engine.model().weights().layers[size_t(l)].wo;
    widen_rows(wo, 0, wo.rows, o_proj.data());
    calibrator.add_output_projection(l, o_proj.data(), hidden);
  }
  SLIMKV_ASSIGN_OR_RETURN(std::string identity, engine.model().identity());
  return calibrator.finish(identity, run.source);
}

}  // namespace slimkv
