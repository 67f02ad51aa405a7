// slimkv.Engine: load, generate (prompts batched by the scheduler), stream (one request by the engine's
// generation loop), the tokenizer and the chat template.
#include <condition_variable>
#include <deque>
#include <optional>
#include <thread>
#include <variant>

#include <pybind11/stl.h>

#include "python/binding.h"
#include "slimkv/generation.h"
#include "slimkv/scheduler.h"
#include "slimkv/tokenizer.h"

namespace slimkv::python {
namespace {

// What one request produced (vLLM's RequestOutput, one completion).
struct GenerationOutput {
  std::string prompt;
  std::vector<int32_t> prompt_token_ids;
  std::string text;
  std::vector<int32_t> token_ids;
  std::string finish_reason;  // "stop" or "length" (OpenAI's words)
  std::string error;          // the engine's, when it failed the request (raised, never shown)
};

// Sampling keywords as the CLI takes them: None means generation_config.json's value, else greedy / no
// limit. Bad values are ValueErrors naming the keyword.
struct SamplingKeywords {
  int max_tokens = 16;
  std::optional<float> temperature, top_p;
  std::optional<int> top_k;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool ignore_eos = false;
};

GenerationRequest make_request(const Engine& engine, const std::string& prompt, const SamplingKeywords& keywords) {
  if (keywords.max_tokens < 1) throw py::value_error("max_tokens must be >= 1, got " + std::to_string(keywords.max_tokens));
  if (keywords.temperature && !(*keywords.temperature >= 0)) {
    throw py::value_error("temperature must be >= 0 (0: greedy), got " + std::to_string(*keywords.temperature));
  }
  if (keywords.top_p && !(*keywords.top_p > 0 && *keywords.top_p <= 1)) {
    throw py::value_error("top_p must be in (0, 1], got " + std::to_string(*keywords.top_p));
  }
  if (keywords.top_k && *keywords.top_k < 0) {
    throw py::value_error("top_k must be >= 0 (0: no limit), got " + std::to_string(*keywords.top_k));
  }
  const Tokenizer* tokenizer = engine.tokenizer();
  if (!tokenizer) throw EngineError(engine.config().model_dir + " has no tokenizer.json: generation needs one");
  GenerationRequest request;
  request.prompt = tokenizer->encode(prompt);
  request.max_tokens = keywords.max_tokens;
  const GenerationDefaults& defaults = engine.generation_defaults();
  request.sampling.temperature = keywords.temperature.value_or(defaults.temperature);
  request.sampling.top_p = keywords.top_p.value_or(defaults.top_p);
  request.sampling.top_k = keywords.top_k.value_or(defaults.top_k);
  request.sampling.seed = keywords.seed;
  request.stop = keywords.stop;
  request.ignore_eos = keywords.ignore_eos;
  return request;
}

// Runs one request through slimkv::generate() on a sequence of its own, handing each Delta to on_delta.
// The caller holds the engine's lock and has released the GIL.
Status run_request(Engine& engine, Generation& generation, const std::function<bool(const Generation::Delta&)>& on_delta) {
  SLIMKV_ASSIGN_OR_RETURN(const SequenceId sequence, engine.add_sequence(generation.request().sampling));
  const Status status = generate(engine, sequence, generation, on_delta);
  (void)engine.remove_sequence(sequence);  // it was just added: removing it cannot fail
  return status;
}

// engine.generate(prompts): every prompt through the server's scheduler on this engine (continuous
// batching: the prompts' steps run together, each output as the prompt would give alone), on the
// sequences and KV blocks the engine's open sessions leave free.
std::vector<GenerationOutput> generate_all(EngineHandle& handle, const std::vector<std::string>& prompts,
                                           const SamplingKeywords& keywords) {
  // Errors name the prompt among several as Python indexes it.
  const auto which = [&](size_t i) { return "prompts[" + std::to_string(i) + "]"; };
  std::vector<GenerationRequest> requests;
  for (size_t i = 0; i < prompts.size(); ++i) {
    requests.push_back(make_request(*handle.engine, prompts[i], keywords));
    // Every request checked before any runs (the scheduler checks again as each is submitted).
    const Status checked = Generation::start(*handle.engine, requests.back()).status();
    throw_if_error(prompts.size() > 1 ? checked.with_context(which(i)) : checked);
  }
  std::vector<GenerationOutput> outputs(prompts.size());
  {
    py::gil_scoped_release release;
    std::lock_guard lock(handle.mutex);
    std::unique_ptr<Scheduler> scheduler = value_or_throw(Scheduler::start(*handle.engine));
    for (size_t i = 0; i < requests.size(); ++i) {
      // Updates of one request come in order on the scheduler's thread, and outputs[i] is read only
      // after shutdown() has joined it.
      GenerationOutput& output = outputs[i];
      const Expected<RequestId> submitted = scheduler->submit(requests[i], [&output](const RequestUpdate& update) {
        output.text += update.text;
        output.token_ids.insert(output.token_ids.end(), update.token_ids.begin(), update.token_ids.end());
        if (update.finish) output.finish_reason = finish_reason_name(*update.finish);
        if (!update.error.empty()) output.error = update.error;
      });
      throw_if_error(prompts.size() > 1 ? submitted.status().with_context(which(i)) : submitted.status());
    }
    scheduler->shutdown(ShutdownMode::kFinishAccepted);  // returns when every request has ended
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].error.empty()) throw EngineError(which(i) + ": " + outputs[i].error);
    outputs[i].prompt = prompts[i];
    outputs[i].prompt_token_ids = requests[i].prompt;
  }
  return outputs;
}

