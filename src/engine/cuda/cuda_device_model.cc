// The engine's device "cuda" (engine/device_model.h): the model uploaded to the GPU
// (model/cuda/llama_cuda.h), each engine sequence a sequence of its KV cache (kv/cuda/gpu_kv_cache.h),
// steps of mixed items with logits rows or tokens sampled on the GPU, the cache's block budget, and KV
// export/import in the transfer format (kv/cuda/gpu_kv_transfer.h: through a host KvStore, or with the
// sealed blocks left in GPU memory). One visible GPU (`--device cuda:N`) holds it all: every entry
// makes it the calling thread's device first, since the engine is called from threads that chose none
// (a server's scheduler and HTTP threads) or another (an engine on another GPU in the same process).
#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "engine/cuda/gpu_kv_staging.h"
#include "engine/device_model.h"
#include "kv/cuda/gpu_kv_plan.h"
#include "kv/cuda/gpu_kv_transfer.h"
#include "kv/cuda/gpu_layer_blocks.h"
#include "kv/store.h"
#include "model/cuda/llama_cuda.h"
#include "model/llama.h"
#include "slimkv/engine.h"

namespace slimkv {
namespace {

// SLIMKV_CUDA_GGUF_WEIGHTS: a GGUF file's quantized matrices stay in their blocks on the GPU ("blocks",
// the default: the file's memory) or are widened to FP16 at upload ("widened": about 3x the memory of
// Q4_K_M, and faster products for batches of more than one sequence, docs/cuda.md).
Expected<bool> widen_gguf_weights() {
  const char* value = std::getenv("SLIMKV_CUDA_GGUF_WEIGHTS");
  if (value == nullptr || *value == '\0' || std::string_view(value) == "blocks") return false;
  if (std::string_view(value) == "widened") return true;
  return error("SLIMKV_CUDA_GGUF_WEIGHTS=", value, ": expected blocks (the default) or widened");
}

cuda::StepRows rows_of(StepOutput output) {
  switch (output) {
    case StepOutput::kNone:
      return cuda::StepRows::kNone;
    case StepOutput::kLastLogits:
      return cuda::StepRows::kLast;
    case StepOutput::kAllLogits:
      return cuda::StepRows::kAll;
    case StepOutput::kSample:
      return cuda::StepRows::kSample;
  }
  return cuda::StepRows::kLast;
}

class CudaDeviceModel final : public DeviceModel {
 public:
  // zack: the cache's per-head ranks, which a host store of its sequences keeps as each head's dims.
  CudaDeviceModel(std::unique_ptr<cuda::CudaLlamaModel> model, const KvPipeline& pipeline, int gpu,
                  const std::optional<cuda::ZackKvOptions>& zack)
      : gpu_(gpu), model_(std::move(model)), pipeline_(pipeline) {
    const ModelConfig& c = model_->config();
    shape_ = KvShape(int(c.num_layers), int(c.num_kv_heads), int(c.head_dim), int(c.head_dim), model_->context_tokens());
    if (zack) {
      shape_.head_k_dims = zack->k_ranks;
      shape_.head_v_dims = zack->v_ranks;
    }
  }
  // The members free their GPU memory after this body, on the thread's device it chose.
  ~CudaDeviceModel() override { static_cast<void>(cuda::use_gpu(gpu_)); }

  int context_tokens() const override { return model_->context_tokens(); }
  std::string kv_description() const override { return pipeline_.describe(); }

  Status add_sequence(SequenceId sequence, const SamplingParams& sampling) override {
    if (sequences_.contains(sequence)) return error("sequence ", sequence, " is already on the GPU");
    SLIMKV_RETURN_IF_ERROR(cuda::use_gpu(gpu_));
    SLIMKV_ASSIGN_OR_RETURN(const int id, model_->add_sequence());
    sequences_[sequence] = {id, sampling};
    return Status::ok();
  }
  void remove_sequence(SequenceId sequence) override {
    const auto it = sequences_.find(sequence);
    if (it == sequences_.end()) return;
    static_cast<void>(cuda::use_gpu(gpu_));  // a broken context fails the next step, which reports it
    model_->remove_sequence(it->second.id);
    sequences_.erase(it);
  }
  int num_tokens(SequenceId sequence) const override { return model_->num_tokens(id_of(sequence)); }

