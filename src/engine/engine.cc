#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "engine/cuda_backend.h"
#include "engine/device_model.h"
#include "engine/kv_layer_stream.h"
#include "engine/kv_staging.h"
#include "kv/kv_factory.h"
#include "kv/store.h"
#include "kv/transfer.h"
#include "model/model_identity.h"
#include "model/llama.h"
#include "slimkv/engine.h"
#include "slimkv/tokenizer.h"
#include "tensor/gguf.h"
#include "tokenizer/chat/chat_template.h"
#include "util/buffer_pool.h"
#include "util/mapped_file.h"
#include "util/thread_pool.h"

namespace slimkv {

namespace {

// generation_config.json is optional; when present it must be valid, and its sampling defaults apply.
Expected<GenerationDefaults> load_generation_defaults(const std::string& model_dir, const ModelConfig& config) {
  const std::string path = model_dir + "/generation_config.json";
  std::error_code ignored;  // a dangling link or a directory is reported by read_text_file
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ignored))) {
    GenerationDefaults defaults;
    defaults.eos_token_ids = config.eos_token_ids;
    return defaults;
  }
  SLIMKV_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_generation_config(text, path, config.eos_token_ids);
}

}  // namespace

Expected<std::unique_ptr<Engine>> Engine::load(const EngineConfig& config) {
  SLIMKV_ASSIGN_OR_RETURN(const DeviceName device, parse_device_name(config.device));
  if (config.max_sequences < 1) return error("max_sequences must be >= 1, got ", config.max_sequences);
  if (config.threads < 0) return error("threads must be >= 0 (0 = every core), got ", config.threads);
  if (config.prefill_chunk_tokens < 1) return error("prefill chunk must be >= 1 token");
  std::unique_ptr<Engine> engine(new Engine());
  engine->config_ = config;
  engine->device_name_ = device;
  const int threads = config.threads > 0 ? config.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  SLIMKV_ASSIGN_OR_RETURN(KvPipeline pipeline, make_kv_pipeline(config.kv_spec));  // bad specs fail before loading
  engine->pipeline_ = std::make_unique<KvPipeline>(std::move(pipeline));
  if (engine->pipeline_->kvpr && !device.cuda) {
    return error("KV spec '", config.kv_spec, "': the kvpr tier runs on device 'cuda' only (it recomputes K/V on ",
                 "the GPU while the rest crosses from host memory)");
  }
  if (!engine->pipeline_->wide_heads.empty() && device.cuda) {
    return error("KV spec '", config.kv_spec, "': per-(layer, head) bit widths (hibits=, hiheads=) run on device 'cpu' ",
                 "only for now");
  }
  if (device.cuda) SLIMKV_RETURN_IF_ERROR(check_cuda_gpu(device.gpu));  // a GPU that is not there, before the weights load
  SLIMKV_ASSIGN_OR_RETURN(engine->model_, LlamaModel::load(config.model_dir));
  const std::string kv_context = str_cat("KV spec '", config.kv_spec, "' for ", config.model_dir);
  if (std::optional<ZackOptions>& zack = engine->pipeline_->zack) {
    if (zack->calibration_path.empty()) zack->calibration_path = config.model_dir + "/zack.safetensors";
    SLIMKV_RETURN_IF_ERROR(engine->model_->enable_zack(*zack).with_context(kv_context));
  }
  const KvShape kv_shape = engine->model_->kv_shape();
  for (const auto& [layer, head] : engine->pipeline_->wide_heads) {
    if (layer >= kv_shape.num_layers || head >= kv_shape.num_kv_heads) {
      return error(kv_context, ": hiheads names layer ", layer, " KV head ", head, "; the model has layers 0-",
                   kv_shape.num_layers - 1, " and KV heads 0-", kv_shape.num_kv_heads - 1);
    }
  }
  for (int l = 0; l < kv_shape.num_layers; ++l) {
    for (int g = 0; g < kv_shape.num_kv_heads; ++g) {
      const BlockShape block{engine->pipeline_->block_tokens, kv_shape.k_dim_of(l, g), kv_shape.v_dim_of(l, g)};
      const std::string where = kv_shape.heads_differ()
                                    ? str_cat(kv_context, ", layer ", l, " KV head ", g, " (ZACK ranks: round them with align=4 or 16)")
                                    : kv_context;
      SLIMKV_RETURN_IF_ERROR(engine->pipeline_->codec_of(l, g).check_shape(block).with_context(where));
    }
  }
  if (engine->pipeline_->selector) {
    SLIMKV_RETURN_IF_ERROR(engine->pipeline_->selector->check_shape(kv_shape.k_dim).with_context(kv_context));
  }
  if (kv_shape.any_window() && (engine->pipeline_->offload || engine->pipeline_->kvpr)) {
    return error(kv_context, ": the @offload and @kvpr tiers keep every block of every layer; this model's "
                 "sliding-window layers free theirs as they leave the window (use the fast tier)");
  }
  // A model directory without tokenizer.json still runs on token ids (logits, eval on ids).
  if (has_gguf_magic(config.model_dir) || std::filesystem::exists(config.model_dir + "/tokenizer.json")) {
    SLIMKV_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::load_for_model(config.model_dir));
    engine->tokenizer_ = std::make_unique<Tokenizer>(std::move(tokenizer));
  }
  // A model without a chat template, or with one outside this renderer's subset, still runs completions:
  // only rendering a chat reports why it cannot. Unreadable or malformed files are load errors.
  Expected<ChatTemplate> chat = ChatTemplate::load(config.model_dir);
  if (chat) {
    engine->chat_template_ = std::make_unique<ChatTemplate>(std::move(*chat));
  } else if (ChatTemplate::is_no_chat_template(chat.status())) {
    engine->chat_template_status_ = error("this model has no chat template (", chat.status().message(), ")");
  } else if (ChatTemplate::is_unsupported_template(chat.status())) {
    engine->chat_template_status_ = error("this model's chat template cannot be used: ", chat.status().message());
  } else {
    return chat.status();
  }
  SLIMKV_ASSIGN_OR_RETURN(engine->generation_, load_generation_defaults(config.model_dir, engine->model_->config()));
  SLIMKV_ASSIGN_OR_RETURN(engine->identity_, engine->model_->identity());
  engine->pool_ = config.pool ? config.pool : std::make_shared<ThreadPool>(threads);
  engine->transfer_buffers_ = std::make_shared<BufferPool>(config.transfer_buffer_bytes);
  if (device.cuda) {
    SLIMKV_ASSIGN_OR_RETURN(engine->device_, open_cuda_model(*engine->model_, *engine->pipeline_, config, device.gpu));
  } else {
    engine->model_->pack_weights_for_cpu(*engine->pool_);
    SLIMKV_ASSIGN_OR_RETURN(engine->device_, make_cpu_model(*engine->model_, *engine->pipeline_, config, *engine->pool_));
  }
  engine->kv_budget_at_load_ = engine->device_->kv_budget();
  return engine;
}

