#include "serve/openai_response.h"

#include <chrono>
#include <random>

#include <nlohmann/json.hpp>

namespace slimkv {
namespace {

using nlohmann::json;

json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

json finish_json(std::optional<FinishReason> finish) {
  return finish ? json(finish_reason_name(*finish)) : json(nullptr);
}

json envelope(const ResponseHeader& header, const char* object) {
  return {{"id", header.id}, {"object", object}, {"created", header.created}, {"model", header.model}};
}

}  // namespace

std::string random_hex(size_t digits) {
  static thread_local std::mt19937_64 generator{std::random_device()()};
  std::string out;
  for (size_t i = 0; i < digits; ++i) out += "0123456789abcdef"[generator() % 16];
  return out;
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

ResponseHeader new_response_header(bool chat, std::string model) {
  return ResponseHeader{.chat = chat, .id = (chat ? "chatcmpl-" : "cmpl-") + random_hex(24), .created = unix_seconds(),
                        .model = std::move(model)};
}

std::string completion_json(const ResponseHeader& header, const std::string& text, FinishReason finish, const Usage& usage) {
  json response = envelope(header, header.chat ? "chat.completion" : "text_completion");
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_json(finish)}};
  if (header.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  response["choices"] = json::array({choice});
  response["usage"] = usage_json(usage);
  return response.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string chunk_json(const ResponseHeader& header, const std::string& text, std::optional<FinishReason> finish,
                       bool first, bool with_usage, const std::vector<int32_t>* token_ids) {
  json chunk = envelope(header, header.chat ? "chat.completion.chunk" : "text_completion");
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_json(finish)}};
  if (header.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  if (token_ids) choice["token_ids"] = *token_ids;
  chunk["choices"] = json::array({choice});
  if (with_usage) chunk["usage"] = nullptr;
  return chunk.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string usage_chunk_json(const ResponseHeader& header, const Usage& usage) {
  json chunk = envelope(header, header.chat ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = json::array();
  chunk["usage"] = usage_json(usage);
  return chunk.dump();
}

}  // namespace slimkv