  // A kSample item's draw: its parameters, counter = the position of the token drawn (so the same
  // whatever the batch, and after an export and import).
  Status step(std::span<const DeviceStepItem> items, StepResult& result) override {
    SLIMKV_RETURN_IF_ERROR(cuda::use_gpu(gpu_));
    std::vector<cuda::SequenceStep> steps;
    for (const DeviceStepItem& item : items) {
      const Held& held = held_of(item.sequence);
      const SamplingParams& p = held.sampling;
      const uint64_t position = uint64_t(model_->num_tokens(held.id)) + item.tokens.size();
      steps.push_back({held.id, item.tokens, rows_of(item.output),
                       cuda::RowSampling{p.temperature, p.top_k, p.top_p, p.seed, position}});
    }
    cuda::StepOutputs out;
    SLIMKV_RETURN_IF_ERROR(model_->run_step(steps, out, block_hand_outs(items)));
    result.vocab = int(model_->config().vocab_size);
    result.logits = std::move(out.logits);
    result.first_row = std::move(out.first_row);
    result.tokens = std::move(out.tokens);
    return Status::ok();
  }

  KvBudget kv_budget() const override {
    const cuda::GpuKvCache& kv = model_->kv();
    return KvBudget{cuda::kCudaBlockTokens, kv.sequences().num_blocks(), kv.sequences().free_blocks(),
                    kv.bytes_per_block()};
  }
  int64_t sequence_blocks(SequenceId sequence) const override {
    return int64_t(model_->kv().sequences().blocks(id_of(sequence)).size());
  }

  Status export_kv(SequenceId sequence, std::string_view model_id, std::vector<uint8_t>& out) const override {
    SLIMKV_RETURN_IF_ERROR(check_transferable());
    SLIMKV_RETURN_IF_ERROR(cuda::use_gpu(gpu_));
    return cuda::export_transfer(model_->kv(), id_of(sequence), context(model_id), out);
  }
  Status import_kv(SequenceId sequence, std::span<const uint8_t> transfer, std::string_view source,
                   std::string_view model_id, std::optional<uint32_t> received_crc) override {
    const int id = id_of(sequence);
    if (model_->num_tokens(id) != 0) {
      return error("kv transfer '", source, "': sequence ", sequence, " holds ", model_->num_tokens(id),
                   " tokens; a transfer is imported into an empty sequence");
    }
    SLIMKV_RETURN_IF_ERROR(check_transferable());
    SLIMKV_RETURN_IF_ERROR(cuda::use_gpu(gpu_));
    return cuda::import_transfer(model_->kv(), id, context(model_id), transfer, source, received_crc);
  }

  // The CUDA IPC path: the sealed blocks stay in GPU memory (dense, hack and quant caches).
  bool exports_kv_to_device() const override { return model_->kv().device_page_bytes() > 0; }
  Status export_kv_to_device(SequenceId sequence, std::string_view model_id, DeviceKvTransfer& out, bool pages) const override {
    SLIMKV_RETURN_IF_ERROR(check_transferable());
    SLIMKV_RETURN_IF_ERROR(cuda::use_gpu(gpu_));
    return cuda::export_to_device(model_->kv(), id_of(sequence), context(model_id), out, pages);
  }
  Status import_kv_from_device(SequenceId sequence, const DeviceKvTransfer& transfer, std::string_view source,
                               std::string_view model_id) override {
    SLIMKV_RETURN_IF_ERROR(check_transferable());
    SLIMKV_RETURN_IF_ERROR(cuda::use_gpu(gpu_));
    return cuda::import_from_device(model_->kv(), id_of(sequence), context(model_id), transfer, source);
  }

  // Staged imports where the cache has device pages: each layer uploaded as its frame lands.
  bool stages_kv() const override { return streams_blocks(); }
  Expected<std::unique_ptr<KvStore>> transfer_store() const override {
    if (!stages_kv()) return DeviceModel::transfer_store();
    return std::make_unique<KvStore>(shape_, pipeline_);
  }
  Expected<std::unique_ptr<KvStaging>> new_kv_staging(const KvTransferInfo& info, std::string_view source,
                                                      std::string_view model_id) const override {
    if (!stages_kv()) return DeviceModel::new_kv_staging(info, source, model_id);
    SLIMKV_RETURN_IF_ERROR(cuda::use_gpu(gpu_));
    return cuda::new_gpu_kv_staging(info, source, model_id, shape_, pipeline_, model_->kv().device_page_layout(), *pinned_);
  }

