// The JSON slimkv answers with, in OpenAI's shapes: a whole completion / chat completion, and the chunks
// of a streamed one (text_completion / chat.completion.chunk), with usage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "slimkv/generation.h"

namespace slimkv {

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

// Identifies one response: every chunk of a stream carries the same id, created and model.
struct ResponseHeader {
  bool chat = false;
  std::string id;       // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// A fresh header: id "cmpl-" or "chatcmpl-" and 24 random hex digits, created now.
ResponseHeader new_response_header(bool chat, std::string model);
// `digits` random hex digits (ids of responses and of the router's requests).
std::string random_hex(size_t digits);
int64_t unix_seconds();

// A whole (non-streamed) response. finish_reason is "stop" or "length".
std::string completion_json(const ResponseHeader& header, const std::string& text, FinishReason finish, const Usage& usage);

// One chunk of a stream: `text` is the delta; `finish` set in the last one. Chat's first chunk
// (`first`) carries the assistant role. `with_usage`: the chunk has "usage": null, as OpenAI sends when
// stream_options.include_usage is on. `token_ids`, when given, go in the choice as "token_ids": the
// tokens whose text the chunk carries (a kv_transfer request's chunks: a router resumes from them).
std::string chunk_json(const ResponseHeader& header, const std::string& text, std::optional<FinishReason> finish,
                       bool first, bool with_usage, const std::vector<int32_t>* token_ids = nullptr);
// The chunk after the last choice when include_usage is on: no choices, the usage.
std::string usage_chunk_json(const ResponseHeader& header, const Usage& usage);

}  // namespace slimkv