// engine.stream(prompt): generate() runs on a thread of its own (holding the engine's lock), handing
// text pieces to a queue; __next__ waits for the next piece with the GIL released. Dropping the iterator
// early cancels the request (on_delta returns false) and waits for the thread.
class TextStream {
 public:
  TextStream(std::shared_ptr<EngineHandle> handle, Generation generation)
      : handle_(std::move(handle)), generation_(std::move(generation)) {
    worker_ = std::thread([this] {
      std::lock_guard engine_lock(handle_->mutex);
      const Status status = run_request(*handle_->engine, generation_, [this](const Generation::Delta& delta) {
        std::lock_guard lock(mutex_);
        if (!delta.text.empty()) pieces_.push_back(delta.text);
        changed_.notify_one();
        return !cancelled_;
      });
      std::lock_guard lock(mutex_);
      status_ = status;
      done_ = true;
      changed_.notify_one();
    });
  }
  ~TextStream() {
    {
      std::lock_guard lock(mutex_);
      cancelled_ = true;
    }
    py::gil_scoped_release release;
    worker_.join();
  }

  std::string next() {
    std::unique_lock lock(mutex_);
    {
      py::gil_scoped_release release;
      changed_.wait(lock, [this] { return !pieces_.empty() || done_; });
    }
    if (!pieces_.empty()) {
      std::string piece = std::move(pieces_.front());
      pieces_.pop_front();
      return piece;
    }
    throw_if_error(status_);
    throw py::stop_iteration();
  }

  std::optional<std::string> finish_reason() {
    std::lock_guard lock(mutex_);
    // None while running, and after an engine error (the error is raised by __next__ instead).
    if (!done_ || !generation_.finish_reason()) return std::nullopt;
    return finish_reason_name(*generation_.finish_reason());
  }

 private:
  std::shared_ptr<EngineHandle> handle_;
  Generation generation_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::string> pieces_;
  bool done_ = false, cancelled_ = false;
  Status status_;
  std::thread worker_;  // last: started once everything it uses exists
};