Engine::~Engine() = default;

const ModelConfig& Engine::model_config() const { return model_->config(); }

std::string Engine::kv_description() const { return device_->kv_description(); }

int Engine::context_tokens() const { return device_->context_tokens(); }

int64_t Engine::vocab_size() const { return model_->config().vocab_size; }

Expected<std::string> Engine::apply_chat_template(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                                  const nlohmann::ordered_json& extra) const {
  if (!chat_template_) return chat_template_status_;
  return chat_template_->render(messages, add_generation_prompt, extra);
}

// ----------------------------------------------------------------------------------------------
// Sequences and steps

Status Engine::check_sequence(SequenceId sequence) const {
  if (sequences_.count(sequence) == 0) return error("sequence ", sequence, " is not held by this engine");
  return Status::ok();
}

Expected<SequenceId> Engine::add_sequence(const SamplingParams& sampling) {
  if (sampling.temperature < 0) return error("temperature must be >= 0, got ", sampling.temperature);
  if (sampling.top_k < 0) return error("top_k must be >= 0 (0: no limit), got ", sampling.top_k);
  if (!(sampling.top_p > 0.0f && sampling.top_p <= 1.0f)) return error("top_p must be in (0, 1], got ", sampling.top_p);
  const SequenceId id = next_sequence_++;
  SLIMKV_RETURN_IF_ERROR(device_->add_sequence(id, sampling));
  sequences_.insert(id);
  return id;
}

