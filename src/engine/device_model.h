// A model on an accelerator, as the engine sees it (device "cuda": engine/cuda/cuda_device_model.cc):
// it holds the weights and one KV cache that every session's sequence lives in. An interface, so that
// the engine needs no accelerator headers and a build without the backend links.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "slimkv/status.h"

namespace slimkv {

struct EngineConfig;
struct KvPipeline;
class LlamaModel;

// One session's sequence in the device's KV cache; destroying it frees its blocks.
class DeviceSequence {
 public:
  virtual ~DeviceSequence() = default;
  virtual int num_tokens() const = 0;
  // Runs tokens (at most the engine's prefill chunk) at the end of the sequence; writes logits
  // [n, vocab] when all_logits, else [vocab] of the last token. Checked inputs, as Session::prefill.
  virtual Status run(std::span<const int32_t> tokens, bool all_logits, float* logits) = 0;
};

class DeviceModel {
 public:
  virtual ~DeviceModel() = default;
  virtual int context_tokens() const = 0;
  // A new, empty sequence; an error when the cache holds as many as the engine allows.
  virtual Expected<std::unique_ptr<DeviceSequence>> new_sequence() = 0;
  // One decode step of several of its sequences in one pass: sequences[i] takes tokens[i]; logits
  // [sequences, vocab]. Inputs checked by the caller (Session::decode_batch).
  virtual Status decode_batch(std::span<DeviceSequence* const> sequences, std::span<const int32_t> tokens,
                              float* logits) = 0;
};

// The CUDA backend's (defined only in builds with it: the engine asks under SLIMKV_HAVE_CUDA). An
// error names what of the KV pipeline the GPU does not run yet.
Expected<std::unique_ptr<DeviceModel>> load_cuda_model(const LlamaModel& model, const KvPipeline& pipeline,
                                                       const EngineConfig& config);

}  // namespace slimkv
