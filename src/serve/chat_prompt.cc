#include "serve/chat_prompt.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace slimkv {
namespace {

// Where Hugging Face models keep the template: chat_template.jinja, else tokenizer_config.json's
// "chat_template" (a string, or a list of named templates of which "default" is used).
bool has_chat_template(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  if (std::filesystem::exists(dir / "chat_template.jinja")) return true;
  std::ifstream in(dir / "tokenizer_config.json");
  if (!in) return false;
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return config.is_object() && config.contains("chat_template") && !config["chat_template"].is_null();
}

}  // namespace

Expected<std::string> render_chat_prompt(const std::string& model_dir, const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt) {
  (void)messages;
  (void)add_generation_prompt;
  if (!has_chat_template(model_dir)) {
    return error("this model has no chat template (neither ", model_dir, "/chat_template.jinja nor a chat_template in ",
                 model_dir, "/tokenizer_config.json): use /v1/completions with a prompt");
  }
  // The Jinja subset that renders Llama-3.x, Qwen, Mistral and Gemma templates is being written on
  // branch chat-templates; until it is merged a template cannot be rendered, and no stand-in format is
  // guessed (a wrong template silently degrades every answer).
  return error("this build of slimkv cannot render chat templates yet (the Jinja renderer is not merged): "
               "use /v1/completions with the prompt already formatted");
}

}  // namespace slimkv
