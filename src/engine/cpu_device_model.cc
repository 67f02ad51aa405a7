// The engine's device "cpu": every sequence a KvStore (kv/store.h), a step one batched forward pass
// (model/llama.h: all rows through each weight matrix together), the KV block budget counted here.
//
// The budget: a sequence of n tokens holds ceil(n / block_tokens) budget blocks, each the codec's sealed
// bytes of one block in every layer and KV head. The open block every sequence keeps (FP16, allocated
// whole) is set aside from kv_cache_bytes per sequence slot first. A step that would take more blocks
// than are free is refused before any work, so the stores never hold more than the budget.
#include <algorithm>
#include <map>

#include "engine/device_model.h"
#include "engine/kv_staging.h"
#include "engine/sampler.h"
#include "kv/store.h"
#include "kv/transfer.h"
#include "model/llama.h"
#include "util/system_memory.h"
#include "util/thread_pool.h"

namespace slimkv {
namespace {

class CpuDeviceModel : public DeviceModel {
 public:
  CpuDeviceModel(const LlamaModel& model, const KvPipeline& pipeline, const EngineConfig& config, ThreadPool& pool,
                 KvBudget budget)
      : model_(model), pipeline_(pipeline), max_sequences_(config.max_sequences), pool_(pool), budget_(budget) {}

  int context_tokens() const override { return int(model_.config().max_position_embeddings); }
  std::string kv_description() const override { return pipeline_.describe(); }

  Status add_sequence(SequenceId id, const SamplingParams& sampling) override {
    if (int(sequences_.size()) >= max_sequences_) {
      return error("the engine holds ", sequences_.size(), " sequences, its max_sequences");
    }
    Sequence& sequence = sequences_[id];
    sequence.kv = std::make_shared<KvStore>(model_.kv_shape(), pipeline_);
    sequence.sampling = sampling;
    return Status::ok();
  }

  void remove_sequence(SequenceId id) override {
    budget_.free_blocks += sequences_.at(id).blocks;
    sequences_.erase(id);
  }

  int num_tokens(SequenceId id) const override { return sequences_.at(id).kv->num_tokens(0); }

  Status step(std::span<const DeviceStepItem> items, StepResult& result) override {
    int64_t new_blocks = 0;
    for (const DeviceStepItem& item : items) {
      const Sequence& sequence = sequences_.at(item.sequence);
      new_blocks += budget_.blocks_for_tokens(sequence.kv->num_tokens(0) + int64_t(item.tokens.size())) - sequence.blocks;
    }
    if (new_blocks > budget_.free_blocks) {
      return error("KV budget: the step needs ", new_blocks, " more blocks of ", budget_.block_tokens,
                   " tokens, ", budget_.free_blocks, " of ", budget_.total_blocks, " are free");
    }
    std::vector<ForwardSequence> batch;
    int64_t rows = 0;
    result.first_row.assign(items.size(), -1);
    result.tokens.assign(items.size(), -1);
    for (size_t i = 0; i < items.size(); ++i) {
      const DeviceStepItem& item = items[i];
      Sequence& sequence = sequences_.at(item.sequence);
      const LogitRows logits = item.output == StepOutput::kNone      ? LogitRows::kNone
                               : item.output == StepOutput::kAllLogits ? LogitRows::kAll
                                                                      : LogitRows::kLast;
      batch.push_back({item.tokens, sequence.kv.get(), logits, sequence.observer});
      if (logits == LogitRows::kNone) continue;
      result.first_row[i] = rows;
      rows += logits == LogitRows::kAll ? int64_t(item.tokens.size()) : 1;
    }
    const size_t vocab = size_t(model_.config().vocab_size);
    result.vocab = int(vocab);
    result.logits.resize(size_t(rows) * vocab);
    model_.forward(batch, result.logits.data(), state_, pool_);
    for (size_t i = 0; i < items.size(); ++i) {
      Sequence& sequence = sequences_.at(items[i].sequence);
      const int64_t blocks = budget_.blocks_for_tokens(sequence.kv->num_tokens(0));
      budget_.free_blocks -= blocks - sequence.blocks;
      sequence.blocks = blocks;
      if (items[i].output == StepOutput::kSample) {
        result.tokens[i] = sampler_.sample(result.logits_of(i), sequence.sampling, sequence.kv->num_tokens(0));
      }
    }
    return Status::ok();
  }

