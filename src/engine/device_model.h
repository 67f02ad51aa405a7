// The model and the KV of every sequence on one device, as the engine sees it: the CPU's
// (engine/cpu_device_model.h) and the CUDA backend's (engine/cuda/cuda_device_model.cc). An interface,
// so that the engine needs no accelerator headers and a build without the backend links.
//
// The engine checks what it can before calling (sequence ids exist and are distinct, token ids are in
// the vocabulary, the context holds them, the step's rows fit); a device checks its own limits (the KV
// budget) and must leave every sequence as it was when it refuses a step.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "slimkv/engine.h"

namespace slimkv {

struct KvPipeline;
struct KvTransferInfo;
class KvStaging;
class LlamaModel;

// One sequence's part of a step, as the device gets it.
struct DeviceStepItem {
  SequenceId sequence = 0;
  std::span<const int32_t> tokens;
  StepOutput output = StepOutput::kLastLogits;
};

class DeviceModel {
 public:
  virtual ~DeviceModel() = default;

  virtual int context_tokens() const = 0;
  // The KV spec as this device runs it (the GPU keeps dense blocks in FP16: dense:dtype=f16).
  virtual std::string kv_description() const = 0;

  // A new, empty sequence under the engine's id; an error when max_sequences are held.
  virtual Status add_sequence(SequenceId sequence, const SamplingParams& sampling) = 0;
  virtual void remove_sequence(SequenceId sequence) = 0;  // frees its blocks; the id exists
  virtual int num_tokens(SequenceId sequence) const = 0;

  // One pass of every item through the model (see Engine::step). result: filled as StepResult says.
  virtual Status step(std::span<const DeviceStepItem> items, StepResult& result) = 0;

  virtual KvBudget kv_budget() const = 0;
  virtual int64_t sequence_blocks(SequenceId sequence) const = 0;

  // The transfer format (kv/transfer.h) of one sequence, and back into an empty one (received_crc: as
  // Engine::import_kv's).
  virtual Status export_kv(SequenceId sequence, std::string_view model_id, std::vector<uint8_t>& out) const = 0;
  virtual Status import_kv(SequenceId sequence, std::span<const uint8_t> transfer, std::string_view source,
                           std::string_view model_id, std::optional<uint32_t> received_crc) = 0;

  // Engine::new_kv_store (safe from any thread) and adopt_kv: device "cpu"'s; others answer an error.
  virtual Expected<std::shared_ptr<KvStore>> new_kv_store() const;
  virtual Status adopt_kv(SequenceId sequence, std::shared_ptr<KvStore> kv, std::string_view source);
  // Engine::stages_kv and new_kv_staging's device part (engine/kv_staging.h): the placement of a staged
  // import whose head is `info`, its head checked against this device's KV (model_id: the engine's). Safe
  // from any thread. Devices that cannot answer false / an error: their streams are imported whole.
  virtual bool stages_kv() const { return false; }
  // An empty host store of this device's KV spec and shape, as its transfers describe the KV (the
  // staged import's, Engine::kv_transfer_head's); devices that do not stage: an error.
  virtual Expected<std::unique_ptr<KvStore>> transfer_store() const;
  virtual Expected<std::unique_ptr<KvStaging>> new_kv_staging(const KvTransferInfo& info, std::string_view source,
                                                              std::string_view model_id) const;

  // The same with the sealed blocks staying in GPU memory (Engine::export_kv_to_device); devices
  // without such blocks answer false / an error. Without `pages`, the layout and open tokens alone (the
  // blocks went out during the steps: stream_blocks_in_next_step's to_device).
  virtual bool exports_kv_to_device() const { return false; }
  virtual Status export_kv_to_device(SequenceId sequence, std::string_view model_id, DeviceKvTransfer& out, bool pages) const;
  virtual Status import_kv_from_device(SequenceId sequence, const DeviceKvTransfer& transfer, std::string_view source,
                                       std::string_view model_id);

  // A streamed sequence's sealed blocks handed out during its next step on a device without a store
  // (the CPU's come from its store through set_observer): right after each layer's attention, `on_piece`
  // gets the layer's blocks [first_block, the step's full blocks), final false, whose `ready` waits until
  // they are copied while later layers compute: to host memory as write_kv_transfer_blocks's bytes, or
  // (to_device) into GPU memory as pages (KvTransferPiece::device); nothing when the step fills no
  // block. held_bytes counts the pieces' memory while they live. Devices that cannot (streams_blocks()
  // false) answer an error; their KV streams whole after the step.
  virtual bool streams_blocks() const { return false; }
  virtual Status stream_blocks_in_next_step(SequenceId sequence, int first_block, bool to_device, KvPieceCallback on_piece,
                                            std::shared_ptr<std::atomic<uint64_t>> held_bytes);
  // The sequence's tokens after its last full block as a store of their own (the device's pipeline and
  // shape), for the open tokens of a stream whose blocks went out during steps (streams_blocks()).
  virtual Expected<std::unique_ptr<KvStore>> open_tokens(SequenceId sequence) const;

  // The sequence's CPU store and forward-pass observer (device "cpu"); the GPU answers nullptr / an error.
  virtual const KvStore* kv_store(SequenceId sequence) const = 0;
  virtual Status set_observer(SequenceId sequence, ForwardObserver* observer) = 0;
};

// The CPU's: the model's forward pass over every item's rows at once, each sequence a KvStore whose
// blocks come from one budget (engine/cpu_device_model.cc).
Expected<std::unique_ptr<DeviceModel>> make_cpu_model(const LlamaModel& model, const KvPipeline& pipeline,
                                                      const EngineConfig& config, ThreadPool& pool);

// The CUDA backend's on visible GPU `gpu`, defined in its plugin libslimkv_cuda.so (the engine reaches it
// through engine/cuda_backend.h). Every call of the device model, from any thread, runs on that GPU.
// An error names what of the KV pipeline the GPU does not run yet.
Expected<std::unique_ptr<DeviceModel>> load_cuda_model(const LlamaModel& model, const KvPipeline& pipeline,
                                                       const EngineConfig& config, int gpu);

}  // namespace slimkv
