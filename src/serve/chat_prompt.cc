#include "serve/chat_prompt.h"

namespace slimkv {

ChatPrompt ChatPrompt::load(const std::string& model_dir) {
  ChatPrompt prompt;
  Expected<ChatTemplate> loaded = ChatTemplate::load(model_dir);
  if (loaded) {
    prompt.chat_template_ = loaded.take();
  } else {
    prompt.load_error_ = loaded.status();
  }
  return prompt;
}

Expected<std::string> ChatPrompt::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  if (!chat_template_) {
    if (ChatTemplate::is_no_chat_template(load_error_)) {
      return error("this model has no chat template (", load_error_.message(),
                   "): use /v1/completions with the prompt formatted");
    }
    return error("this model's chat template cannot be used: ", load_error_.message());
  }
  // The messages as checked by parse_completion_request, in the order and shape the template reads.
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& message : messages) list.push_back({{"role", message.role}, {"content", message.content}});
  return chat_template_->render(list, add_generation_prompt);
}

}  // namespace slimkv
