#include "slimkv/generation.h"

#include <algorithm>

#include "model/model_config.h"
#include "slimkv/tokenizer.h"

namespace slimkv {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "error";
}

struct Generation::Decoder {
  StreamingDecoder stream;
};

Generation::Generation(GenerationRequest request) : request_(std::move(request)) {}
Generation::Generation(Generation&&) noexcept = default;
Generation& Generation::operator=(Generation&&) noexcept = default;
Generation::~Generation() = default;

Expected<Generation> Generation::start(const Engine& engine, GenerationRequest request) {
  const Tokenizer* tokenizer = engine.tokenizer();
  if (!tokenizer) return error(engine.config().model_dir, " has no tokenizer.json: generation needs one");
  if (request.prompt.empty()) return error("prompt: the prompt has no tokens");
  const int64_t vocab = engine.model_config().vocab_size;
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    if (request.prompt[i] < 0 || request.prompt[i] >= vocab) {
      return error("prompt: token id ", request.prompt[i], " at index ", i, " is outside the vocabulary [0, ", vocab, ")");
    }
  }
  if (int64_t(request.prompt.size()) >= engine.context_tokens()) {
    return error("prompt: ", request.prompt.size(), " tokens; the model's context holds ", engine.context_tokens(),
                 " (prompt plus at least one generated token)");
  }
  if (request.max_tokens < 1) return error("max_tokens must be >= 1, got ", request.max_tokens);
  for (const std::string& stop : request.stop) {
    if (stop.empty()) return error("stop: a stop string is empty");
  }
  Generation generation(std::move(request));
  if (!generation.request_.ignore_eos) {  // generation_config.json's end-of-sequence ids and the model's
    generation.eos_ids_ = engine.generation_defaults().eos_token_ids;
    for (int64_t id : engine.model_config().eos_token_ids) {
      if (std::find(generation.eos_ids_.begin(), generation.eos_ids_.end(), id) == generation.eos_ids_.end()) {
        generation.eos_ids_.push_back(id);
      }
    }
  }
  generation.token_budget_ = int(std::min<int64_t>(generation.request_.max_tokens,
                                                   engine.context_tokens() - int64_t(generation.request_.prompt.size())));
  generation.decoder_ = std::make_unique<Decoder>(Decoder{StreamingDecoder(*tokenizer, generation.request_.skip_special_tokens)});
  return generation;
}

std::vector<int32_t> Generation::tokens_to_resume() const {
  std::vector<int32_t> tokens = request_.prompt;
  if (!generated_.empty()) tokens.insert(tokens.end(), generated_.begin(), generated_.end() - 1);
  return tokens;
}

Generation::Delta Generation::accept(int32_t token) {
  Delta delta;
  if (finish_reason_) return delta;
  generated_.push_back(token);
  if (std::find(eos_ids_.begin(), eos_ids_.end(), int64_t(token)) != eos_ids_.end()) return finish(FinishReason::kStop);
  pending_ += decoder_->stream.push(token);
  for (const std::string& stop : request_.stop) {
    const size_t at = pending_.find(stop);
    if (at == std::string::npos) continue;
    // The earliest stop string wins: cut there; the stop string and what follows are not shown.
    size_t first = at;
    for (const std::string& other : request_.stop) first = std::min(first, pending_.find(other));
    pending_.resize(first);
    delta.text = std::move(pending_);
    pending_.clear();
    finish_reason_ = delta.finish = FinishReason::kStop;
    return delta;
  }
  if (int(generated_.size()) >= token_budget_) return finish(FinishReason::kLength);
  delta.text = release_text(/*at_end=*/false);
  return delta;
}

Generation::Delta Generation::finish(FinishReason reason) {
  Delta delta;
  if (finish_reason_) return delta;
  pending_ += decoder_->stream.finish();
  delta.text = release_text(/*at_end=*/true);
  finish_reason_ = delta.finish = reason;
  return delta;
}

std::string Generation::release_text(bool at_end) {
  // Hold back the longest tail of pending_ that is a proper prefix of some stop string: the next tokens
  // may complete it, and a stop string is never shown.
  size_t hold = 0;
  if (!at_end) {
    for (const std::string& stop : request_.stop) {
      for (size_t n = std::min(stop.size() - 1, pending_.size()); n > hold; --n) {
        if (pending_.compare(pending_.size() - n, n, stop, 0, n) == 0) {
          hold = n;
          break;
        }
      }
    }
  }
  std::string text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return text;
}

Status generate(Engine& engine, SequenceId sequence, Generation& generation,
                const std::function<bool(const Generation::Delta&)>& on_delta) {
  const std::vector<int32_t>& prompt = generation.request().prompt;
  const size_t chunk = size_t(engine.config().prefill_chunk_tokens);
  StepResult result;
  int32_t token = -1;
  for (size_t first = 0; first < prompt.size(); first += chunk) {
    const auto part = std::span(prompt).subspan(first, std::min(chunk, prompt.size() - first));
    const bool last = first + part.size() == prompt.size();
    const StepItem item{sequence, part, last ? StepOutput::kSample : StepOutput::kNone};
    SLIMKV_RETURN_IF_ERROR(engine.step(std::span(&item, 1), result));
    token = result.tokens[0];
  }
  while (true) {
    Generation::Delta delta = generation.accept(token);
    if ((!delta.text.empty() || delta.finish) && !on_delta(delta) && !delta.finish) {
      on_delta(generation.finish(FinishReason::kCancelled));
    }
    if (generation.finished()) return Status::ok();
    const StepItem item{sequence, std::span(&token, 1), StepOutput::kSample};
    SLIMKV_RETURN_IF_ERROR(engine.step(std::span(&item, 1), result));
    token = result.tokens[0];
  }
}

}  // namespace slimkv