Status Engine::remove_sequence(SequenceId sequence) {
  SLIMKV_RETURN_IF_ERROR(check_sequence(sequence));
  device_->remove_sequence(sequence);
  sequences_.erase(sequence);
  kv_streams_.erase(sequence);
  return Status::ok();
}

Expected<int> Engine::num_tokens(SequenceId sequence) const {
  SLIMKV_RETURN_IF_ERROR(check_sequence(sequence));
  return device_->num_tokens(sequence);
}

Status Engine::step(std::span<const StepItem> items, StepResult& result) {
  if (items.empty()) return error("a step of no sequences");
  const int64_t vocab = model_config().vocab_size;
  int64_t rows = 0;
  std::set<SequenceId> seen;
  std::vector<DeviceStepItem> device_items;
  for (size_t i = 0; i < items.size(); ++i) {
    const StepItem& item = items[i];
    const std::string where = str_cat("step item ", i, " (sequence ", item.sequence, ")");
    SLIMKV_RETURN_IF_ERROR(check_sequence(item.sequence).with_context(where));
    if (!seen.insert(item.sequence).second) return error(where, ": the sequence is twice in one step");
    if (item.tokens.empty()) return error(where, ": no tokens to run");
    for (size_t t = 0; t < item.tokens.size(); ++t) {
      if (item.tokens[t] < 0 || item.tokens[t] >= vocab) {
        return error(where, ": token id ", item.tokens[t], " at index ", t, " is outside the vocabulary [0, ", vocab, ")");
      }
    }
    const int held = device_->num_tokens(item.sequence);
    if (held + int64_t(item.tokens.size()) > context_tokens()) {
      return error(where, ": the sequence would have ", held + int64_t(item.tokens.size()), " tokens (", held,
                   " already + ", item.tokens.size(), " new), more than the model's context of ", context_tokens(),
                   " tokens (max_position_embeddings)");
    }
    rows += int64_t(item.tokens.size());
    device_items.push_back({item.sequence, item.tokens, item.output});
  }
  if (rows > config_.max_step_tokens()) {
    return error("a step of ", rows, " tokens; the engine runs at most ", config_.max_step_tokens(),
                 " at once (prefill_chunk_tokens + max_sequences)");
  }
  std::vector<int> held_before(items.size());
  for (size_t i = 0; i < items.size(); ++i) held_before[i] = device_->num_tokens(items[i].sequence);
  // KV streamed layer by layer during this step: each streamed sequence's stream observes its forward
  // pass where the device has a store (the CPU); a GPU with device pages hands each layer's new blocks
  // out itself; a finishing stream gets the rest after the step. (A streamed sequence's observer is its
  // stream for the step: sequences run by sessions with their own observers are not streamed.)
  std::vector<SequenceId> observed, device_streamed, finishing;
  for (const StepItem& item : items) {  // first what can fail: the device's hand-outs for the next step
    auto stream = kv_streams_.find(item.sequence);
    if (stream == kv_streams_.end() || device_->kv_store(item.sequence) || !device_->streams_blocks() ||
        stream->second->form() == KvStreamForm::kDeviceWhole) {
      continue;
    }
    SLIMKV_RETURN_IF_ERROR(device_->stream_blocks_in_next_step(item.sequence, stream->second->device_blocks_out(),
                                                               stream->second->form() == KvStreamForm::kDeviceLayers,
                                                               stream->second->on_piece(), streamed_kv_bytes_));
    device_streamed.push_back(item.sequence);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    auto stream = kv_streams_.find(items[i].sequence);
    if (stream == kv_streams_.end()) continue;
    const KvStore* store = device_->kv_store(items[i].sequence);
    stream->second->begin_step(store, held_before[i] + int(items[i].tokens.size()));
    if (store) {
      (void)device_->set_observer(items[i].sequence, stream->second.get());
      observed.push_back(items[i].sequence);
    }
    if (stream->second->finishing()) finishing.push_back(items[i].sequence);
  }
  const Status stepped = device_->step(device_items, result);
  for (const SequenceId sequence : observed) (void)device_->set_observer(sequence, nullptr);
  if (stepped.is_ok()) {
    const int block_tokens = device_->kv_budget().block_tokens;
    for (const SequenceId sequence : device_streamed) kv_streams_.at(sequence)->device_step_done(block_tokens);
  }
  Status streamed = Status::ok();
  for (const SequenceId sequence : finishing) {
    const std::unique_ptr<KvLayerStream> stream = std::move(kv_streams_.at(sequence));
    kv_streams_.erase(sequence);
    if (!stepped.is_ok() || device_->kv_store(sequence) || !streamed.is_ok()) continue;
    const bool blocks_went = std::find(device_streamed.begin(), device_streamed.end(), sequence) != device_streamed.end();
    if (blocks_went && stream->form() == KvStreamForm::kHostBytes) {
      Expected<std::unique_ptr<KvStore>> open = device_->open_tokens(sequence);
      streamed = open ? stream->finish_with_open_tokens(**open) : open.status();
      continue;
    }
    if (stream->form() != KvStreamForm::kHostBytes) {
      // The layout and open tokens alone where the blocks went during the steps, else the whole KV.
      auto device = std::make_shared<DeviceKvTransfer>();
      streamed = device_->export_kv_to_device(sequence, identity_, *device, /*pages=*/!blocks_went);
      if (streamed.is_ok()) {
        stream->on_piece()({.layer = -1, .bytes = {}, .open = {}, .owner = nullptr, .first_block = 0, .final = true,
                            .device = std::move(device)});
      }
      continue;
    }
    // Into a buffer of an earlier transfer; its pieces share it, and the last one gives it back.
    std::vector<uint8_t> transfer = transfer_buffers_->take_largest();
    streamed = device_->export_kv(sequence, identity_, transfer);
    if (streamed.is_ok()) streamed = transfer_pieces(share_pooled(transfer_buffers_, std::move(transfer)), stream->on_piece());
  }
  SLIMKV_RETURN_IF_ERROR(stepped);
  SLIMKV_RETURN_IF_ERROR(streamed);
  // Non-finite logits mean broken arithmetic or weights: an error naming the place, never garbage
  // text with exit code 0. One pass over the rows returned (vocab floats each), cheap beside the step.
  for (size_t i = 0; i < items.size() && i < result.first_row.size(); ++i) {
    if (result.first_row[i] < 0) continue;
    const int64_t rows_of_item = items[i].output == StepOutput::kAllLogits ? int64_t(items[i].tokens.size()) : 1;
    const int64_t first_position = held_before[i] + int64_t(items[i].tokens.size()) - rows_of_item;
    for (int64_t row = 0; row < rows_of_item; ++row) {
      const std::span<const float> logits = result.logits_of(i, row);
      for (size_t v = 0; v < logits.size(); ++v) {
        if (!std::isfinite(logits[v])) {
          return error("sequence ", items[i].sequence, ", position ", first_position + row, ": logit of token ", v,
                       " is ", logits[v], " (non-finite: broken weights or an overflow in the forward pass)");
        }
      }
    }
  }
  return Status::ok();
}

