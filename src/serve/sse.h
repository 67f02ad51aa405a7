// Server-sent events as OpenAI streams them: one "data: <json>\n\n" event per chunk, and a final
// "data: [DONE]\n\n".
#pragma once

#include <string>
#include <string_view>

namespace slimkv {

// One event carrying `json` (one line: JSON text has no raw newlines).
std::string sse_event(std::string_view json);
// The event that ends an OpenAI stream.
std::string sse_done();

}  // namespace slimkv
