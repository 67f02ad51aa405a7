// The one place chat messages become prompt text: the model's own chat template, through
// Engine::apply_chat_template (loaded with the engine; rendered as transformers' apply_chat_template).
#pragma once

#include <string>
#include <vector>

#include "serve/completion_request.h"
#include "slimkv/engine.h"

namespace slimkv {

// The prompt text for `messages`; add_generation_prompt appends the assistant turn's opening. Errors: the
// model has no usable template (pointing at /v1/completions), or the template refuses the messages (e.g.
// roles out of order). Safe from the server's threads while the scheduler drives the engine.
Expected<std::string> render_chat_prompt(const Engine& engine, const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt);

}  // namespace slimkv