KvBudget Engine::kv_budget() const {
  KvBudget budget = device_->kv_budget();
  // KV copied out of the stores into pieces a stream has not let go yet (a prefill worker's layers on
  // their way to a decode worker, held after their sequence is gone): memory as real as a sequence's,
  // so admission waits for it. Not a step's check: it is gone once the stream ends.
  const uint64_t held = streamed_kv_bytes_->load();
  if (held > 0 && budget.bytes_per_block > 0) {
    const int64_t held_blocks = int64_t((held + budget.bytes_per_block - 1) / budget.bytes_per_block);
    budget.free_blocks = std::max<int64_t>(0, budget.free_blocks - held_blocks);
  }
  budget.reserved_blocks = reserved_kv_blocks_->load();
  return budget;
}

Expected<int64_t> Engine::sequence_blocks(SequenceId sequence) const {
  SLIMKV_RETURN_IF_ERROR(check_sequence(sequence));
  return device_->sequence_blocks(sequence);
}

Expected<KvMemory> Engine::kv_memory(SequenceId sequence) const {
  SLIMKV_RETURN_IF_ERROR(check_sequence(sequence));
  const KvStore* store = device_->kv_store(sequence);
  if (!store) return error("the KV memory report of a sequence is for device 'cpu' (on the GPU: kv_budget)");
  return store->memory();
}

