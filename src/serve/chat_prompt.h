// The one place chat messages become prompt text: the model's own chat template (chat_template.jinja,
// or tokenizer_config.json's chat_template), rendered as transformers' apply_chat_template does
// (tokenizer/chat/chat_template.h).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "serve/completion_request.h"
#include "slimkv/status.h"
#include "tokenizer/chat/chat_template.h"

namespace slimkv {

class ChatPrompt {
 public:
  // Never fails: a model without a template, or with one that does not parse, still serves completions;
  // its chat requests are refused with the reason (load_error()).
  static ChatPrompt load(const std::string& model_dir);

  // The prompt text for `messages`; add_generation_prompt appends the assistant turn's opening.
  // Errors: no usable template, or the template refuses the messages (e.g. roles out of order).
  Expected<std::string> render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  bool has_template() const { return chat_template_.has_value(); }
  const Status& load_error() const { return load_error_; }

 private:
  std::optional<ChatTemplate> chat_template_;
  Status load_error_;
};

}  // namespace slimkv
