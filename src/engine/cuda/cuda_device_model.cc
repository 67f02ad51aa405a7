// The engine's device "cuda": the model uploaded to the GPU (model/cuda/llama_cuda.h), a session's
// sequence a sequence of its paged KV cache.
#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/device_model.h"
#include "kv/cuda/gpu_kv_plan.h"
#include "model/cuda/llama_cuda.h"
#include "model/llama.h"
#include "slimkv/engine.h"

namespace slimkv {
namespace {

class CudaSequence : public DeviceSequence {
 public:
  CudaSequence(cuda::CudaLlamaModel& model, int sequence) : model_(model), sequence_(sequence) {}
  ~CudaSequence() override { model_.remove_sequence(sequence_); }

  int num_tokens() const override { return model_.num_tokens(sequence_); }
  int sequence() const { return sequence_; }

  Status run(std::span<const int32_t> tokens, bool all_logits, float* logits) override {
    const cuda::SequenceTokens step{sequence_, tokens};
    SLIMKV_RETURN_IF_ERROR(model_.step(std::span(&step, 1), all_logits, logits_));
    std::memcpy(logits, logits_.data(), logits_.size() * sizeof(float));
    return Status::ok();
  }

 private:
  cuda::CudaLlamaModel& model_;
  int sequence_;
  std::vector<float> logits_;
};

class CudaDeviceModel : public DeviceModel {
 public:
  explicit CudaDeviceModel(std::unique_ptr<cuda::CudaLlamaModel> model) : model_(std::move(model)) {}

  int context_tokens() const override { return model_->context_tokens(); }

  Expected<std::unique_ptr<DeviceSequence>> new_sequence() override {
    SLIMKV_ASSIGN_OR_RETURN(int sequence, model_->add_sequence());
    return std::unique_ptr<DeviceSequence>(new CudaSequence(*model_, sequence));
  }

  Status decode_batch(std::span<DeviceSequence* const> sequences, std::span<const int32_t> tokens,
                      float* logits) override {
    std::vector<cuda::SequenceTokens> step;
    for (size_t i = 0; i < sequences.size(); ++i) {
      // This model made every DeviceSequence of its engine.
      step.push_back({static_cast<const CudaSequence*>(sequences[i])->sequence(), tokens.subspan(i, 1)});
    }
    SLIMKV_RETURN_IF_ERROR(model_->step(step, /*all_logits=*/false, logits_));
    std::memcpy(logits, logits_.data(), logits_.size() * sizeof(float));
    return Status::ok();
  }

 private:
  std::unique_ptr<cuda::CudaLlamaModel> model_;
  std::vector<float> logits_;
};

}  // namespace

Expected<std::unique_ptr<DeviceModel>> load_cuda_model(const LlamaModel& model, const KvPipeline& pipeline,
                                                       const EngineConfig& config) {
  SLIMKV_ASSIGN_OR_RETURN(cuda::GpuKvPlan plan, cuda::plan_gpu_kv(pipeline, config.kv_spec, int(model.config().hidden_size),
                                                                  int(model.config().kv_dim())));
  cuda::CudaModelOptions options;
  options.quantized_kv = plan.options.quantized;
  options.tier = plan.options.tier;
  options.rotate_heads = plan.rotate_heads;
  options.max_sequences = config.gpu_max_sessions;
  options.max_step_tokens = std::max(config.prefill_chunk_tokens, config.gpu_max_sessions);
  options.kv_cache_bytes = config.gpu_kv_cache_bytes;
  SLIMKV_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaLlamaModel> gpu_model,
                          cuda::CudaLlamaModel::upload(model.config(), model.weights(), options));
  return std::unique_ptr<DeviceModel>(new CudaDeviceModel(std::move(gpu_model)));
}

}  // namespace slimkv
