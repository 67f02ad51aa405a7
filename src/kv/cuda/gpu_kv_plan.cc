#include "kv/cuda/gpu_kv_plan.h"

#include "kv/codec/gpu_block_format.h"
#include "kv/cuda/kvpr_profiler.h"

namespace slimkv::cuda {
namespace {

// The host tiers: @offload (streamed, row by row) or @kvpr, whose automatic split needs this machine's
// link and GEMM rates (the profiler's, cached in a file).
Expected<std::optional<KvTierOptions>> tier_options(const KvPipeline& pipeline, int hidden, int kv_dim) {
  if (!pipeline.offload && !pipeline.kvpr) return std::optional<KvTierOptions>();
  if (pipeline.offload && pipeline.offload->options_given) {
    return error("the offload tier on device 'cuda' streams every block from pinned host memory: its CPU options ",
                 "(cache, policy, dir) do not apply there; write '@offload'");
  }
  KvTierOptions tier;
  if (const std::optional<KvprConfig>& kvpr = pipeline.kvpr) {
    tier.recompute = true;
    tier.split = kvpr->split;
    tier.micro_batches = kvpr->micro_batches;
    if (kvpr->split < 0) {
      const std::string path = kvpr->profile.empty() ? default_kvpr_profile_path() : kvpr->profile;
      SLIMKV_ASSIGN_OR_RETURN(KvprProfile profile,
                              load_or_measure_kvpr_profile(path, hidden, 2 * kv_dim, DType::kF16, kvpr->reprofile));
      tier.link_bytes_per_s = profile.link_bytes_per_s;
      tier.gemm_flops_per_s = profile.gemm_flops_per_s;
    }
  }
  return std::optional<KvTierOptions>(tier);
}

}  // namespace

Expected<GpuKvPlan> plan_gpu_kv(const KvPipeline& pipeline, const std::string& spec, int hidden, int kv_dim) {
  const auto refuse = [&](const std::string& what) {
    return error("KV spec '", spec, "': ", what, " does not run on device 'cuda' yet (there: dense, or hack / quant ",
                 "with kbits = vbits, pi=64, or zack over dense, hack or quant; the pq selector over dense, hack or ",
                 "quant; the offload and kvpr tiers)");
  };
  const PqOptions* pq = pipeline.selector ? pipeline.selector->pq_options() : nullptr;
  if (pipeline.selector && pq == nullptr) return refuse(str_cat("the selector ", pipeline.selector->describe()));
  if (pipeline.block_tokens != kCudaBlockTokens) return refuse(str_cat("a block of ", pipeline.block_tokens, " tokens"));
  if (pipeline.sink_tokens > 0) return refuse(str_cat("sinks=", pipeline.sink_tokens, " (FP16 sink tokens)"));
  if (pipeline.recent_tokens > 0) return refuse(str_cat("window=", pipeline.recent_tokens, " (an FP16 recent window)"));
  const GpuBlockFormat format = pipeline.codec->gpu_block_format();
  GpuKvPlan plan;
  plan.pipeline = pipeline;
  plan.rotate_heads = pipeline.hadamard;
  switch (format.kind) {
    case GpuBlockFormat::Kind::kNone:
      return refuse(format.unsupported);
    case GpuBlockFormat::Kind::kFp16:
      break;
    case GpuBlockFormat::Kind::kQuantized:
      if (!pipeline.exact_prefill) return refuse("prefill=quantized (the GPU's prefill attends exactly)");
      plan.options.quantized = QuantizedKvOptions{format.quantization, format.integer_attention, pipeline.seed};
      break;
  }
  if (pipeline.zack) {
    // The kernels read ZACK's heads at their own dims in HACK's layout (per-token K, per-column V) only.
    const QuantizationConfig& q = format.quantization;
    if (plan.options.quantized && (q.k_per_channel || q.v_per_token)) {
      return refuse("zack followed by a codec with klayout=channel or vlayout=token");
    }
    if (pipeline.kvpr) return refuse("zack with the kvpr tier (it recomputes full-width K/V; zack@offload runs)");
    if (pipeline.offload && plan.options.quantized) return refuse("zack followed by a quantizing codec with @offload");
    if (pipeline.hadamard && !plan.options.quantized) return refuse("zack over dense with rot=hadamard");
    plan.options.zack = ZackKvOptions{};  // the ranks and bases: the model's, once it has folded them
    // rot=hadamard turns each head at its ranks (the zack cache does, as the CPU store), not at head_dim.
    plan.options.zack->rotate = pipeline.hadamard;
    plan.rotate_heads = false;
  }
  if (format.runs_as) plan.pipeline.codec = format.runs_as;
  if (pq != nullptr) {  // its own offload: the selected tokens read from pinned host memory
    if (pipeline.zack || pipeline.kvpr) return refuse("pq with zack or kvpr");
    // rot=hadamard: the model turns q, k and v (rotate_heads), so the index clusters the rotated keys
    // and the selection scores them with rotated queries, as the CPU store does; over FP16 pages the
    // rotation is HACK's and stays refused.
    if (pipeline.hadamard && !plan.options.quantized) return refuse("pq over dense with rot=hadamard");
    plan.options.pq = PqKvOptions{*pq, pipeline.offload.has_value(), pipeline.seed};
    return plan;
  }
  SLIMKV_ASSIGN_OR_RETURN(plan.options.tier, tier_options(pipeline, hidden, kv_dim));
  return plan;
}

}  // namespace slimkv::cuda
