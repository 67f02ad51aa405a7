#include "kv/kv_factory.h"

#include "attention/cpu/dense_block_attention.h"
#include "kv/codec/dense.h"
#include "kv/stage_options.h"

namespace slimkv {
namespace {

constexpr const char* kKnownStages = "dense";
constexpr const char* kKnownTiers = "fast";

DType parse_dtype_name(const std::string& name) {
  return name == "f16" ? DType::kF16 : name == "bf16" ? DType::kBF16 : DType::kF32;
}

}  // namespace

std::string KvPipeline::describe() const {
  return str_cat(codec->describe(), ",block=", block_tokens);
}

Expected<KvPipeline> make_kv_pipeline(const KvConfig& config) {
  KvPipeline pipeline;
  for (const KvStage& stage : config.stages) {
    StageOptions options(stage, config.spec);
    if (stage.name == "dense") {
      if (pipeline.codec) return error("KV spec '", config.spec, "': more than one codec stage");
      const std::string dtype = options.choice("dtype", "f32", {"f32", "f16", "bf16"});
      pipeline.block_tokens = options.integer("block", 64, {}, 1, kMaxBlockTokens);
      pipeline.codec = std::make_shared<DenseCodec>(parse_dtype_name(dtype));
    } else {
      return error("KV spec '", config.spec, "': unknown stage '", stage.name, "' (known: ", kKnownStages, ")");
    }
    SLIMKV_RETURN_IF_ERROR(options.finish());
  }
  if (!pipeline.codec) return error("KV spec '", config.spec, "': no codec stage (e.g. 'dense')");
  if (config.tier.name != "fast" || !config.tier.options.empty()) {
    return error("KV spec '", config.spec, "': unknown tier '", config.tier.name, "' (known: ", kKnownTiers, ")");
  }
  return pipeline;
}

Expected<KvPipeline> make_kv_pipeline(std::string_view spec) {
  SLIMKV_ASSIGN_OR_RETURN(KvConfig config, parse_kv_spec(spec));
  return make_kv_pipeline(config);
}

}  // namespace slimkv
