// The engine: a model loaded once (weights memory-mapped, tokenizer if the directory has one, the KV
// pipeline from the spec) and the sequences it holds, on the CPU or the GPU.
//
// Serving drives it by steps: each step runs many sequences of any lengths through the model together
// (prefill chunks and decode tokens mixed; one pass over the weights for all of them), each asking for
// logits or for a sampled token. The KV of every sequence lives in one bounded block budget
// (kv_budget()), and a sequence's KV can be exported and imported (the transfer format of
// docs/kv_transfer_format.md): prefill→decode hand-off, and preemption to host memory.
//
//   auto engine = Engine::load({.model_dir = "models/x", .kv_spec = "hack:bits=2"});
//   SequenceId a = *(*engine)->add_sequence(), b = *(*engine)->add_sequence({.temperature = 0.7f, .seed = 1});
//   StepResult out;
//   (*engine)->step({{a, prompt_a, StepOutput::kSample}, {b, prompt_b, StepOutput::kSample}}, out);
//   // out.tokens[0], out.tokens[1]: each sequence's next token; feed them to the next step.
//
// Sessions (below) are the one-sequence convenience over the same calls: prefill(ids) / decode(id).
//
// Threads and lifetimes: an Engine is driven by one thread at a time (the scheduler's, or a tool's):
// add_sequence, remove_sequence, step, import_kv and the Session calls mutate it; the accessors of what
// was loaded (model_config, tokenizer, generation_defaults, config, kv_description, apply_chat_template)
// are safe from any thread. Sequences and Sessions must not outlive their Engine.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "slimkv/device_kv_transfer.h"
#include "slimkv/device_name.h"
#include "slimkv/kv_memory.h"
#include "slimkv/status.h"

namespace slimkv {

class LlamaModel;
class Tokenizer;
class KvStore;
class ThreadPool;
class BufferPool;
struct KvPipeline;
struct ModelConfig;
struct ForwardObserver;
class DeviceModel;
class ChatTemplate;

struct EngineConfig {
  std::string model_dir;
  std::string kv_spec = "dense";
  // "cpu", or "cuda" / "cuda:N" for visible GPU N (builds with the CUDA backend; slimkv/device_name.h)
  std::string device = "cpu";
  int threads = 0;              // 0: every core
  int prefill_chunk_tokens = 512;  // a prompt runs in chunks of this many tokens
  // Workers to run on, shared by engines used one at a time (slimkv eval holds one per KV spec);
  // nullptr: the engine starts its own `threads` workers.
  std::shared_ptr<ThreadPool> pool = nullptr;
  int max_sequences = 16;  // sequences held at once
  // Rows a step may hold at most: one chunk of prompts and a decode token of every other sequence.
  int max_step_tokens() const { return prefill_chunk_tokens + max_sequences; }
  // Memory for KV blocks, every sequence together (on the GPU: device memory; on the CPU: host memory,
  // with a slow tier: the fast tier's share). 0: max_sequences full contexts, within 90% of what the
  // device has free.
  size_t kv_cache_bytes = 0;
  // KV transfer buffers kept for reuse across transfers, their bytes at most (transfer_buffers(): a
  // streamed export's bytes; a worker's KV stream receiver and scheduler share them). 0: none kept.
  size_t transfer_buffer_bytes = size_t(4) << 30;
};

// generation_config.json, where present (all optional).
struct GenerationDefaults {
  std::vector<int64_t> eos_token_ids;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
};

// generation_config.json's text (from `path`, named in errors with line and column) on top of
// config.json's eos_token_ids; fuzzed (fuzz/generation_config_fuzz.cc).
Expected<GenerationDefaults> parse_generation_config(const std::string& text, const std::string& path,
                                                     const std::vector<int64_t>& config_eos_token_ids);

// How a sequence's next tokens are drawn. A draw is a function of the logits, these parameters and the
// token's position alone (counter-based randomness), so a sequence samples the same tokens whatever
// runs beside it, and after being exported and imported (preemption) it goes on as it would have.
struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax)
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;        // 1: no limit
  uint64_t seed = 0;
};

using SequenceId = int64_t;  // unique within an engine, never reused

