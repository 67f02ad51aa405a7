#include <algorithm>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "engine/device_model.h"
#include "kv/kv_factory.h"
#include "model/llama.h"
#include "slimkv/engine.h"
#include "tokenizer/tokenizer.h"
#include "util/mapped_file.h"
#include "util/thread_pool.h"

namespace slimkv {
namespace {

// generation_config.json is optional; when present it must be valid, and its sampling defaults apply.
Expected<GenerationDefaults> load_generation_defaults(const std::string& model_dir, const ModelConfig& config) {
  GenerationDefaults defaults;
  defaults.eos_token_ids = config.eos_token_ids;
  const std::string path = model_dir + "/generation_config.json";
  if (!std::filesystem::exists(path)) return defaults;
  SLIMKV_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return error(path, ": not a JSON object");
  if (json.contains("eos_token_id")) {
    const auto& eos = json["eos_token_id"];
    if (eos.is_number_integer()) {
      defaults.eos_token_ids = {eos.get<int64_t>()};
    } else if (eos.is_array()) {
      defaults.eos_token_ids.clear();
      for (const auto& id : eos) {
        if (!id.is_number_integer()) return error(path, ": eos_token_id must hold integers, found ", id.dump());
        defaults.eos_token_ids.push_back(id.get<int64_t>());
      }
    } else if (!eos.is_null()) {
      return error(path, ": eos_token_id must be an integer or a list, found ", eos.dump());
    }
  }
  const bool sample = json.value("do_sample", false);
  if (sample) {
    const auto number = [&](const char* key, double fallback) {
      return json.contains(key) && json[key].is_number() ? json[key].get<double>() : fallback;
    };
    defaults.temperature = float(number("temperature", 1.0));
    defaults.top_k = int(number("top_k", 50));
    defaults.top_p = float(number("top_p", 1.0));
  }
  return defaults;
}

}  // namespace

Expected<std::unique_ptr<Engine>> Engine::load(const EngineConfig& config) {
  if (config.device != "cpu" && config.device != "cuda") {
    return error("device '", config.device, "' is not known (expected cpu or cuda)");
  }
  if (config.gpu_max_sessions < 1) return error("gpu_max_sessions must be >= 1, got ", config.gpu_max_sessions);
  if (config.threads < 0) return error("threads must be >= 0 (0 = every core), got ", config.threads);
  if (config.prefill_chunk_tokens < 1) return error("prefill chunk must be >= 1 token");
  std::unique_ptr<Engine> engine(new Engine());
  engine->config_ = config;
  const int threads = config.threads > 0 ? config.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  SLIMKV_ASSIGN_OR_RETURN(KvPipeline pipeline, make_kv_pipeline(config.kv_spec));  // bad specs fail before loading
  engine->pipeline_ = std::make_unique<KvPipeline>(std::move(pipeline));
  if (engine->pipeline_->kvpr && config.device != "cuda") {
    return error("KV spec '", config.kv_spec, "': the kvpr tier runs on device 'cuda' only (it recomputes K/V on ",
                 "the GPU while the rest crosses from host memory)");
  }
  SLIMKV_ASSIGN_OR_RETURN(engine->model_, LlamaModel::load(config.model_dir));
  const std::string kv_context = str_cat("KV spec '", config.kv_spec, "' for ", config.model_dir);
  if (std::optional<ZackOptions>& zack = engine->pipeline_->zack) {
    if (zack->calibration_path.empty()) zack->calibration_path = config.model_dir + "/zack.safetensors";
    SLIMKV_RETURN_IF_ERROR(engine->model_->enable_zack(*zack).with_context(kv_context));
  }
  const KvShape kv_shape = engine->model_->kv_shape();
  for (int l = 0; l < kv_shape.num_layers; ++l) {
    for (int g = 0; g < kv_shape.num_kv_heads; ++g) {
      const BlockShape block{engine->pipeline_->block_tokens, kv_shape.k_dim_of(l, g), kv_shape.v_dim_of(l, g)};
      const std::string where = kv_shape.heads_differ()
                                    ? str_cat(kv_context, ", layer ", l, " KV head ", g, " (ZACK ranks: round them with align=4 or 16)")
                                    : kv_context;
      SLIMKV_RETURN_IF_ERROR(engine->pipeline_->codec->check_shape(block).with_context(where));
    }
  }
  if (engine->pipeline_->selector) {
    SLIMKV_RETURN_IF_ERROR(engine->pipeline_->selector->check_shape(kv_shape.k_dim).with_context(kv_context));
  }
  const std::string tokenizer_path = config.model_dir + "/tokenizer.json";
  if (std::filesystem::exists(tokenizer_path)) {
    SLIMKV_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::load(tokenizer_path));
    engine->tokenizer_ = std::make_unique<Tokenizer>(std::move(tokenizer));
  }
  SLIMKV_ASSIGN_OR_RETURN(engine->generation_, load_generation_defaults(config.model_dir, engine->model_->config()));
  engine->pool_ = config.pool ? config.pool : std::make_shared<ThreadPool>(threads);
  if (config.device == "cuda") {
#ifdef SLIMKV_HAVE_CUDA
    SLIMKV_ASSIGN_OR_RETURN(engine->device_model_, load_cuda_model(*engine->model_, *engine->pipeline_, config));
#else
    return error("device 'cuda': this build has no CUDA backend (nvcc was not found when it was configured; ",
                 "install the CUDA toolkit and rebuild, or configure with -DSLIMKV_CUDA=ON to insist)");
#endif
  }
  return engine;
}