Expected<std::vector<uint8_t>> Engine::export_kv(SequenceId sequence) const {
  SLIMKV_RETURN_IF_ERROR(check_sequence(sequence));
  std::vector<uint8_t> out;
  SLIMKV_RETURN_IF_ERROR(device_->export_kv(sequence, identity_, out));
  return out;
}

Status Engine::stream_kv_in_next_step(SequenceId sequence, KvPieceCallback on_piece, KvStreamForm form) {
  SLIMKV_RETURN_IF_ERROR(check_sequence(sequence));
  if (form != KvStreamForm::kHostBytes && !device_->exports_kv_to_device()) {
    return error("streaming KV in GPU memory: this engine's KV (device '", config_.device, "', '", kv_description(),
                 "') leaves through host memory only");
  }
  if (const KvStore* store = device_->kv_store(sequence)) {
    // What the layer writers could refuse (a store the transfer format cannot hold, sizes) is refused now,
    // not mid-step.
    std::vector<uint8_t> head;
    SLIMKV_RETURN_IF_ERROR(write_kv_transfer_head(*store, identity_, store->num_tokens(0), head));
  }
  std::unique_ptr<KvLayerStream>& stream = kv_streams_[sequence];
  if (!stream) stream = std::make_unique<KvLayerStream>(identity_, transfer_buffers_, streamed_kv_bytes_, nullptr, form);
  stream->finish_in_next_step(std::move(on_piece), form);
  return Status::ok();
}

Status Engine::stream_sealed_kv(SequenceId sequence, KvPieceCallback on_piece, KvStreamForm form) {
  SLIMKV_RETURN_IF_ERROR(check_sequence(sequence));
  std::unique_ptr<KvLayerStream>& stream = kv_streams_[sequence];
  if (!stream) {
    stream = std::make_unique<KvLayerStream>(identity_, transfer_buffers_, streamed_kv_bytes_, std::move(on_piece), form);
  }
  return Status::ok();
}

Status DeviceModel::stream_blocks_in_next_step(SequenceId, int, bool, KvPieceCallback, std::shared_ptr<std::atomic<uint64_t>>) {
  return error("handing out KV blocks during a step runs on device 'cuda' with dense, hack or quant KV");
}

Expected<std::unique_ptr<KvStore>> DeviceModel::open_tokens(SequenceId) const {
  return error("the open tokens of a streamed sequence come from device 'cuda' with dense, hack or quant KV");
}

Status DeviceModel::export_kv_to_device(SequenceId, std::string_view, DeviceKvTransfer&, bool) const {
  return error("KV export into GPU memory runs on device 'cuda' with dense, hack or quant KV; this KV leaves by export_kv");
}

Status DeviceModel::import_kv_from_device(SequenceId, const DeviceKvTransfer&, std::string_view source, std::string_view) {
  return error("kv transfer '", source, "': KV import from GPU memory runs on device 'cuda' with dense, hack or quant KV");
}

Expected<std::unique_ptr<KvStore>> DeviceModel::transfer_store() const {
  return error("laying out a KV transfer before its head: this device's KV is not staged as it arrives");
}

Expected<std::shared_ptr<KvStore>> DeviceModel::new_kv_store() const {
  return error("a KV store outside the engine (a transfer restored as it arrives) is device 'cpu''s; this device imports "
               "whole transfers");
}

Status DeviceModel::adopt_kv(SequenceId, std::shared_ptr<KvStore>, std::string_view source) {
  return error("KV '", source, "': a KV store is adopted on device 'cpu'; this device imports whole transfers");
}

Expected<std::unique_ptr<KvStaging>> DeviceModel::new_kv_staging(const KvTransferInfo&, std::string_view source,
                                                                 std::string_view) const {
  return error("kv transfer '", source, "': this device's KV is not staged as it arrives (device 'cpu', or 'cuda' with ",
               "dense, hack or quant KV); its streams are imported whole");
}

KvReservation::KvReservation(std::shared_ptr<std::atomic<int64_t>> reserved, int64_t blocks)
    : reserved_(std::move(reserved)), blocks_(blocks) {
  reserved_->fetch_add(blocks_);
}