// The KV block budget. A block here is block_tokens tokens of one sequence in every layer and KV head
// (the unit a sequence grows by); a sequence of n tokens holds ceil(n / block_tokens) of them.
struct KvBudget {
  int block_tokens = 0;
  int64_t total_blocks = 0;
  int64_t free_blocks = 0;
  size_t bytes_per_block = 0;  // memory one block takes (the codec's sealed bytes, every layer and head)
  // Of free_blocks, those held for KV transfers on their way to this engine (KvReservation): steps may
  // grow into them, admissions leave them free for the requests whose KV is arriving.
  int64_t reserved_blocks = 0;
  int64_t blocks_for_tokens(int64_t tokens) const { return (tokens + block_tokens - 1) / block_tokens; }
  double usage() const { return total_blocks ? double(total_blocks - free_blocks) / double(total_blocks) : 0.0; }
};

// What one sequence's part of a step asks for.
enum class StepOutput {
  kNone,        // nothing (a prefill chunk before the last)
  kLastLogits,  // logits of its last token [vocab]
  kAllLogits,   // logits of every token it ran [n, vocab]
  kSample,      // its next token, drawn as the sequence's SamplingParams say (on the GPU, on the device)
};

struct StepItem {
  SequenceId sequence = 0;
  std::span<const int32_t> tokens;  // run at the end of what the sequence holds
  StepOutput output = StepOutput::kLastLogits;
};

struct StepResult {
  std::vector<float> logits;       // the rows asked for, items in order: [rows, vocab]
  std::vector<int64_t> first_row;  // per item: its first row in logits, -1 when it asked for none
  std::vector<int32_t> tokens;     // per item: the sampled token (kSample), else -1
  int vocab = 0;
  // Row `row` of item `item`'s logits.
  std::span<const float> logits_of(size_t item, int64_t row = 0) const {
    return std::span<const float>(logits).subspan(size_t(first_row[item] + row) * size_t(vocab), size_t(vocab));
  }
};

// How a streamed sequence's KV leaves the engine (Engine::stream_sealed_kv, stream_kv_in_next_step).
enum class KvStreamForm {
  kHostBytes,    // pieces of the transfer format in host memory (a TCP stream)
  kDeviceWhole,  // one DeviceKvTransfer after the last step, sealed blocks in GPU memory (CUDA IPC)
  // on a GPU with device pages, each layer's blocks in GPU memory as steps seal them, then a
  // DeviceKvTransfer of the layout and the open tokens (NCCL: the blocks travel while later layers run)
  kDeviceLayers,
};

// A piece of a sequence's KV transfer (docs/kv_transfer_format.md) handed out while a step runs: during
// a prompt's earlier chunks each layer's newly sealed blocks (Engine::stream_sealed_kv), then, in the
// step that finishes it, the head and each layer's rest as soon as it is final (stream_kv_in_next_step).
struct KvTransferPiece {
  int layer = -1;  // -1: the head (header and metadata); else the layer
  // The head; or the layer's sealed blocks from first_block on (every head's, head by head).
  std::span<const uint8_t> bytes;
  std::span<const uint8_t> open;  // a final layer piece's open tokens (they follow every sealed block in the transfer)
  // What `bytes` and `open` lie in, held as long as the piece is: the pieces of one export share it (no
  // copy), and it goes back to the engine's transfer buffers (or the GPU's pinned ones) when the last of
  // them is gone.
  std::shared_ptr<const void> owner;
  int first_block = 0;  // a layer's: its first sealed block in `bytes`
  bool final = true;    // a layer's: its last piece (with the open tokens); false: sealed blocks only
  // A layer's: the CRC32C of each KV head's part of `bytes`, then (final) of `open`, computed as they
  // were written (a sender's frames then need not read them again); empty: not computed.
  std::vector<uint32_t> crcs = {};
  // KvStreamForm::kDeviceWhole: the whole KV in this one piece, its sealed blocks in GPU memory (layer
  // -1, bytes empty). kDeviceLayers: a layer's blocks from first_block as pages in GPU memory (layer ≥ 0,
  // final false, num_layers 1, no open tokens), and at last (layer -1) the layout and open tokens with no
  // pages (every block went before).
  std::shared_ptr<const DeviceKvTransfer> device = nullptr;
  // A GPU's blocks handed out during a step: waits until `bytes` hold them (copied from the GPU while
  // later layers compute). Call before reading `bytes`; null: they are there.
  std::function<Status()> ready = nullptr;
};
using KvPieceCallback = std::function<void(KvTransferPiece)>;

class Session;
class KvLayerStream;
class KvStaging;
struct KvTransferInfo;

// Blocks of an engine's KV budget held for one KV transfer on its way (Engine::new_kv_staging), from
// the moment its layout is known until the scheduler imports it (the request's admission counts them as
// its own) or the holder lets go (a stream that failed, a stream nobody claimed, a finished request).
// Safe from any thread.
class KvReservation {
 public:
  KvReservation(std::shared_ptr<std::atomic<int64_t>> reserved, int64_t blocks);
  ~KvReservation();
  KvReservation(const KvReservation&) = delete;
  KvReservation& operator=(const KvReservation&) = delete;
  int64_t blocks() const { return blocks_; }