  KvBudget kv_budget() const override { return budget_; }
  int64_t sequence_blocks(SequenceId id) const override { return sequences_.at(id).blocks; }

  Status export_kv(SequenceId id, std::string_view model_id, std::vector<uint8_t>& out) const override {
    return write_kv_transfer(*sequences_.at(id).kv, model_id, out);
  }

  Status import_kv(SequenceId id, std::span<const uint8_t> transfer, std::string_view source,
                   std::string_view model_id, std::optional<uint32_t> received_crc) override {
    Sequence& sequence = sequences_.at(id);
    // Everything is checked before the store is touched (one pass over the bytes for the checksum, none
    // when the receiver computed it as they arrived); then they are copied in.
    SLIMKV_ASSIGN_OR_RETURN(const KvTransferInfo info, check_kv_transfer_for(transfer.data(), transfer.size(), source,
                                                                             model_id, *sequence.kv, received_crc));
    const int tokens = info.layer_tokens.empty() ? 0 : *std::max_element(info.layer_tokens.begin(), info.layer_tokens.end());
    SLIMKV_RETURN_IF_ERROR(check_budget_for(tokens, sequence, str_cat("kv transfer '", source, "'")));
    restore_kv_transfer(transfer.data(), info, *sequence.kv);
    take_blocks(tokens, sequence);
    return Status::ok();
  }

  Expected<std::unique_ptr<KvStore>> transfer_store() const override {
    return std::make_unique<KvStore>(model_.kv_shape(), pipeline_);
  }
  Expected<std::shared_ptr<KvStore>> new_kv_store() const override {
    SLIMKV_ASSIGN_OR_RETURN(std::unique_ptr<KvStore> store, transfer_store());
    return std::shared_ptr<KvStore>(std::move(store));
  }

  // Staged: the pieces restored into a store of new_kv_store's, which adopt_kv takes.
  bool stages_kv() const override { return true; }
  Expected<std::unique_ptr<KvStaging>> new_kv_staging(const KvTransferInfo& info, std::string_view source,
                                                      std::string_view model_id) const override {
    SLIMKV_ASSIGN_OR_RETURN(std::shared_ptr<KvStore> store, new_kv_store());
    return stage_into_store(std::move(store), info, source, model_id);
  }

  Status adopt_kv(SequenceId id, std::shared_ptr<KvStore> kv, std::string_view source) override {
    // Only a store of new_kv_store's: made from this engine's pipeline (its very codec) in the model's shape.
    const KvShape shape = model_.kv_shape();
    if (!kv || kv->pipeline().codec != pipeline_.codec || kv->shape().num_layers != shape.num_layers ||
        kv->shape().num_kv_heads != shape.num_kv_heads || kv->shape().max_tokens != shape.max_tokens) {
      return error("KV '", source, "': not a store of this engine's KV (Engine::new_kv_store)");
    }
    int tokens = 0;
    for (int l = 0; l < kv->shape().num_layers; ++l) tokens = std::max(tokens, kv->num_tokens(l));
    Sequence& sequence = sequences_.at(id);
    SLIMKV_RETURN_IF_ERROR(check_budget_for(tokens, sequence, str_cat("KV '", source, "'")));
    sequence.kv = std::move(kv);
    take_blocks(tokens, sequence);
    return Status::ok();
  }

  const KvStore* kv_store(SequenceId id) const override { return sequences_.at(id).kv.get(); }
  Status set_observer(SequenceId id, ForwardObserver* observer) override {
    sequences_.at(id).observer = observer;
    return Status::ok();
  }

