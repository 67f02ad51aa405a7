// The one place chat messages become prompt text: the model's own chat template (chat_template.jinja,
// or tokenizer_config.json's chat_template), rendered as transformers' apply_chat_template does.
#pragma once

#include <string>
#include <vector>

#include "serve/completion_request.h"
#include "slimkv/status.h"

namespace slimkv {

// Renders `messages` with the template of the model in `model_dir`; add_generation_prompt appends the
// assistant turn's opening. Errors: the model has no chat template (the message says where it looked),
// or the template refuses the messages (e.g. roles out of order).
Expected<std::string> render_chat_prompt(const std::string& model_dir, const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt);

}  // namespace slimkv