 private:
  std::shared_ptr<std::atomic<int64_t>> reserved_;  // the engine's count of reserved blocks
  int64_t blocks_ = 0;
};

class Engine {
 public:
  static Expected<std::unique_ptr<Engine>> load(const EngineConfig& config);
  ~Engine();

  const ModelConfig& model_config() const;
  const LlamaModel& model() const { return *model_; }
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }  // nullptr without tokenizer.json
  const GenerationDefaults& generation_defaults() const { return generation_; }
  const EngineConfig& config() const { return config_; }
  const DeviceName& device() const { return device_name_; }  // config().device, parsed
  bool on_gpu() const { return device_name_.cuda; }
  // The KV spec with every option spelled out, as this device runs it (the key a KV transfer matches).
  std::string kv_description() const;
  const KvPipeline& kv_pipeline() const { return *pipeline_; }
  int context_tokens() const;  // the most tokens a sequence holds

  // The model's chat template (chat_template.jinja, else tokenizer_config.json's), rendered as
  // transformers' apply_chat_template(messages, tokenize=False, add_generation_prompt=...): messages a
  // JSON array of {role, content, ...} in the client's key order; extra adds template variables (tools,
  // enable_thinking, ...). Errors: the model has no template, or one outside this renderer's subset
  // (has_chat_template() is false: the engine still runs completions; unreadable or malformed files
  // fail Engine::load), the template refuses the
  // conversation (its raise_exception message), or fails (its line and column). Safe from any thread.
  Expected<std::string> apply_chat_template(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                            const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  bool has_chat_template() const { return chat_template_ != nullptr; }
  int64_t vocab_size() const;  // the model's (token ids are in [0, vocab_size))

  // --- Sequences and steps ---
  // A new, empty sequence; an error when max_sequences are held.
  Expected<SequenceId> add_sequence(const SamplingParams& sampling = {});
  // Frees the sequence's KV blocks; an unknown id is an error.
  Status remove_sequence(SequenceId sequence);
  Expected<int> num_tokens(SequenceId sequence) const;
  int num_sequences() const { return int(sequences_.size()); }  // held now (at most max_sequences)

  // Runs every item's tokens through the model in one pass (items name distinct sequences; at most
  // config().max_step_tokens() rows together). Everything is checked first — ids, vocabulary, context, the
  // step's size, the KV budget — and a refused step changes nothing; the error names the item.
  Status step(std::span<const StepItem> items, StepResult& result);

  // --- The KV budget ---
  // The device's blocks; on the CPU less the blocks' worth of KV held in pieces a stream handed out and
  // that are not let go yet (stream_kv_in_next_step: a prefill worker's layers still being sent after
  // their sequence is gone), so that admission does not give their memory again.
  KvBudget kv_budget() const;
  Expected<int64_t> sequence_blocks(SequenceId sequence) const;  // budget blocks the sequence holds
  // What the sequence's KV takes and where (device "cpu"; the GPU reports its blocks through kv_budget).
  Expected<KvMemory> kv_memory(SequenceId sequence) const;

  // --- KV export and import (docs/kv_transfer_format.md: the same bytes on both devices) ---
  // The sequence's KV as a transfer (sealed blocks as the codec encodes them, open tokens in FP32).
  Expected<std::vector<uint8_t>> export_kv(SequenceId sequence) const;
  // Replaces an empty sequence's KV with a transfer's; refused (naming both sides) when the transfer was
  // made by another model or KV spec (kv_description()), is corrupt, or does not fit the budget. `source`
  // names the bytes in errors. received_crc: the CRC32C of the transfer's bytes before its trailer as its
  // receiver computed them while they arrived (ReceivedKv::received_crc): compared with the trailer's
  // instead of a second pass over the bytes; absent (a file, a preempted sequence's export): computed here.
  Status import_kv(SequenceId sequence, std::span<const uint8_t> transfer, std::string_view source,
                   std::optional<uint32_t> received_crc = std::nullopt);
  // A sequence's KV restored outside the engine while it steps: an empty store of this engine's KV
  // (spec, shape) that a decode worker's KV stream receiver restores each layer into as soon as the
  // layer has arrived and been checked (the CPU's staged import: new_kv_staging), on its own thread,
  // while later layers are still on the wire; adopt_kv then gives it to a sequence once the whole
  // transfer has checked out. The scheduler never sees a half-imported sequence, and what a failed
  // stream staged is freed with the store. Safe from any thread. Device "cpu" (elsewhere an error: the
  // GPU stages into GPU memory, import_kv_from_device).
  Expected<std::shared_ptr<KvStore>> new_kv_store() const;
  // A decode worker's staged import of one KV stream whose head is `info` (engine/kv_staging.h): the
  // transfer's blocks reserved in the KV budget (refused, naming the counts, when the transfer needs
  // more than the budget's blocks not reserved already), its head checked against this engine's KV
  // (model, spec, shape), and the device's placement of each layer as it lands (the CPU's: a store
  // adopt_kv takes; the GPU's: pages uploaded into GPU memory as layers complete, which
  // import_kv_from_device takes). Safe from any thread. stages_kv(): whether this device's KV can be
  // staged (else its streams are imported whole).
  // `reserved`: blocks reserved already for this stream (reserve_kv when HELLO announced its tokens),
  // taken over when they cover the head's tokens (else reserved again).
  bool stages_kv() const;
  Expected<std::unique_ptr<KvStaging>> new_kv_staging(const KvTransferInfo& info, std::string_view source,
                                                      std::shared_ptr<KvReservation> reserved = nullptr) const;
  // The head (header and metadata, kv/transfer.h's write_kv_transfer_head) of the transfer a sequence of
  // `tokens` tokens in every layer would have, where this device stages imports (stages_kv()): a decode
  // worker's KV stream receiver lays an announced transfer out with it before the sender's head comes.
  // Safe from any thread.
  Expected<std::vector<uint8_t>> kv_transfer_head(int64_t tokens) const;
  // The blocks of `tokens` tokens reserved in the KV budget for a KV stream on its way (refused as
  // new_kv_staging refuses). Safe from any thread.
  Expected<std::shared_ptr<KvReservation>> reserve_kv(int64_t tokens, std::string_view source) const;
  // Replaces an empty sequence's KV by `kv`, a store of this engine's new_kv_store, restored from a
  // checked transfer; refused when it does not fit the budget. `source` names it in errors.
  Status adopt_kv(SequenceId sequence, std::shared_ptr<KvStore> kv, std::string_view source);
  // During the sequence's next step only (whatever it is), `on_piece` receives the transfer the sequence
  // will hold after that step, piece by piece: on the CPU each layer right after its attention, while
  // later layers compute (a prefill worker sends layer l meanwhile); on the GPU (dense, hack or quant
  // KV) each layer's blocks sealed in the step right after its attention (as stream_sealed_kv's), then
  // after the step the head and each layer's open tokens (other GPU KV: every piece after the step).
  // Their bytes, in the transfer's order with kv_transfer_trailer, are export_kv's after the step.
  // The calls run on the stepping thread; on the CPU the stream is the sequence's forward observer for
  // that step (a session's observer is replaced). Errors: an unknown sequence, or KV the format cannot
  // hold.
  // Forms other than host bytes, on an engine whose KV can leave as a DeviceKvTransfer
  // (export_kv_to_device): kDeviceWhole, one piece after the step holding it (the CUDA IPC path);
  // kDeviceLayers, the blocks as pages in GPU memory (KvTransferPiece::device) as stream_sealed_kv's, then
  // the layout and open tokens after the step (the NCCL path).
  Status stream_kv_in_next_step(SequenceId sequence, KvPieceCallback on_piece, KvStreamForm form = KvStreamForm::kHostBytes);
  // From the sequence's next step until the step stream_kv_in_next_step streams: right after each
  // layer's attention, the layer's blocks sealed since its last piece (pieces with final false), so that
  // a prompt's earlier chunks and layers travel while later ones compute; stream_kv_in_next_step's
  // pieces then start at the first block not handed out. On the GPU a piece's bytes are copied while
  // later layers run: its `ready` waits for them. Calling it again keeps the stream going (the first
  // call's callback). `form`: as stream_kv_in_next_step's (the same for both); with kDeviceWhole and on
  // GPU KV without device pages nothing is handed out early: the final pieces hold every block. Errors:
  // an unknown sequence.
  Status stream_sealed_kv(SequenceId sequence, KvPieceCallback on_piece, KvStreamForm form = KvStreamForm::kHostBytes);
  // The sequence's KV with its sealed blocks copied, device to device, into an allocation of their own
  // (device "cuda" with dense, hack or quant KV; elsewhere an error: that KV moves by export_kv).
  Expected<DeviceKvTransfer> export_kv_to_device(SequenceId sequence) const;
  bool exports_kv_to_device() const;  // whether export_kv_to_device can work here
  // import_kv from a DeviceKvTransfer whose pages are in this process's memory of this GPU: the blocks
  // are copied device to device into the paged cache. The open tokens' transfer is checked as import_kv
  // checks a transfer (model, spec, shape); the pages' size against the spec's blocks.
  Status import_kv_from_device(SequenceId sequence, const DeviceKvTransfer& transfer, std::string_view source);
  // The model identity transfers carry (model/model_identity.h).
  const std::string& model_identity() const { return identity_; }

  // --- One-sequence convenience ---
  std::unique_ptr<Session> new_session();

  // The workers sequences run on, for tools that run kernels beside a session (eval's fidelity task).
  ThreadPool& pool() const { return *pool_; }
  // The KV transfer buffers this engine's exports take and give back (EngineConfig::transfer_buffer_bytes).
  const std::shared_ptr<BufferPool>& transfer_buffers() const { return transfer_buffers_; }

 private:
  Engine() = default;
  friend class Session;
  Status check_sequence(SequenceId sequence) const;  // an error naming an id this engine does not hold

  EngineConfig config_;
  DeviceName device_name_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> chat_template_;  // nullptr: the model has none
  Status chat_template_status_;                   // why not, when it has none
  std::unique_ptr<KvPipeline> pipeline_;
  std::shared_ptr<ThreadPool> pool_;
  std::shared_ptr<BufferPool> transfer_buffers_;
  // Bytes of this engine's KV copied into streamed pieces (stream_sealed_kv, stream_kv_in_next_step; on
  // the GPU the pinned copies of blocks handed out during steps) that their receivers have not let go
  // yet: kv_budget counts them.
  std::shared_ptr<std::atomic<uint64_t>> streamed_kv_bytes_ = std::make_shared<std::atomic<uint64_t>>(0);
  // Blocks held by KvReservations (KV transfers on their way): kv_budget reports them; and the budget's
  // total, read once, which new_kv_staging checks reservations against from any thread.
  std::shared_ptr<std::atomic<int64_t>> reserved_kv_blocks_ = std::make_shared<std::atomic<int64_t>>(0);
  KvBudget kv_budget_at_load_;
  GenerationDefaults generation_;
  std::string identity_;
  std::unique_ptr<DeviceModel> device_;  // the model on the device, the sequences' KV and the budget
  std::set<SequenceId> sequences_;
  // stream_sealed_kv's and stream_kv_in_next_step's, until the step that finishes the stream.
  std::map<SequenceId, std::unique_ptr<KvLayerStream>> kv_streams_;
  SequenceId next_sequence_ = 0;
};

