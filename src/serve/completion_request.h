// POST /v1/completions and /v1/chat/completions bodies, parsed and checked field by field into a
// GenerationRequest. Every refusal is an ApiError naming the field (400), or the model (404).
//
// Two stages, because the second needs the prompt's tokens: parse_completion_request checks the JSON
// (types, ranges, features slimkv does not have); finish_completion_request then checks the token
// ids against the vocabulary and the context, and fills in max_tokens and the model's defaults.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "serve/api_error.h"
#include "slimkv/engine.h"
#include "slimkv/generation.h"

namespace slimkv {

struct ChatMessage {
  std::string role;     // system, developer, user, assistant or tool
  std::string content;  // text (a list of text parts is joined)
};

struct CompletionRequest {
  bool chat = false;
  std::string model;                       // "" when not given: the served model
  std::optional<std::string> prompt_text;  // completions: the prompt as text
  std::vector<int32_t> prompt_ids;         // completions: the prompt as token ids
  std::vector<ChatMessage> messages;       // chat
  std::optional<int64_t> max_tokens;       // max_tokens / max_completion_tokens, when given
  std::optional<float> temperature, top_p;  // when given; else the model's generation_config.json
  std::optional<int> top_k;
  GenerationRequest generation;  // seed, stop, ignore_eos, skip_special_tokens; the rest is filled later
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

// Checks the body. `chat` picks the endpoint's fields (messages vs prompt).
std::optional<ApiError> parse_completion_request(std::string_view body, bool chat, CompletionRequest& request);

// What the served model allows.
struct ServedModel {
  std::string name;          // --served-model-name
  int max_model_len = 0;     // prompt + generated tokens at most
  int64_t vocab_size = 0;
  GenerationDefaults defaults;
};

// 404 when `model` names another model.
std::optional<ApiError> check_model_name(const std::string& model, const ServedModel& served);

// Takes the prompt's token ids (given, or encoded from the text or the rendered chat) and completes
// request.generation: ids in the vocabulary, a prompt that leaves room for one token, max_tokens that
// fits the context (default: 16 for completions as OpenAI's, the rest of the context for chat), and the
// model's sampling defaults for what was not given. `field` names the prompt's field in errors.
std::optional<ApiError> finish_completion_request(CompletionRequest& request, std::vector<int32_t> prompt_ids,
                                                  const ServedModel& served, const std::string& field);

}  // namespace slimkv