 private:
  struct Sequence {
    std::shared_ptr<KvStore> kv;  // shared: an adopted store was made outside (Engine::new_kv_store)
    SamplingParams sampling;
    ForwardObserver* observer = nullptr;
    int64_t blocks = 0;  // budget blocks held
  };

  // An error (naming `where`) unless the budget has room for `sequence` to hold `tokens`; take_blocks
  // then takes them.
  Status check_budget_for(int tokens, const Sequence& sequence, const std::string& where) const {
    const int64_t blocks = budget_.blocks_for_tokens(tokens);
    if (blocks - sequence.blocks > budget_.free_blocks) {
      return error(where, ": ", tokens, " tokens need ", blocks, " blocks of the KV budget, ", budget_.free_blocks,
                   " are free");
    }
    return Status::ok();
  }
  void take_blocks(int tokens, Sequence& sequence) {
    const int64_t blocks = budget_.blocks_for_tokens(tokens);
    budget_.free_blocks -= blocks - sequence.blocks;
    sequence.blocks = blocks;
  }

  const LlamaModel& model_;
  const KvPipeline& pipeline_;
  int max_sequences_;
  ThreadPool& pool_;
  KvBudget budget_;
  std::map<SequenceId, Sequence> sequences_;
  RunState state_;
  Sampler sampler_;
};

// Bytes of one budget block (sealed, every layer and KV head) and of one sequence's open blocks (with
// sinks= / window=, its FP16 sink tokens and recent window too).
struct BlockBytes {
  size_t sealed = 0, open = 0;
};

BlockBytes cpu_block_bytes(const KvShape& shape, const KvPipeline& pipeline) {
  BlockBytes bytes;
  const size_t open_element = dtype_size_bytes(pipeline.codec->open_block_dtype());
  for (int l = 0; l < shape.num_layers; ++l) {
    for (int g = 0; g < shape.num_kv_heads; ++g) {
      const BlockShape block{pipeline.block_tokens, shape.k_dim_of(l, g), shape.v_dim_of(l, g)};
      bytes.sealed += pipeline.codec_of(l, g).block_bytes(block);
      bytes.open += size_t(pipeline.unsealed_rows()) * size_t(block.k_dim + block.v_dim) * open_element;
    }
  }
  return bytes;
}

}  // namespace

Expected<std::unique_ptr<DeviceModel>> make_cpu_model(const LlamaModel& model, const KvPipeline& pipeline,
                                                      const EngineConfig& config, ThreadPool& pool) {
  const KvShape shape = model.kv_shape();
  const BlockBytes bytes = cpu_block_bytes(shape, pipeline);
  KvBudget budget;
  budget.block_tokens = pipeline.block_tokens;
  budget.bytes_per_block = bytes.sealed;
  const int64_t context_blocks = budget.blocks_for_tokens(shape.max_tokens);
  const size_t open_bytes = bytes.open * size_t(config.max_sequences);
  if (config.kv_cache_bytes > 0) {
    if (config.kv_cache_bytes < open_bytes + bytes.sealed) {
      return error("kv_cache_bytes ", config.kv_cache_bytes, " is too small: ", config.max_sequences,
                   " sequences' open blocks take ", open_bytes, " bytes, and one block of ", budget.block_tokens,
                   " tokens ", bytes.sealed, " more");
    }
    budget.total_blocks = int64_t((config.kv_cache_bytes - open_bytes) / bytes.sealed);
  } else {
    // Every sequence's full context, within 90% of the memory the machine has available.
    const size_t available = size_t(0.9 * double(available_memory_bytes()));
    const int64_t fit = available > open_bytes ? int64_t((available - open_bytes) / bytes.sealed) : 1;
    budget.total_blocks = std::max<int64_t>(1, std::min(context_blocks * config.max_sequences, fit));
  }
  budget.free_blocks = budget.total_blocks;
  return std::unique_ptr<DeviceModel>(new CpuDeviceModel(model, pipeline, config, pool, budget));
}

}  // namespace slimkv
