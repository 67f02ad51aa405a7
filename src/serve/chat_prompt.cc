#include "serve/chat_prompt.h"

namespace slimkv {

Expected<std::string> render_chat_prompt(const Engine& engine, const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt) {
  // The messages as parse_completion_request checked them, in the order and shape the template reads.
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& message : messages) list.push_back({{"role", message.role}, {"content", message.content}});
  Expected<std::string> text = engine.apply_chat_template(list, add_generation_prompt);
  if (!text && !engine.has_chat_template()) {
    return error(text.status().message(), ": use /v1/completions with the prompt formatted");
  }
  return text;
}

}  // namespace slimkv
