// The engine's device "cuda": the model uploaded to the GPU (model/cuda/llama_cuda.h), a session's
// sequence a sequence of its paged KV cache.
#include <algorithm>
#include <map>
#include <vector>

#include "engine/device_model.h"
#include "engine/sampler.h"
#include "kv/codec/hack.h"
#include "kv/codec/quant.h"
#include "backend/cuda/kvpr_profiler.h"
#include "kv/kv_factory.h"
#include "model/cuda/llama_cuda.h"
#include "model/llama.h"
#include "slimkv/engine.h"

namespace slimkv {
namespace {

class CudaDeviceModel : public DeviceModel {
 public:
  CudaDeviceModel(std::unique_ptr<cuda::CudaLlamaModel> model, std::string kv_description)
      : model_(std::move(model)), kv_description_(std::move(kv_description)) {}

  int context_tokens() const override { return model_->context_tokens(); }
  std::string kv_description() const override { return kv_description_; }

  Status add_sequence(SequenceId id, const SamplingParams& sampling) override {
    SLIMKV_ASSIGN_OR_RETURN(int sequence, model_->add_sequence());
    sequences_[id] = {sequence, sampling};
    return Status::ok();
  }
  void remove_sequence(SequenceId id) override {
    model_->remove_sequence(sequences_.at(id).index);
    sequences_.erase(id);
  }
  int num_tokens(SequenceId id) const override { return model_->num_tokens(sequences_.at(id).index); }

  Status step(std::span<const DeviceStepItem> items, StepResult& result) override {
    std::vector<cuda::SequenceTokens> batch;
    bool all_logits = false, all_sample = true;
    for (const DeviceStepItem& item : items) {
      batch.push_back({sequences_.at(item.sequence).index, item.tokens});
      all_logits = all_logits || item.output == StepOutput::kAllLogits;
      all_sample = all_sample && item.output == StepOutput::kSample;
    }
    const size_t vocab = size_t(model_->config().vocab_size);
    result.vocab = int(vocab);
    result.first_row.assign(items.size(), -1);
    result.tokens.assign(items.size(), -1);
    result.logits.clear();
    if (all_sample) {  // only the ids come back from the GPU
      std::vector<cuda::RowSampling> sampling;
      for (const DeviceStepItem& item : items) {
        const SamplingParams& p = sequences_.at(item.sequence).sampling;
        const int position = num_tokens(item.sequence) + int(item.tokens.size());
        sampling.push_back({p.temperature, p.top_k, p.top_p, p.seed, uint64_t(position)});
      }
      return model_->step_sample(batch, sampling, result.tokens);
    }
    SLIMKV_RETURN_IF_ERROR(model_->step(batch, all_logits, logits_));
    // logits_: every token's row (all_logits) or each item's last row; keep the rows asked for.
    size_t device_row = 0;
    int64_t rows = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      const DeviceStepItem& item = items[i];
      const size_t item_rows = all_logits ? item.tokens.size() : 1;
      const size_t keep = item.output == StepOutput::kAllLogits ? item_rows : item.output == StepOutput::kNone ? 0 : 1;
      const size_t first = device_row + item_rows - keep;
      if (keep > 0) {
        result.first_row[i] = rows;
        result.logits.insert(result.logits.end(), logits_.begin() + ptrdiff_t(first * vocab),
                             logits_.begin() + ptrdiff_t((first + keep) * vocab));
        rows += int64_t(keep);
      }
      if (item.output == StepOutput::kSample) {
        result.tokens[i] = sampler_.sample(result.logits_of(i), sequences_.at(item.sequence).sampling,
                                           num_tokens(item.sequence));
      }
      device_row += item_rows;
    }
    return Status::ok();
  }

  KvBudget kv_budget() const override {
    KvBudget budget;
    budget.block_tokens = cuda::kCudaBlockTokens;
    budget.total_blocks = model_->kv_cache_blocks();
    budget.free_blocks = model_->free_kv_blocks();
    budget.bytes_per_block = budget.total_blocks ? model_->kv_cache_bytes() / size_t(budget.total_blocks) : 0;
    return budget;
  }
  int64_t sequence_blocks(SequenceId id) const override {
    return (num_tokens(id) + cuda::kCudaBlockTokens - 1) / cuda::kCudaBlockTokens;
  }

  Status export_kv(SequenceId, std::string_view, std::vector<uint8_t>&) const override {
    return error("exporting a sequence's KV runs on device 'cpu' only in this build");
  }
  Status import_kv(SequenceId, std::span<const uint8_t>, std::string_view source, std::string_view) override {
    return error("kv transfer '", source, "': importing KV runs on device 'cpu' only in this build");
  }

  const KvStore* kv_store(SequenceId) const override { return nullptr; }
  Status set_observer(SequenceId, ForwardObserver*) override {
    return error("observing the forward pass (fidelity, calibration) runs on device 'cpu' only");
  }

 private:
  struct Sequence {
    int index = 0;  // in the GPU model
    SamplingParams sampling;
  };
  std::unique_ptr<cuda::CudaLlamaModel> model_;
  std::string kv_description_;
  std::map<SequenceId, Sequence> sequences_;
  std::vector<float> logits_;
  Sampler sampler_;
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
  options.max_sequences = config.max_sequences;
  options.max_step_tokens = std::max(config.prefill_chunk_tokens, config.max_sequences);
  options.kv_cache_bytes = config.kv_cache_bytes;
  SLIMKV_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaLlamaModel> gpu_model,
                          cuda::CudaLlamaModel::upload(model.config(), model.weights(), options));
  // The GPU keeps dense blocks in FP16, whatever dtype the CPU's dense codec would use.
  const std::string description = pipeline.codec->describe().starts_with("dense")
                                      ? str_cat("dense:dtype=f16", pipeline.describe().substr(pipeline.codec->describe().size()))
                                      : pipeline.describe();
  return std::unique_ptr<DeviceModel>(new CudaDeviceModel(std::move(gpu_model), description));
}

}  // namespace slimkv
