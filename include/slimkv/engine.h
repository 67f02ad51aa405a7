// The engine: a model loaded once (weights memory-mapped, tokenizer if the directory has one, the KV
// pipeline from the spec), and sessions, each a sequence with its own KV store.
//
//   auto engine = Engine::load({.model_dir = "models/x", .kv_spec = "dense"});
//   auto session = (*engine)->new_session();
//   auto logits = session->prefill(prompt_ids);      // logits of the last token
//   logits = session->decode(next_id);               // one more token through the KV cache
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "slimkv/status.h"

namespace slimkv {

class LlamaModel;
class Tokenizer;
class KvStore;
class ThreadPool;
struct KvPipeline;
struct RunState;
struct ModelConfig;
struct KvMemory;
struct ForwardObserver;
class DeviceModel;
class DeviceSequence;

struct EngineConfig {
  std::string model_dir;
  std::string kv_spec = "dense";
  std::string device = "cpu";  // "cpu", or "cuda" (builds with the CUDA backend, a usable GPU)
  int threads = 0;              // 0: every core
  int prefill_chunk_tokens = 512;  // prompts run through the model this many tokens at a time
  // Workers to run on, shared by engines used one at a time (slimkv eval holds one per KV spec);
  // nullptr: the engine starts its own `threads` workers.
  std::shared_ptr<ThreadPool> pool = nullptr;
  // device "cuda": sessions alive at once (each holds a sequence of the GPU's KV cache), and the GPU
  // memory for KV blocks (0: every session's full context, within 90% of what is free).
  int gpu_max_sessions = 16;
  size_t gpu_kv_cache_bytes = 0;
};

// generation_config.json, where present (all optional).
struct GenerationDefaults {
  std::vector<int64_t> eos_token_ids;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
};

class Session;

class Engine {
 public:
  static Expected<std::unique_ptr<Engine>> load(const EngineConfig& config);
  ~Engine();

  const ModelConfig& model_config() const;
  const LlamaModel& model() const { return *model_; }
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }  // nullptr without tokenizer.json
  const GenerationDefaults& generation_defaults() const { return generation_; }
  const EngineConfig& config() const { return config_; }
  std::string kv_description() const;  // the KV spec with every option spelled out
  const KvPipeline& kv_pipeline() const { return *pipeline_; }

  std::unique_ptr<Session> new_session() const;

  // The workers sessions run on, for tools that run kernels beside a session (eval's fidelity task).
  ThreadPool& pool() const { return *pool_; }

 private:
  Engine() = default;
  EngineConfig config_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<KvPipeline> pipeline_;
  std::unique_ptr<DeviceModel> device_model_;  // device "cuda": the model and KV cache on the GPU
  std::shared_ptr<ThreadPool> pool_;  // shared by this engine's sessions: run them one at a time
  friend class Session;
  GenerationDefaults generation_;
};

class Session {
 public:
  explicit Session(const Engine& engine);
  ~Session();

  // Runs tokens through the model at the end of the sequence. Returns logits [n, vocab] when
  // all_logits, else [vocab] of the last token. Errors: empty input, ids outside the vocabulary,
  // or more tokens than the context holds.
  Expected<std::vector<float>> prefill(std::span<const int32_t> tokens, bool all_logits = false);
  Expected<std::vector<float>> decode(int32_t token) { return prefill(std::span<const int32_t>(&token, 1)); }

  // One decode step of several sessions of one engine: sessions[i] takes tokens[i]. On the GPU it is one
  // batched pass through the model (sequences of different lengths together: the basis of continuous
  // batching); on the CPU the sessions run one after another. Returns logits [sessions, vocab]. Every
  // session is checked first (as decode does; distinct sessions of one engine): a refused step runs none.
  static Expected<std::vector<float>> decode_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens);

  int num_tokens() const;
  int context_tokens() const;
  bool on_gpu() const { return kv_ == nullptr; }  // device "cuda"
  const KvStore& kv() const { return *kv_; }  // CPU sessions (!on_gpu()) only

  // Later calls show each layer's buffers to `observer` (model/forward_observer.h); nullptr stops it.
  // The observer must outlive those calls. CPU sessions only: a GPU session's prefill refuses.
  void set_observer(ForwardObserver* observer) { observer_ = observer; }

 private:
  // Checks tokens against the vocabulary and the context (and takes the GPU sequence when there is none).
  Status prepare_run(std::span<const int32_t> tokens);

  const Engine& engine_;
  std::unique_ptr<KvStore> kv_;
  std::unique_ptr<RunState> state_;
  ForwardObserver* observer_ = nullptr;
  // On the GPU: the sequence in the engine's cache, taken at the first prefill (an error there when
  // gpu_max_sessions sessions hold one).
  std::unique_ptr<DeviceSequence> device_sequence_;
};

}  // namespace slimkv