KvReservation::~KvReservation() { reserved_->fetch_sub(blocks_); }

bool Engine::stages_kv() const { return device_->stages_kv(); }

Expected<std::shared_ptr<KvReservation>> Engine::reserve_kv(int64_t tokens, std::string_view source) const {
  // Counted at once, so that two streams arriving together cannot both pass. Against the budget's whole,
  // not what is free now: a transfer that fits waits for its room at admission, as any request does;
  // one that could never be admitted beside the transfers already on their way is refused now (the
  // router retries it elsewhere).
  const KvBudget& budget = kv_budget_at_load_;
  auto reservation = std::make_shared<KvReservation>(reserved_kv_blocks_, budget.blocks_for_tokens(tokens));
  const int64_t reserved = reserved_kv_blocks_->load();
  if (reserved > budget.total_blocks) {
    return error("kv transfer '", source, "': its ", tokens, " tokens need ", reservation->blocks(),
                 " blocks of this worker's KV budget of ", budget.total_blocks, " blocks, of which ",
                 reserved - reservation->blocks(), " are reserved for other KV transfers on their way");
  }
  return reservation;
}

Expected<std::vector<uint8_t>> Engine::kv_transfer_head(int64_t tokens) const {
  SLIMKV_ASSIGN_OR_RETURN(const std::unique_ptr<KvStore> store, device_->transfer_store());
  if (tokens < 0 || tokens > store->shape().max_tokens) {
    return error("the KV transfer head of ", tokens, " tokens: expected 0 to this engine's context of ",
                 store->shape().max_tokens);
  }
  std::vector<uint8_t> head;
  SLIMKV_RETURN_IF_ERROR(write_kv_transfer_head(*store, identity_, int(tokens), head));
  return head;
}

Expected<std::unique_ptr<KvStaging>> Engine::new_kv_staging(const KvTransferInfo& info, std::string_view source,
                                                             std::shared_ptr<KvReservation> reserved) const {
  int tokens = 0;
  for (const int layer_tokens : info.layer_tokens) tokens = std::max(tokens, layer_tokens);
  // Reserved before the placement takes any memory.
  if (!reserved || reserved->blocks() < kv_budget_at_load_.blocks_for_tokens(tokens)) {
    reserved = nullptr;  // let go before the whole is reserved again
    SLIMKV_ASSIGN_OR_RETURN(reserved, reserve_kv(tokens, source));
  }
  SLIMKV_ASSIGN_OR_RETURN(std::unique_ptr<KvStaging> staging, device_->new_kv_staging(info, source, identity_));
  staging->reservation_ = std::move(reserved);
  return staging;
}

bool Engine::exports_kv_to_device() const { return device_->exports_kv_to_device(); }

Expected<DeviceKvTransfer> Engine::export_kv_to_device(SequenceId sequence) const {
  SLIMKV_RETURN_IF_ERROR(check_sequence(sequence));
  DeviceKvTransfer out;
  SLIMKV_RETURN_IF_ERROR(device_->export_kv_to_device(sequence, identity_, out, /*pages=*/true));
  return out;
}

namespace {

// KV comes into an empty sequence only (an import or an adopted store never appends to what it holds).
Status check_empty(const DeviceModel& device, SequenceId sequence, const std::string& what, std::string_view verb) {
  if (device.num_tokens(sequence) == 0) return Status::ok();
  return error(what, ": sequence ", sequence, " already holds ", device.num_tokens(sequence), " tokens; KV is ", verb,
               " an empty sequence");
}

}  // namespace

Status Engine::import_kv_from_device(SequenceId sequence, const DeviceKvTransfer& transfer, std::string_view source) {
  SLIMKV_RETURN_IF_ERROR(check_sequence(sequence));
  SLIMKV_RETURN_IF_ERROR(check_empty(*device_, sequence, str_cat("kv transfer '", source, "'"), "imported into"));
  return device_->import_kv_from_device(sequence, transfer, source, identity_);
}