  // A streamed sequence's blocks go out layer by layer during its steps where the cache has device pages.
  bool streams_blocks() const override { return exports_kv_to_device() && check_transferable().is_ok(); }
  Status stream_blocks_in_next_step(SequenceId sequence, int first_block, bool to_device, KvPieceCallback on_piece,
                                    std::shared_ptr<std::atomic<uint64_t>> held_bytes) override {
    if (!streams_blocks()) {
      return DeviceModel::stream_blocks_in_next_step(sequence, first_block, to_device, std::move(on_piece), held_bytes);
    }
    block_streams_[sequence] = {first_block, to_device, std::move(on_piece), std::move(held_bytes)};
    return Status::ok();
  }
  Expected<std::unique_ptr<KvStore>> open_tokens(SequenceId sequence) const override {
    SLIMKV_RETURN_IF_ERROR(cuda::use_gpu(gpu_));
    auto open = std::make_unique<KvStore>(shape_, pipeline_);
    SLIMKV_RETURN_IF_ERROR(model_->kv().export_open_tokens(id_of(sequence), *open));
    return open;
  }

  const KvStore* kv_store(SequenceId) const override { return nullptr; }
  Status set_observer(SequenceId, ForwardObserver*) override {
    return error("observing the forward pass (fidelity, calibration) runs on device 'cpu' only");
  }

 private:
  struct Held {
    int id = 0;  // in the GPU's KV cache
    SamplingParams sampling;
  };
  // The transfer format holds blocks of the model's head_dim in every layer alike: heads stored padded
  // on the GPU, or sliding layers (their own windows), do not move yet.
  Status check_transferable() const {
    const ModelConfig& c = model_->config();
    if (model_->attention_head_dim() != c.head_dim) {
      return error("KV transfer on device cuda: head_dim ", c.head_dim, " is stored padded to ",
                   model_->attention_head_dim(), " dims on the GPU, which the transfer format does not carry yet");
    }
    if (!c.sliding_layers.empty()) {
      return error("KV transfer on device cuda: the model's sliding-window layers do not move yet (use --device cpu)");
    }
    return Status::ok();
  }
  // stream_blocks_in_next_step's, for the next step alone.
  struct BlockStream {
    int first_block = 0;
    bool to_device = false;
    KvPieceCallback on_piece;
    std::shared_ptr<std::atomic<uint64_t>> held_bytes;
  };
  // The next step's hook that hands out, right after each layer's attention, the blocks it fills of
  // each streamed sequence among `items` (their copies into pinned memory enqueued there, each piece's
  // ready() waiting for its layer's); empty when there are none. The streams asked for are consumed.
  cuda::CudaLlamaModel::LayerHook block_hand_outs(std::span<const DeviceStepItem> items) {
    struct HandOut {
      BlockStream stream;
      int id = 0, end_block = 0;
      std::shared_ptr<cuda::GpuLayerBlocks> blocks;  // made at the first layer, once the step gave the blocks
    };
    auto hand_outs = std::make_shared<std::vector<HandOut>>();
    for (const DeviceStepItem& item : items) {
      const auto it = block_streams_.find(item.sequence);
      if (it == block_streams_.end()) continue;
      const int id = id_of(item.sequence);
      const int end_block = int((size_t(model_->num_tokens(id)) + item.tokens.size()) / cuda::kCudaBlockTokens);
      if (end_block > it->second.first_block) hand_outs->push_back({std::move(it->second), id, end_block, nullptr});
    }
    block_streams_.clear();
    if (hand_outs->empty()) return {};
    return [this, hand_outs](int layer) -> Status {
      for (HandOut& out : *hand_outs) {
        if (!out.blocks) {
          SLIMKV_ASSIGN_OR_RETURN(out.blocks,
                                  cuda::GpuLayerBlocks::create(model_->kv(), out.id, out.stream.first_block, out.end_block,
                                                               *pinned_, out.stream.to_device ? on_device_.get() : nullptr,
                                                               out.stream.held_bytes));
        }
        SLIMKV_RETURN_IF_ERROR(out.blocks->enqueue(layer));
        std::shared_ptr<const cuda::GpuLayerBlocks> blocks = out.blocks;
        KvTransferPiece piece{.layer = layer, .bytes = {}, .open = {}, .owner = blocks, .first_block = blocks->first_block(),
                              .final = false, .crcs = {}, .device = nullptr, .ready = [blocks, layer] { return blocks->wait(layer); }};
        if (out.stream.to_device) {
          piece.device = blocks->layer_pages(layer);
        } else {
          piece.bytes = blocks->layer_bytes(layer);
        }
        out.stream.on_piece(std::move(piece));
      }
      return Status::ok();
    };
  }

