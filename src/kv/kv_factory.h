// Builds what a KV spec names, like FAISS's index_factory: one place that knows every stage name.
// Stages not known here, bad options, and impossible combinations are errors quoting the whole spec.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "kv/codec/codec.h"
#include "kv/select/selector.h"
#include "kv/tier/offload_tier.h"
#include "slimkv/zack_ranks.h"
#include "slimkv/kv_config.h"

namespace slimkv {

// The `kvpr` tier (issue 11; runs on device cuda): K/V and attention inputs X in pinned host memory,
// part of the K/V recomputed from X on the GPU while the rest streams in (model/cuda/llama_cuda.h).
struct KvprConfig {
  double split = -1;       // the fraction of tokens recomputed; negative: auto (the cost model, Eq. 10)
  int micro_batches = 1;   // schedule=row: 1; schedule=column: batches (0: as the GPU KV budget needs)
  std::string profile;     // the profiler's cache file; empty: kv/cuda/kvpr_profiler.h's default
  bool reprofile = false;  // measure again even when the file has this machine's figures
};

struct KvPipeline {
  std::shared_ptr<const Codec> codec;  // encodes sealed blocks
  std::shared_ptr<const SelectorFactory> selector;  // which tokens decode attends to; null: all
  int block_tokens = 64;               // tokens per block (HACK's partition size Π when hack is used)
  uint64_t seed = 0;                   // for stochastic rounding and clustering
  bool hadamard = false;               // rot=hadamard: K, V, q rotated per head, outputs rotated back
  // prefill=exact (hack, quant): a prefill chunk's queries read the chunk's own K/V as appended (FP32),
  // not through the blocks they were just sealed into; earlier tokens come from the store as always.
  bool exact_prefill = false;
  // sinks=N, window=W (hack, quant, kivi; issue 28): tokens attention reads exactly from FP16 besides the
  // open block. sink_tokens: a sequence's first N tokens (N <= block_tokens; attention sinks, StreamingLLM),
  // kept in FP16 when their block is sealed, and left out of that block's quantization ranges.
  // recent_tokens: the W newest tokens before the open block (KIVI's full-precision window): a block is
  // sealed only once all its tokens are older than the W newest, so the store holds W to W + block_tokens
  // - 1 unsealed tokens. 0: off (the store as before, bit for bit).
  int sink_tokens = 0;
  int recent_tokens = 0;
  // hibits=B,hiheads=L.H/L.H (hack, quant; issue 28): per-(layer, KV head) bit widths. The listed heads'
  // blocks are encoded by `wide_codec` (the codec's layout with B-bit K and V), every other head's by
  // `codec`: the heads whose attention loses most at the codec's bits get more of them (which ones:
  // scripts/kv_head_bits.py measures it on calibration text). Empty: every head alike.
  std::shared_ptr<const Codec> wide_codec;
  int wide_bits = 0;
  std::vector<std::pair<int, int>> wide_heads;  // (layer, KV head), ascending
  const Codec& codec_of(int layer, int head) const;
  // FP16 rows a sequence holds per (layer, KV head) beside its sealed blocks: the open block, the recent
  // window and the sinks (what the KV budget reserves per sequence).
  int unsealed_rows() const { return block_tokens + recent_tokens + sink_tokens; }
  std::optional<OffloadConfig> offload;  // @offload: sealed blocks in a file, hot ones cached; else all in RAM
  std::optional<KvprConfig> kvpr;        // @kvpr (device cuda)
  // The zack stage: each head keeps fewer dims (its ZACK rank), which the codec then encodes. Applied
  // when the model loads (LlamaModel::enable_zack), where the calibration and the weights are.
  std::optional<ZackOptions> zack;
  std::string describe() const;        // the canonical spec, every option spelled out
};

Expected<KvPipeline> make_kv_pipeline(const KvConfig& config);

// parse_kv_spec + make_kv_pipeline.
Expected<KvPipeline> make_kv_pipeline(std::string_view spec);

}  // namespace slimkv