Status Engine::import_kv(SequenceId sequence, std::span<const uint8_t> transfer, std::string_view source,
                         std::optional<uint32_t> received_crc) {
  SLIMKV_RETURN_IF_ERROR(check_sequence(sequence));
  SLIMKV_RETURN_IF_ERROR(check_empty(*device_, sequence, str_cat("kv transfer '", source, "'"), "imported into"));
  return device_->import_kv(sequence, transfer, source, identity_, received_crc);
}

Expected<std::shared_ptr<KvStore>> Engine::new_kv_store() const { return device_->new_kv_store(); }

Status Engine::adopt_kv(SequenceId sequence, std::shared_ptr<KvStore> kv, std::string_view source) {
  SLIMKV_RETURN_IF_ERROR(check_sequence(sequence));
  SLIMKV_RETURN_IF_ERROR(check_empty(*device_, sequence, str_cat("KV '", source, "'"), "adopted by"));
  return device_->adopt_kv(sequence, std::move(kv), source);
}

// ----------------------------------------------------------------------------------------------
// Sessions

std::unique_ptr<Session> Engine::new_session() {
  // An engine full of sequences gives a session whose first run reports it (as the GPU always did).
  Expected<SequenceId> sequence = add_sequence();
  return std::unique_ptr<Session>(new Session(*this, sequence.has_value() ? *sequence : -1, sequence.status()));
}

Session::~Session() {
  if (sequence_ >= 0) (void)engine_.remove_sequence(sequence_);
}

int Session::num_tokens() const { return sequence_ >= 0 ? engine_.device_->num_tokens(sequence_) : 0; }

const KvStore& Session::kv() const { return *engine_.device_->kv_store(sequence_); }

Status Session::set_observer(ForwardObserver* observer) {
  SLIMKV_RETURN_IF_ERROR(status_);
  return engine_.device_->set_observer(sequence_, observer);
}

Expected<std::vector<float>> Session::prefill(std::span<const int32_t> tokens, bool all_logits) {
  SLIMKV_RETURN_IF_ERROR(status_);
  if (tokens.empty()) return error("no tokens to run: the prompt is empty");
  // Checked whole first, so that a prompt refused for its length or an id runs no chunk.
  const int64_t vocab = engine_.model_config().vocab_size;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      return error("token id ", tokens[i], " at index ", i, " is outside the vocabulary [0, ", vocab, ")");
    }
  }
  if (num_tokens() + int64_t(tokens.size()) > context_tokens()) {
    return error("sequence would have ", num_tokens() + int64_t(tokens.size()), " tokens (", num_tokens(),
                 " already + ", tokens.size(), " new), more than the model's context of ", context_tokens(),
                 " tokens (max_position_embeddings)");
  }
  std::vector<float> logits;
  const size_t chunk = size_t(engine_.config().prefill_chunk_tokens);
  StepResult result;
  for (size_t first = 0; first < tokens.size(); first += chunk) {
    const auto part = tokens.subspan(first, std::min(chunk, tokens.size() - first));
    const bool last_part = first + part.size() == tokens.size();
    const StepOutput output = all_logits ? StepOutput::kAllLogits : last_part ? StepOutput::kLastLogits : StepOutput::kNone;
    const StepItem item{sequence_, part, output};
    SLIMKV_RETURN_IF_ERROR(engine_.step(std::span(&item, 1), result));
    logits.insert(logits.end(), result.logits.begin(), result.logits.end());
  }
  return logits;
}

Expected<std::vector<float>> Session::decode_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens) {
  if (sessions.empty() || sessions.size() != tokens.size()) {
    return error("a batched decode step of ", sessions.size(), " sessions and ", tokens.size(), " tokens");
  }
  Engine& engine = sessions[0]->engine_;
  std::vector<StepItem> items;
  for (size_t i = 0; i < sessions.size(); ++i) {
    if (&sessions[i]->engine_ != &engine) return error("a batched decode step takes sessions of one engine");
    SLIMKV_RETURN_IF_ERROR(sessions[i]->status_.with_context(str_cat("session ", i)));
    items.push_back({sessions[i]->sequence_, tokens.subspan(i, 1), StepOutput::kLastLogits});
  }
  StepResult result;
  SLIMKV_RETURN_IF_ERROR(engine.step(items, result));
  return std::move(result.logits);
}

}  // namespace slimkv