Engine::~Engine() = default;

const ModelConfig& Engine::model_config() const { return model_->config(); }

std::string Engine::kv_description() const { return pipeline_->describe(); }

std::unique_ptr<Session> Engine::new_session() const { return std::make_unique<Session>(*this); }

// ----------------------------------------------------------------------------------------------

Session::Session(const Engine& engine) : engine_(engine) {
  if (!engine.device_model_) {
    kv_ = std::make_unique<KvStore>(engine.model().kv_shape(), engine.kv_pipeline());
    state_ = std::make_unique<RunState>();
  }
}

Session::~Session() = default;

int Session::num_tokens() const {
  if (kv_) return kv_->num_tokens(0);
  return device_sequence_ ? device_sequence_->num_tokens() : 0;
}

int Session::context_tokens() const {
  return kv_ ? kv_->shape().max_tokens : engine_.device_model_->context_tokens();
}

Status Session::prepare_run(std::span<const int32_t> tokens) {
  const ModelConfig& config = engine_.model_config();
  if (tokens.empty()) return error("no tokens to run: the prompt is empty");
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config.vocab_size) {
      return error("token id ", tokens[i], " at index ", i, " is outside the vocabulary [0, ", config.vocab_size, ")");
    }
  }
  if (num_tokens() + int64_t(tokens.size()) > context_tokens()) {
    return error("sequence would have ", num_tokens() + int64_t(tokens.size()), " tokens (", num_tokens(),
                 " already + ", tokens.size(), " new), more than the model's context of ", context_tokens(),
                 " tokens (max_position_embeddings)");
  }
  if (on_gpu() && observer_ != nullptr) {
    return error("observing the forward pass (fidelity, calibration) runs on device 'cpu' only");
  }
  if (on_gpu() && !device_sequence_) {
    SLIMKV_ASSIGN_OR_RETURN(device_sequence_, engine_.device_model_->new_sequence());
  }
  return Status::ok();
}

Expected<std::vector<float>> Session::prefill(std::span<const int32_t> tokens, bool all_logits) {
  SLIMKV_RETURN_IF_ERROR(prepare_run(tokens));
  const ModelConfig& config = engine_.model_config();
  const size_t vocab = size_t(config.vocab_size);
  std::vector<float> logits(all_logits ? tokens.size() * vocab : vocab);
  const size_t chunk = size_t(engine_.config().prefill_chunk_tokens);
  for (size_t first = 0; first < tokens.size(); first += chunk) {
    const auto part = tokens.subspan(first, std::min(chunk, tokens.size() - first));
    const bool last_part = first + part.size() == tokens.size();
    // The last token's logits of a chunk before the last are not wanted, but are written somewhere.
    thread_local std::vector<float> discarded;
    discarded.resize(vocab);
    float* out = all_logits ? logits.data() + first * vocab : last_part ? logits.data() : discarded.data();
    if (device_sequence_) {
      SLIMKV_RETURN_IF_ERROR(device_sequence_->run(part, all_logits, out));
    } else {
      engine_.model().forward(part, *kv_, all_logits, out, *state_, *engine_.pool_, observer_);
    }
  }
  return logits;
}

Expected<std::vector<float>> Session::decode_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens) {
  if (sessions.empty() || sessions.size() != tokens.size()) {
    return error("a batched decode step of ", sessions.size(), " sessions and ", tokens.size(), " tokens");
  }
  const Engine& engine = sessions[0]->engine_;
  for (size_t i = 0; i < sessions.size(); ++i) {
    if (&sessions[i]->engine_ != &engine) return error("a batched decode step takes sessions of one engine");
    if (std::count(sessions.begin(), sessions.end(), sessions[i]) > 1) {
      return error("session ", i, " is twice in one batched decode step");
    }
  }
  for (size_t i = 0; i < sessions.size(); ++i) {
    SLIMKV_RETURN_IF_ERROR(sessions[i]->prepare_run(tokens.subspan(i, 1)).with_context(str_cat("session ", i)));
  }
  const size_t vocab = size_t(engine.model_config().vocab_size);
  std::vector<float> logits(sessions.size() * vocab);
  if (!engine.device_model_) {
    // The CPU runs them one after another (each decode is already spread over the threads).
    for (size_t i = 0; i < sessions.size(); ++i) {
      SLIMKV_ASSIGN_OR_RETURN(std::vector<float> row, sessions[i]->decode(tokens[i]));
      std::copy(row.begin(), row.end(), logits.begin() + ptrdiff_t(i * vocab));
    }
    return logits;
  }
  std::vector<DeviceSequence*> sequences;
  for (Session* session : sessions) sequences.push_back(session->device_sequence_.get());
  SLIMKV_RETURN_IF_ERROR(engine.device_model_->decode_batch(sequences, tokens, logits.data()));
  return logits;
}

}  // namespace slimkv