  // The engine checks ids before calling.
  const Held& held_of(SequenceId sequence) const { return sequences_.at(sequence); }
  int id_of(SequenceId sequence) const { return held_of(sequence).id; }
  cuda::GpuKvTransferContext context(std::string_view model_id) const {
    return {.shape = shape_, .pipeline = pipeline_, .model_id = std::string(model_id), .staging = &transfer_staging_};
  }

  const int gpu_;  // the visible GPU everything below lives on
  std::unique_ptr<cuda::CudaLlamaModel> model_;
  KvPipeline pipeline_;  // as the GPU runs it: its describe() is kv_description()
  KvShape shape_;        // of a host store of one sequence (export, import)
  // Pinned host memory for a layer of each export and import, kept for the next (GpuKvTransferContext).
  mutable cuda::PinnedArray<uint8_t> transfer_staging_;
  // Memory of blocks handed out during steps (pinned host, GPU), reused from step to step.
  std::shared_ptr<cuda::PinnedPool> pinned_ = cuda::PinnedPool::create();
  std::shared_ptr<cuda::DevicePool> on_device_ = cuda::DevicePool::create();
  std::map<SequenceId, Held> sequences_;
  std::map<SequenceId, BlockStream> block_streams_;
};

}  // namespace

Expected<std::unique_ptr<DeviceModel>> load_cuda_model(const LlamaModel& model, const KvPipeline& pipeline,
                                                       const EngineConfig& config, int gpu) {
  SLIMKV_RETURN_IF_ERROR(cuda::check_visible_gpu(gpu));
  SLIMKV_RETURN_IF_ERROR(cuda::use_gpu(gpu));  // before anything allocates (the upload, the KV pool)
  const ModelConfig& c = model.config();
  SLIMKV_ASSIGN_OR_RETURN(cuda::GpuKvPlan plan,
                          cuda::plan_gpu_kv(pipeline, config.kv_spec, int(c.hidden_size), int(c.kv_dim())));
  const cuda::GpuKvOptions& kv = plan.options;
  if (!c.sliding_layers.empty() && (kv.quantized || kv.zack || kv.tier || kv.pq)) {
    return error("KV spec '", config.kv_spec, "': sliding-window layers (", c.architecture_name,
                 ") run on device cuda with the dense codec only yet; use 'dense' there, or --device cpu");
  }
  cuda::CudaModelOptions options;
  options.quantized_kv = plan.options.quantized;
  options.zack = plan.options.zack;
  options.tier = plan.options.tier;
  options.pq = plan.options.pq;
  options.rotate_heads = plan.rotate_heads;
  options.max_sequences = config.max_sequences;
  options.max_step_tokens = config.max_step_tokens();
  options.kv_cache_bytes = config.kv_cache_bytes;
  SLIMKV_ASSIGN_OR_RETURN(options.widen_quantized_weights, widen_gguf_weights());
  // ZACK: the folded W_V / W_O at full width (the GPU's GEMMs keep the model's shapes), and the ranks and
  // Q–K bases the cache projects q and k onto.
  LlamaWeights weights = model.weights();
  std::vector<std::vector<float>> full_width;  // owns what weights' wv, wo point into until the upload
  if (options.zack) {
    full_width.reserve(2 * size_t(c.num_layers));
    const ZackProjection* zack = model.zack();
    if (zack == nullptr) return error("KV spec '", config.kv_spec, "': the model has not folded its ZACK weights");
    options.zack->k_ranks = zack->ranks().k_ranks;
    options.zack->v_ranks = zack->ranks().v_ranks;
    for (int l = 0; l < int(c.num_layers); ++l) {
      const std::vector<float>& bases = zack->qk_bases(l);
      options.zack->qk_bases.insert(options.zack->qk_bases.end(), bases.begin(), bases.end());
      LayerWeights& w = weights.layers[size_t(l)];
      full_width.push_back(zack->full_width_wv(l));
      w.wv = {full_width.back().data(), DType::kF32, int64_t(c.kv_dim()), int64_t(c.hidden_size)};
      full_width.push_back(zack->full_width_wo(l));
      w.wo = {full_width.back().data(), DType::kF32, int64_t(c.hidden_size), int64_t(c.q_dim())};
      if (!w.bv.empty()) w.bv = zack->full_width_bv(l, w.bv);
    }
  }
  SLIMKV_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaLlamaModel> gpu_model,
                          cuda::CudaLlamaModel::upload(c, weights, options));
  return std::unique_ptr<DeviceModel>(new CudaDeviceModel(std::move(gpu_model), plan.pipeline, gpu, options.zack));
}

}  // namespace slimkv