// engine.tokenizer: the engine's tokenizer (thread-safe, engine.h/tokenizer.h), kept alive by the engine.
struct TokenizerView {
  std::shared_ptr<EngineHandle> handle;
  const Tokenizer& tokenizer() const { return *handle->engine->tokenizer(); }
};

}  // namespace

void bind_engine(py::module_& module) {
  py::class_<GenerationOutput>(module, "GenerationOutput", "What one prompt generated")
      .def_readonly("prompt", &GenerationOutput::prompt)
      .def_readonly("prompt_token_ids", &GenerationOutput::prompt_token_ids)
      .def_readonly("text", &GenerationOutput::text)
      .def_readonly("token_ids", &GenerationOutput::token_ids)
      .def_readonly("finish_reason", &GenerationOutput::finish_reason, "'stop' (end of sequence, a stop string) or 'length'")
      .def("__repr__", [](const GenerationOutput& output) {
        return "GenerationOutput(text=" + std::string(py::repr(py::str(output.text))) + ", " +
               std::to_string(output.token_ids.size()) + " tokens, finish_reason='" + output.finish_reason + "')";
      });

  py::class_<TextStream>(module, "TextStream", "The text pieces of one request, as they come")
      .def("__iter__", [](TextStream& stream) -> TextStream& { return stream; }, py::return_value_policy::reference_internal)
      .def("__next__", &TextStream::next)
      .def_property_readonly("finish_reason", &TextStream::finish_reason, "None until the stream has ended");

  py::class_<TokenizerView>(module, "Tokenizer", "The model's tokenizer.json (exactly HF tokenizers' ids and text)")
      .def("encode", [](const TokenizerView& view, const std::string& text, bool add_special_tokens) {
        return view.tokenizer().encode(text, add_special_tokens);
      }, py::arg("text"), py::arg("add_special_tokens") = true, py::call_guard<py::gil_scoped_release>())
      .def("decode", [](const TokenizerView& view, const std::vector<int32_t>& ids, bool skip_special_tokens) {
        return view.tokenizer().decode(ids, skip_special_tokens);
      }, py::arg("ids"), py::arg("skip_special_tokens") = false, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("vocab_size", [](const TokenizerView& view) { return view.tokenizer().vocab_size(); });

  // stop: one string or several (vLLM's SamplingParams.stop).
  using StopStrings = std::optional<std::variant<std::string, std::vector<std::string>>>;
  auto keywords = [](int max_tokens, std::optional<float> temperature, std::optional<float> top_p,
                     std::optional<int> top_k, uint64_t seed, const StopStrings& stop, bool ignore_eos) {
    SamplingKeywords out{max_tokens, temperature, top_p, top_k, seed, {}, ignore_eos};
    if (stop && std::holds_alternative<std::string>(*stop)) out.stop = {std::get<std::string>(*stop)};
    if (stop && std::holds_alternative<std::vector<std::string>>(*stop)) out.stop = std::get<std::vector<std::string>>(*stop);
    return out;
  };

  py::class_<EngineHandle, std::shared_ptr<EngineHandle>>(module, "Engine",
                                                           "A model loaded with a KV spec (slimkv/engine.h)")
      .def(py::init([](const std::string& model, const std::string& kv, const std::string& device, int threads,
                       int max_sequences) {
             if (threads < 0) throw py::value_error("threads must be >= 0 (0: every core), got " + std::to_string(threads));
             EngineConfig config{.model_dir = model, .kv_spec = kv, .device = device, .threads = threads};
             config.max_sequences = max_sequences;
             auto handle = std::make_shared<EngineHandle>();
             Expected<std::unique_ptr<Engine>> engine = [&] {
               py::gil_scoped_release release;
               return Engine::load(config);
             }();
             handle->engine = value_or_throw(std::move(engine));
             return handle;
           }),
           py::arg("model"), py::arg("kv") = "dense", py::arg("device") = "cpu", py::arg("threads") = 0,
           py::arg("max_sequences") = 16)
      .def("generate",
           [keywords](const std::shared_ptr<EngineHandle>& handle,
                      const std::variant<std::string, std::vector<std::string>>& prompts, int max_tokens,
                      std::optional<float> temperature, std::optional<float> top_p, std::optional<int> top_k,
                      uint64_t seed, const StopStrings& stop, bool ignore_eos) {
             // A str is one prompt; otherwise a sequence of them (vLLM's LLM.generate). A list either way.
             const auto* list = std::get_if<std::vector<std::string>>(&prompts);
             const std::vector<std::string> texts = list ? *list : std::vector<std::string>{std::get<std::string>(prompts)};
             return generate_all(*handle, texts, keywords(max_tokens, temperature, top_p, top_k, seed, stop, ignore_eos));
           },
           py::arg("prompts"), py::kw_only(), py::arg("max_tokens") = 16, py::arg("temperature") = py::none(),
           py::arg("top_p") = py::none(), py::arg("top_k") = py::none(), py::arg("seed") = 0,
           py::arg("stop") = py::none(), py::arg("ignore_eos") = false,
           "Generates a continuation of each prompt (str or list of str), the prompts batched together (each "
           "output equals the prompt's alone); returns a list of GenerationOutput. temperature/top_p/top_k "
           "None: generation_config.json's, else greedy / no limit.")
      .def("stream",
           [keywords](const std::shared_ptr<EngineHandle>& handle, const std::string& prompt, int max_tokens,
                      std::optional<float> temperature, std::optional<float> top_p, std::optional<int> top_k,
                      uint64_t seed, const StopStrings& stop, bool ignore_eos) {
             GenerationRequest request = make_request(
                 *handle->engine, prompt, keywords(max_tokens, temperature, top_p, top_k, seed, stop, ignore_eos));
             return std::make_unique<TextStream>(handle, value_or_throw(Generation::start(*handle->engine, std::move(request))));
           },
           py::arg("prompt"), py::kw_only(), py::arg("max_tokens") = 16, py::arg("temperature") = py::none(),
           py::arg("top_p") = py::none(), py::arg("top_k") = py::none(), py::arg("seed") = 0,
           py::arg("stop") = py::none(), py::arg("ignore_eos") = false,
           "Yields the generated text piece by piece (what generate() would return, joined)")
      .def_property_readonly("tokenizer", [](const std::shared_ptr<EngineHandle>& handle) {
        if (!handle->engine->tokenizer()) throw EngineError(handle->engine->config().model_dir + " has no tokenizer.json");
        return TokenizerView{handle};
      })
      .def("apply_chat_template",
           [](const EngineHandle& handle, const py::list& messages, bool add_generation_prompt, const py::kwargs& extra) {
             const nlohmann::ordered_json json_messages = to_json(messages, "messages");
             const nlohmann::ordered_json json_extra = to_json(extra, "chat template variables");
             return value_or_throw(handle.engine->apply_chat_template(json_messages, add_generation_prompt, json_extra));
           },
           py::arg("messages"), py::arg("add_generation_prompt") = true,
           "The model's chat template rendered over messages [{'role': ..., 'content': ...}, ...]; keyword "
           "arguments become template variables (tools=..., enable_thinking=...)")
      .def_property_readonly("has_chat_template", [](const EngineHandle& handle) { return handle.engine->has_chat_template(); })
      .def_property_readonly("kv_spec", [](const EngineHandle& handle) { return handle.engine->kv_description(); },
                             "the KV spec with every option spelled out, as this device runs it")
      .def_property_readonly("vocab_size", [](const EngineHandle& handle) { return handle.engine->vocab_size(); })
      .def_property_readonly("context_tokens", [](const EngineHandle& handle) { return handle.engine->context_tokens(); })
      .def_property_readonly("device", [](const EngineHandle& handle) { return handle.engine->config().device; });
}

}  // namespace slimkv::python
