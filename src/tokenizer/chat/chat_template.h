// A model's chat template: loaded from its folder the way transformers finds it and rendered as
// transformers' tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)
// renders it (Jinja2 with trim_blocks and lstrip_blocks, transformers' tojson, raise_exception and
// strftime_now). This is the one header the server needs:
//
//   SLIMKV_ASSIGN_OR_RETURN(ChatTemplate chat, ChatTemplate::load(model_dir));   // once
//   Expected<std::string> prompt = chat.render(messages, /*add_generation_prompt=*/true, extra);
//
// A folder without a template gives an error that is_no_chat_template() recognises (the server
// answers chat requests with a 400 then). render() errors name the template line and column; a
// conversation the template refuses through raise_exception() gives its own message.
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "slimkv/status.h"
#include "tokenizer/chat/evaluator.h"

namespace slimkv {

class ChatTemplate {
 public:
  // Reads `model_dir`/chat_template.jinja (what transformers 4.4x+ saves), else the
  // "chat_template" of tokenizer_config.json (a string, or a list of {name, template} from which
  // "default" is taken), else chat_template.json's; bos_token/eos_token come from
  // tokenizer_config.json (a string or an AddedToken {"content": ...}) when it has them.
  static Expected<ChatTemplate> load(const std::filesystem::path& model_dir);

  // A template from its text; the special tokens are the template's bos_token/eos_token variables
  // (left undefined when absent, as transformers does for tokens a model does not set).
  static Expected<ChatTemplate> from_source(std::string source, std::optional<std::string> bos_token = std::nullopt,
                                            std::optional<std::string> eos_token = std::nullopt);

  // True for load()'s "this model has no chat template" error.
  static bool is_no_chat_template(const Status& status);

  // Renders `messages` (a JSON array of {role, content, ...}; content a string, null or a list of
  // parts such as {"type": "text", "text": ...}; assistant tool_calls as OpenAI sends them).
  // `extra` (a JSON object) adds template variables: tools, documents, enable_thinking, date_string,
  // ... . ordered_json keeps the keys in the order the client sent them, which tojson prints; a
  // nlohmann::json converts implicitly but its keys are sorted.
  Expected<std::string> render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                               const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  const std::string& source() const { return source_; }
  const std::optional<std::string>& bos_token() const { return bos_token_; }
  const std::optional<std::string>& eos_token() const { return eos_token_; }

  // strftime_now()'s clock (local time by default); tests fix it.
  void set_clock(chat::Clock clock) { clock_ = std::move(clock); }
  void set_limits(const chat::RenderLimits& limits) { limits_ = limits; }

 private:
  ChatTemplate() = default;

  std::string source_;
  std::shared_ptr<const std::vector<chat::Node>> program_;  // shared: a ChatTemplate copies cheaply
  std::optional<std::string> bos_token_;
  std::optional<std::string> eos_token_;
  chat::Clock clock_;
  chat::RenderLimits limits_;
};

}  // namespace slimkv
