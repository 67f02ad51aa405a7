#include "kv/kv_factory.h"

#include <algorithm>
#include <charconv>
#include <functional>
#include <numeric>

#include "attention/cpu/dense_block_attention.h"
#include "kv/codec/dense.h"
#include "kv/codec/hack.h"
#include "kv/codec/quant.h"
#include "kv/stage_options.h"

namespace slimkv {
namespace {

constexpr const char* kKnownStages = "all, pq, oracle, zack, dense, hack, quant, kivi";
constexpr const char* kKnownTiers = "fast, offload, kvpr";

DType parse_dtype_name(const std::string& name) {
  return name == "f16" ? DType::kF16 : name == "bf16" ? DType::kBF16 : DType::kF32;
}

// The options hack and quant share: bit widths, partition (block) size, rounding, seed.
QuantizationConfig read_quantization(StageOptions& options, KvPipeline& pipeline, bool with_ablations) {
  QuantizationConfig config;
  const int bits = options.integer("bits", 2, {2, 4, 8});
  config.k_bits = options.integer("kbits", bits, {2, 4, 8});
  config.v_bits = options.integer("vbits", bits, {2, 4, 8});
  pipeline.block_tokens = options.integer("pi", 64, {32, 64, 128});
  // Nearest by default, where HACK rounds stochastically: on the bundled model at 2 bits nearest
  // rounding costs +19% decode perplexity against stochastic's +88% (KL divergence 0.37 vs 1.07) and
  // keeps more pass keys (docs/hack.md). Stochastic rounding is unbiased per value, but attention
  // is a softmax over many values, where its extra variance costs more than rounding's bias.
  config.rounding = options.choice("round", "nearest", {"stochastic", "nearest"}) == "stochastic"
                        ? Rounding::kStochastic
                        : Rounding::kNearest;
  pipeline.seed = uint64_t(options.integer("seed", 0, {}, 0, 1 << 30));
  // Which values share a min and a scale (tensor/quantized_block.h): HACK's layout by default; KIVI's
  // (K per channel, V per token) keeps outlier channels of K from widening every token's range.
  config.k_per_channel = options.choice("klayout", "token", {"token", "channel"}) == "channel";
  config.v_per_token = options.choice("vlayout", "channel", {"channel", "token"}) == "token";
  if (config.k_per_channel) config.k_group = options.integer("kgroup", 0, {0, 16, 32, 64, 128});
  if (config.v_per_token) config.v_group = options.integer("vgroup", 0, {0, 16, 32, 64, 128});
  config.symmetric = options.choice("range", "asym", {"asym", "sym"}) == "sym";
  if (with_ablations) {
    options.integer("qbits", 8, {8});  // Q and P are 8-bit, as in HACK; named so specs can say so
    options.integer("pbits", 8, {8});
    config.store_sums = options.choice("se", "on", {"on", "off"}) == "on";
    config.keep_open_exact = options.choice("rqe", "on", {"on", "off"}) == "on";
  }
  return config;
}

// sinks=N and window=W (hack, quant, kivi): the tokens kept exact in FP16 besides the open block.
// window's bound keeps the store's unsealed rows (allocated per sequence) within a few MB on any model.
constexpr int kMaxRecentTokens = 4096;

Status read_exact_tokens(StageOptions& options, const QuantizationConfig& quantization, KvPipeline& pipeline,
                         const std::string& spec) {
  pipeline.sink_tokens = options.integer("sinks", 0, {}, 0, pipeline.block_tokens);
  pipeline.recent_tokens = options.integer("window", 0, {}, 0, kMaxRecentTokens);
  if (!quantization.keep_open_exact && (pipeline.sink_tokens > 0 || pipeline.recent_tokens > 0)) {
    return error("KV spec '", spec, "': rqe=off (the HACK/RQE ablation) keeps no token exact: not with sinks or window");
  }
  return Status::ok();
}

// A layer or head index as written in a spec; -1 if it is not a plain non-negative number.
int parse_index(std::string_view text) {
  int value = -1;
  const auto [end, status] = std::from_chars(text.data(), text.data() + text.size(), value);
  return status == std::errc() && end == text.data() + text.size() && !text.empty() ? value : -1;
}

std::string describe_heads(const std::vector<std::pair<int, int>>& heads) {
  std::string text;
  for (const auto& [layer, head] : heads) text += str_cat(text.empty() ? "" : "/", layer, ".", head);
  return text;
}

bool has_option(const KvStage& stage, std::string_view key) {
  for (const auto& [name, unused] : stage.options) {
    if (name == key) return true;
  }
  return false;
}

// hibits=B,hiheads=L.H/L.H (hack, quant): the heads whose blocks `make_codec` encodes at B bits. Which
// heads exist is the model's to say: Engine::load checks the list against it.
Status read_wide_heads(StageOptions& options, const KvStage& stage, const QuantizationConfig& quantization,
                       const std::function<std::shared_ptr<const Codec>(const QuantizationConfig&)>& make_codec,
                       KvPipeline& pipeline, const std::string& spec) {
  const int bits = options.integer("hibits", 0, {0, 4, 8});
  const std::string heads = options.text("hiheads", "");
  if (has_option(stage, "hibits") != has_option(stage, "hiheads")) {
    return error("KV spec '", spec, "': hibits (the wider bit width) and hiheads (the heads that get it, ",
                 "layer.head/layer.head...) go together");
  }
  if (bits == 0 || heads.empty()) return Status::ok();  // neither, or a value options.finish() reports
  if (bits < std::max(quantization.k_bits, quantization.v_bits) || bits == std::min(quantization.k_bits, quantization.v_bits)) {
    return error("KV spec '", spec, "': hibits=", bits, " must be wider than the codec's ", quantization.k_bits,
                 "-bit K / ", quantization.v_bits, "-bit V (and no narrower than either)");
  }
  for (std::string_view head : split_spec_text(heads, '/')) {
    const size_t dot = head.find('.');
    int layer = -1, kv_head = -1;
    if (dot != std::string_view::npos) {
      layer = parse_index(head.substr(0, dot));
      kv_head = parse_index(head.substr(dot + 1));
    }
    if (layer < 0 || kv_head < 0) {
      return error("KV spec '", spec, "': hiheads entry '", head, "' is not layer.head (e.g. hiheads=6.0/6.1)");
    }
    pipeline.wide_heads.emplace_back(layer, kv_head);
  }
  std::sort(pipeline.wide_heads.begin(), pipeline.wide_heads.end());
  if (std::adjacent_find(pipeline.wide_heads.begin(), pipeline.wide_heads.end()) != pipeline.wide_heads.end()) {
    return error("KV spec '", spec, "': hiheads names a head twice");
  }
  QuantizationConfig wide = quantization;
  wide.k_bits = wide.v_bits = bits;
  pipeline.wide_codec = make_codec(wide);
  pipeline.wide_bits = bits;
  return Status::ok();
}

// zack:r=0.05 (Eq. 6's removal rate; vr=R: V–W_O's own) or zack:rate=0.5 (overall KV compression,
// §5.2), align, calib.
Expected<ZackOptions> read_zack(StageOptions& options, const KvStage& stage, const std::string& spec) {
  if (has_option(stage, "r") && has_option(stage, "rate")) {
    return error("KV spec '", spec, "': zack takes r (singular-value removal rate) or rate (KV compression), not both");
  }
  ZackOptions zack;
  if (has_option(stage, "vr") && has_option(stage, "rate")) {
    return error("KV spec '", spec, "': zack's vr (V–W_O removal rate) goes with r, not with rate");
  }
  // r, vr and rate share one range: 1 would remove every singular value (rank 0), for each form alike.
  zack.removal_rate = options.number("r", zack.removal_rate, 0.0, 0.999);
  zack.v_removal_rate = options.number("vr", -1.0, 0.0, 0.999);
  zack.target_compression = options.number("rate", 0.0, 0.0, 0.999);
  zack.align = options.integer("align", 0, {}, 1, 1024);  // 0: as the codec after it stores dims (make_kv_pipeline)
  zack.calibration_path = options.text("calib", "");
  return zack;
}

// The multiple a quantizing codec stores per-head dims in: 4 (tensor/quantized_block.h), and whole
// groups of V dims where V shares its ranges per token.
int stored_dims_multiple(const QuantizationConfig& q) {
  return std::lcm(4, q.v_per_token && q.v_group > 0 ? q.v_group : 1);
}

}  // namespace

const Codec& KvPipeline::codec_of(int layer, int head) const {
  const bool wide = std::binary_search(wide_heads.begin(), wide_heads.end(), std::pair<int, int>(layer, head));
  return wide ? *wide_codec : *codec;
}

std::string KvPipeline::describe() const {
  return str_cat(selector ? selector->describe() + "+" : std::string(), zack ? zack->describe() + "+" : std::string(),
                 codec->describe(), codec->describe().starts_with("dense") ? ",block=" : ",pi=", block_tokens,
                 seed ? str_cat(",seed=", seed) : std::string(), hadamard ? ",rot=hadamard" : ",rot=none",
                 // How a prefill chunk reads the store, not what it stores: spelled out only when not the
                 // default, so that KV transfers (which match stores by this spec) keep their format.
                 codec->describe().starts_with("dense") || exact_prefill ? "" : ",prefill=quantized",
                 // Likewise spelled out only when set, so that the canonical spec of every spec without
                 // them (keys of KV transfers and of recorded results) stays as it was.
                 sink_tokens ? str_cat(",sinks=", sink_tokens) : std::string(),
                 recent_tokens ? str_cat(",window=", recent_tokens) : std::string(),
                 wide_heads.empty() ? std::string() : str_cat(",hibits=", wide_bits, ",hiheads=", describe_heads(wide_heads)),
                 offload ? str_cat("@offload:cache=", offload->cache_tokens, ",policy=",
                                   offload->policy == CachePolicy::kLfu ? "lfu" : "lru")
                         : std::string(),
                 kvpr ? str_cat("@kvpr:split=", kvpr->split < 0 ? std::string("auto") : str_cat(kvpr->split),
                                kvpr->micro_batches == 1 ? ",schedule=row" : str_cat(",schedule=column,batches=", kvpr->micro_batches))
                      : std::string());
}

Expected<KvPipeline> make_kv_pipeline(const KvConfig& config) {
  KvPipeline pipeline;
  OffloadConfig offload;
  int codec_dims_multiple = 1;  // what zack's ranks are rounded to when its spec does not say
  for (const KvStage& stage : config.stages) {
    StageOptions options(stage, config.spec);
    if (is_selector_stage(stage.name)) {
      if (pipeline.selector || pipeline.zack || pipeline.codec) {
        return error("KV spec '", config.spec, "': the selector comes first, once");
      }
      if (stage.name != "all") pipeline.selector = make_selector_factory(stage.name, options, offload);
      SLIMKV_RETURN_IF_ERROR(options.finish());
      continue;
    }
    if (stage.name == "zack") {  // a stage that changes dims; the codec after it encodes the reduced vectors
      if (pipeline.zack || pipeline.codec) return error("KV spec '", config.spec, "': zack must come before the codec, once");
      // The PQ index is built over keys of one width; ZACK gives every head its own.
      if (pipeline.selector) return error("KV spec '", config.spec, "': a selector with zack is not supported yet");
      SLIMKV_ASSIGN_OR_RETURN(pipeline.zack, read_zack(options, stage, config.spec));
      SLIMKV_RETURN_IF_ERROR(options.finish());
      continue;
    }
    // Quantized codecs rotate by default: on the bundled model at 2 bits the rotation cuts held-out
    // perplexity from 78.7 to 51.6 (stochastic rounding) and 37.4 to 35.4 (nearest); the current
    // ablation (decode perplexity +188% without, +89% with): docs/results/hack/README.md.
    const bool quantized = stage.name == "hack" || stage.name == "quant";
    pipeline.hadamard = options.choice("rot", quantized ? "hadamard" : "none", {"none", "hadamard"}) == "hadamard";
    if (stage.name == "dense") {
      if (pipeline.codec) return error("KV spec '", config.spec, "': more than one codec stage");
      const std::string dtype = options.choice("dtype", "f32", {"f32", "f16", "bf16"});
      pipeline.block_tokens = options.integer("block", 64, {}, 1, kMaxBlockTokens);
      pipeline.codec = std::make_shared<DenseCodec>(parse_dtype_name(dtype));
    } else if (stage.name == "kivi") {
      // KIVI (Liu et al., ICML 2024) as published: K per channel in groups of 32 tokens, V per token in
      // groups of 32 channels, asymmetric, round to nearest, no rotation (rot=hadamard may add it), the newest tokens in FP16 (the
      // open block: up to 127 here, KIVI's residual of R = 128), attention on the dequantized values.
      if (pipeline.codec) return error("KV spec '", config.spec, "': more than one codec stage");
      QuantizationConfig kivi;
      kivi.k_bits = kivi.v_bits = options.integer("bits", 2, {2, 4, 8});
      kivi.rounding = Rounding::kNearest;
      kivi.k_per_channel = kivi.v_per_token = true;
      kivi.k_group = kivi.v_group = 32;
      pipeline.block_tokens = 128;
      pipeline.exact_prefill = true;
      SLIMKV_RETURN_IF_ERROR(read_exact_tokens(options, kivi, pipeline, config.spec));
      pipeline.codec = std::make_shared<QuantCodec>(kivi);
      codec_dims_multiple = stored_dims_multiple(kivi);
    } else if (stage.name == "hack" || stage.name == "quant") {
      if (pipeline.codec) return error("KV spec '", config.spec, "': more than one codec stage");
      const bool hack = stage.name == "hack";
      const QuantizationConfig quantization = read_quantization(options, pipeline, hack);
      if (!quantization.keep_open_exact && (quantization.k_per_channel || quantization.v_per_token)) {
        return error("KV spec '", config.spec, "': rqe=off (the HACK/RQE ablation) requantizes HACK's layout only ",
                     "(klayout=token, vlayout=channel)");
      }
      // Exact by default: a prefill chunk then sees its newest tokens as decode does (from the open
      // block, unquantized) instead of through the blocks it just sealed (docs/hack.md).
      pipeline.exact_prefill = options.choice("prefill", "exact", {"exact", "quantized"}) == "exact";
      SLIMKV_RETURN_IF_ERROR(read_exact_tokens(options, quantization, pipeline, config.spec));
      const auto make_codec = [hack](const QuantizationConfig& q) -> std::shared_ptr<const Codec> {
        if (hack) return std::make_shared<HackCodec>(q);
        return std::make_shared<QuantCodec>(q);
      };
      pipeline.codec = make_codec(quantization);
      SLIMKV_RETURN_IF_ERROR(read_wide_heads(options, stage, quantization, make_codec, pipeline, config.spec));
      codec_dims_multiple = stored_dims_multiple(quantization);
    } else {
      return error("KV spec '", config.spec, "': unknown stage '", stage.name, "' (known: ", kKnownStages, ")");
    }
    SLIMKV_RETURN_IF_ERROR(options.finish());
  }
  if (!pipeline.codec && (pipeline.selector || pipeline.zack)) {
    pipeline.codec = std::make_shared<DenseCodec>(DType::kF32);  // "pq" or "zack" alone
  }
  if (!pipeline.codec) return error("KV spec '", config.spec, "': no codec stage (e.g. 'dense')");
  // ZACK's ranks rounded as the codec after it stores dims, unless the spec says align= (then a rank the
  // codec cannot store is refused at load, naming the layer and head).
  if (pipeline.zack && pipeline.zack->align == 0) pipeline.zack->align = codec_dims_multiple;
  // A selector reads the tokens it picks from the sealed blocks, token by token; it would need to know
  // which of them lie elsewhere (pq's init= already keeps the first tokens in every decode step).
  if (pipeline.selector && (pipeline.sink_tokens > 0 || pipeline.recent_tokens > 0)) {
    return error("KV spec '", config.spec, "': sinks and window (tokens kept in FP16) with a selector are not supported");
  }
  if (config.tier.name == "offload") {
    StageOptions options(config.tier, config.spec);
    offload.cache_tokens = options.integer("cache", offload.cache_tokens, {});
    const std::string lru = offload.policy == CachePolicy::kLfu ? "lfu" : "lru";
    offload.policy = options.choice("policy", lru, {"lru", "lfu"}) == "lfu" ? CachePolicy::kLfu : CachePolicy::kLru;
    offload.dir = options.text("dir", "");
    offload.options_given = !config.tier.options.empty();
    SLIMKV_RETURN_IF_ERROR(options.finish());
    // The file is made when a sequence starts; a directory that cannot hold one fails here instead.
    if (auto probe = OffloadTier::open(offload, 1, 1, 1); !probe) {
      return error("KV spec '", config.spec, "': ", probe.status().message());
    }
    pipeline.offload = offload;
  } else if (config.tier.name == "kvpr") {
    StageOptions options(config.tier, config.spec);
    KvprConfig kvpr;
    kvpr.split = options.text("split", "auto") == "auto" ? -1.0 : options.number("split", 0.0, 0.0, 1.0);
    const bool column = options.choice("schedule", "row", {"row", "column"}) == "column";
    kvpr.micro_batches = column ? options.integer("batches", 0, {}, 0, 1024) : 1;
    kvpr.profile = options.text("profile", "");
    kvpr.reprofile = options.choice("reprofile", "off", {"off", "on"}) == "on";
    SLIMKV_RETURN_IF_ERROR(options.finish());
    if (pipeline.zack || pipeline.selector) {
      return error("KV spec '", config.spec, "': the kvpr tier keeps every token's K/V (no selector or zack)");
    }
    pipeline.kvpr = kvpr;
  } else if (config.tier.name != "fast" || !config.tier.options.empty()) {
    return error("KV spec '", config.spec, "': unknown tier '", config.tier.name, "' (known: ", kKnownTiers, ")");
  }
  return pipeline;
}

Expected<KvPipeline> make_kv_pipeline(std::string_view spec) {
  SLIMKV_ASSIGN_OR_RETURN(KvConfig config, parse_kv_spec(spec));
  return make_kv_pipeline(config);
}

Expected<std::string> canonical_kv_spec(std::string_view spec) {
  SLIMKV_ASSIGN_OR_RETURN(KvPipeline pipeline, make_kv_pipeline(spec));
  return pipeline.describe();
}

}  // namespace slimkv
