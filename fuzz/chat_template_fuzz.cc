// Fuzzes the chat-template interpreter: the input is a template, optionally followed by a NUL byte
// and a JSON array of messages (a fixed conversation with a tool call otherwise). Parsing and
// rendering must end in text or an error, never a crash, hang, leak or undefined behaviour; the
// limits are lowered so a runaway template stops quickly.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "tokenizer/chat/chat_template.h"

namespace {

const char* const kDefaultMessages = R"([
  {"role": "system", "content": "Be brief."},
  {"role": "user", "content": "Weather in Zürich?"},
  {"role": "assistant", "content": "", "reasoning_content": "call the tool",
   "tool_calls": [{"id": "call12345", "type": "function",
                   "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
  {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp_c\": 21.5}"},
  {"role": "user", "content": [{"type": "text", "text": "thanks"}, {"type": "image"}]}
])";

const char* const kExtra = R"({
  "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
  "enable_thinking": false, "date_string": "03 Feb 2025"
})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string source(input.substr(0, split));

  nlohmann::ordered_json messages = nlohmann::ordered_json::parse(kDefaultMessages);
  if (split != std::string_view::npos) {
    nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(input.substr(split + 1), nullptr, false);
    if (!parsed.is_discarded()) messages = std::move(parsed);
  }

  slimkv::Expected<slimkv::ChatTemplate> chat = slimkv::ChatTemplate::from_source(source, "<s>", "</s>");
  if (!chat.has_value()) return 0;
  slimkv::chat::RenderLimits limits;
  limits.max_steps = 200'000;
  limits.max_output_bytes = 1 << 20;
  limits.max_range_items = 10'000;
  chat->set_limits(limits);
  chat->set_clock([] { return std::tm{}; });
  const nlohmann::ordered_json extra = nlohmann::ordered_json::parse(kExtra);
  for (const bool add_generation_prompt : {true, false}) {
    (void)chat->render(messages, add_generation_prompt, extra);
  }
  return 0;
}
