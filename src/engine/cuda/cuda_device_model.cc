// The engine's device "cuda": the model uploaded to the GPU (model/cuda/llama_cuda.h), a session's
// sequence a sequence of its paged KV cache.
#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/device_model.h"
#include "kv/codec/hack.h"
#include "kv/codec/quant.h"
#include "backend/cuda/kvpr_profiler.h"
#include "kv/kv_factory.h"
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

// What the GPU runs of a KV pipeline: `dense` (FP16 blocks), `hack` and `quant` with equal K/V bits,
// in blocks of 64 tokens, every token attended, in GPU memory or in a host tier; rot=hadamard or none.
Expected<std::optional<cuda::QuantizedKvOptions>> gpu_kv(const KvPipeline& pipeline, const std::string& spec) {
  const auto refuse = [&](const std::string& what) {
    return error("KV spec '", spec, "': ", what, " does not run on device 'cuda' yet (there: dense, or hack / quant ",
                 "with kbits = vbits, pi=64; no selector or zack; the offload and kvpr tiers)");
  };
  if (pipeline.selector) return refuse("a selector");
  if (pipeline.zack) return refuse("zack");
  if (pipeline.block_tokens != cuda::kCudaBlockTokens) return refuse(str_cat("a block of ", pipeline.block_tokens, " tokens"));
  const Codec* codec = pipeline.codec.get();
  if (codec->describe() == "dense:dtype=bf16") return refuse("dtype=bf16 (the GPU keeps FP16 blocks)");
  if (codec->describe().starts_with("dense")) return std::optional<cuda::QuantizedKvOptions>();
  const auto* hack = dynamic_cast<const HackCodec*>(codec);
  const auto* quant = dynamic_cast<const QuantCodec*>(codec);
  if (hack == nullptr && quant == nullptr) return refuse(codec->describe());
  const QuantizationConfig& config = hack ? hack->config() : quant->config();
  if (config.k_bits != config.v_bits) return refuse("kbits != vbits");
  if (!config.store_sums || !config.keep_open_exact) return refuse("the se=off / rqe=off ablations");
  if (!pipeline.exact_prefill) return refuse("prefill=quantized (the GPU's prefill attends exactly)");
  return std::optional<cuda::QuantizedKvOptions>(cuda::QuantizedKvOptions{config, hack != nullptr, pipeline.seed});
}

// The host tiers: @offload (streamed, row by row) or @kvpr, whose automatic split needs this machine's
// link and GEMM rates (the profiler's, cached in a file).
Expected<std::optional<cuda::KvTierOptions>> gpu_tier(const KvPipeline& pipeline, const ModelConfig& model) {
  if (!pipeline.offload && !pipeline.kvpr) return std::optional<cuda::KvTierOptions>();
  if (pipeline.offload && pipeline.offload->options_given) {
    return error("the offload tier on device 'cuda' streams every block from pinned host memory: its CPU options ",
                 "(cache, policy, dir) do not apply there; write '@offload'");
  }
  cuda::KvTierOptions tier;
  if (const std::optional<KvprConfig>& kvpr = pipeline.kvpr) {
    tier.recompute = true;
    tier.split = kvpr->split;
    tier.micro_batches = kvpr->micro_batches;
    if (kvpr->split < 0) {
      const std::string path = kvpr->profile.empty() ? cuda::default_kvpr_profile_path() : kvpr->profile;
      SLIMKV_ASSIGN_OR_RETURN(cuda::KvprProfile profile,
                              cuda::load_or_measure_kvpr_profile(path, int(model.hidden_size), int(2 * model.kv_dim()),
                                                                 DType::kF16, kvpr->reprofile));
      tier.link_bytes_per_s = profile.link_bytes_per_s;
      tier.gemm_flops_per_s = profile.gemm_flops_per_s;
    }
  }
  return std::optional<cuda::KvTierOptions>(tier);
}

}  // namespace

Expected<std::unique_ptr<DeviceModel>> load_cuda_model(const LlamaModel& model, const KvPipeline& pipeline,
                                                       const EngineConfig& config) {
  cuda::CudaModelOptions options;
  SLIMKV_ASSIGN_OR_RETURN(options.quantized_kv, gpu_kv(pipeline, config.kv_spec));
  SLIMKV_ASSIGN_OR_RETURN(options.tier, gpu_tier(pipeline, model.config()));
  options.rotate_heads = pipeline.hadamard;
  options.max_sequences = config.gpu_max_sessions;
  options.max_step_tokens = std::max(config.prefill_chunk_tokens, config.gpu_max_sessions);
  options.kv_cache_bytes = config.gpu_kv_cache_bytes;
  SLIMKV_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaLlamaModel> gpu_model,
                          cuda::CudaLlamaModel::upload(model.config(), model.weights(), options));
  return std::unique_ptr<DeviceModel>(new CudaDeviceModel(std::move(gpu_model)));
}

}  // namespace slimkv