// One sequence of an engine, run by itself: a prompt, then tokens one at a time. The sequence is
// added with the session (an engine holding max_sequences gives a session whose calls say so) and
// removed with it.
class Session {
 public:
  ~Session();

  // Runs tokens through the model at the end of the sequence (in chunks of prefill_chunk_tokens).
  // Returns logits [n, vocab] when all_logits, else [vocab] of the last token. Errors: empty input, ids
  // outside the vocabulary, more tokens than the context holds, or no room in the KV budget.
  Expected<std::vector<float>> prefill(std::span<const int32_t> tokens, bool all_logits = false);
  Expected<std::vector<float>> decode(int32_t token) { return prefill(std::span<const int32_t>(&token, 1)); }

  // One decode step of several sessions of one engine (sessions[i] takes tokens[i]) as one engine step.
  // Returns logits [sessions, vocab]. A refused step runs none.
  static Expected<std::vector<float>> decode_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens);

  SequenceId sequence() const { return sequence_; }
  int num_tokens() const;
  int context_tokens() const { return engine_.context_tokens(); }
  bool on_gpu() const { return engine_.on_gpu(); }
  // The sequence's KV store: device "cpu" only (a GPU session has none to show).
  const KvStore& kv() const;

  // Later calls show each layer's buffers to `observer` (model/forward_observer.h); nullptr stops it.
  // The observer must outlive those calls. Device "cpu" only: a GPU session's prefill refuses.
  Status set_observer(ForwardObserver* observer);

 private:
  friend class Engine;
  Session(Engine& engine, SequenceId sequence, Status status)
      : engine_(engine), sequence_(sequence), status_(std::move(status)) {}
  Engine& engine_;
  SequenceId sequence_;  // -1 when the engine had no room for it...
  Status status_;        // ...and why: every call reports it

};

}  // namespace slimkv
