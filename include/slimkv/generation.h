// The generation loop's rules, once for every tool and the server: which token ends a request (the
// model's and generation_config.json's end-of-sequence ids, stop strings, max_tokens, a full context),
// and what text it has produced so far (streaming detokenization that never splits a UTF-8 character
// and never shows a stop string, even one that arrives across several tokens).
//
// A Generation is one request's state. The caller runs the model (Engine::step, one sequence or many)
// and hands each sampled token to accept(); the Delta it returns is what to show now.
//
//   Generation generation = *Generation::start(engine, request);
//   int32_t token = ...;  // sampled after the prompt
//   while (true) {
//     Generation::Delta delta = generation.accept(token);
//     print(delta.text);
//     if (delta.finish) break;
//     token = ...;  // the next one
//   }
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "slimkv/engine.h"

namespace slimkv {

struct GenerationRequest {
  std::vector<int32_t> prompt;     // token ids (at least one)
  int max_tokens = 16;             // generated tokens at most (the context may end it sooner)
  SamplingParams sampling;
  std::vector<std::string> stop;   // strings that end the text (not included in it)
  bool ignore_eos = false;         // true: end-of-sequence ids do not stop it
  bool skip_special_tokens = true;  // as HF decode: special tokens give no text
};

enum class FinishReason {
  kStop,       // an end-of-sequence token or a stop string
  kLength,     // max_tokens, or the context is full
  kCancelled,  // the caller gave up on it (a client that left)
  kError,      // the engine failed it (the message says why)
};
const char* finish_reason_name(FinishReason reason);  // "stop", "length", "cancelled", "error" (OpenAI's words)

class Generation {
 public:
  // Checks the request against the engine: a prompt of valid ids that leaves room for one token in the
  // context, max_tokens >= 1, the engine has a tokenizer; errors name the field.
  static Expected<Generation> start(const Engine& engine, GenerationRequest request);

  struct Delta {
    std::string text;                   // newly visible text (stop strings and their tails held back)
    std::optional<FinishReason> finish;  // set when this token ended the request
  };
  // Takes the next generated token. After a Delta with `finish`, the request is over.
  Delta accept(int32_t token);
  // Ends the request early (cancellation, an error): the text still held back, if any.
  Delta finish(FinishReason reason);

  const GenerationRequest& request() const { return request_; }
  const std::vector<int32_t>& generated() const { return generated_; }  // the tokens accepted so far
  // The tokens the model has to run for this request: the prompt, then every accepted token but the
  // last (its logits give the next one). A preempted request resumes from it.
  std::vector<int32_t> tokens_to_resume() const;
  bool finished() const { return finish_reason_.has_value(); }
  std::optional<FinishReason> finish_reason() const { return finish_reason_; }

  Generation(Generation&&) noexcept;
  Generation& operator=(Generation&&) noexcept;
  ~Generation();

 private:
  explicit Generation(GenerationRequest request);
  // Text ready to show: everything but a tail that could still become a stop string.
  std::string release_text(bool at_end);

  GenerationRequest request_;
  std::vector<int64_t> eos_ids_;
  int token_budget_ = 0;  // min(max_tokens, context - prompt)
  std::vector<int32_t> generated_;
  struct Decoder;
  std::unique_ptr<Decoder> decoder_;  // the streaming detokenizer
  std::string pending_;  // decoded text not shown yet (it may be the start of a stop string)
  std::optional<FinishReason> finish_reason_;
};

// The generation loop for one request run by itself (tools; the server's scheduler batches many):
// runs the prompt on `sequence` (an empty sequence of the engine, added with the request's sampling)
// in chunks, then one token per step, handing each Delta to on_delta as it comes (the last one carries
// `finish`). on_delta returns false to end the request there (finish kCancelled, delivered too). The
// sequence keeps its KV afterwards: the caller removes it.
Status generate(Engine& engine, SequenceId sequence, Generation& generation,
                const std::function<bool(const Generation::Delta&)>& on_delta);

}  // namespace slimkv
