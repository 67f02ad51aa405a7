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
//
// The Jinja2 subset (src/tokenizer/chat/: lexer, parser, value, builtins, evaluator), enough for the
// templates under tests/data/chat_templates/ (Llama 3.x, Qwen 2.5/3/QwQ, Mistral, Gemma 2/3, Phi,
// DeepSeek, Hermes, Command-R, granite, functionary, gpt-oss, Kimi-K2, ...):
//   statements  if/elif/else, for (tuple targets, `if` filter, else, loop.index/index0/revindex/
//               revindex0/first/last/length/previtem/nextitem/depth), set (incl. ns.attr and
//               {% set %}...{% endset %}), macro (defaults, keyword args, recursion), filter blocks,
//               break/continue, raw, generation; {%- -%} {{- -}} {#- -#} and {%+; comments
//   expressions literals (str escapes, int, float, true/True/none/None, lists, dicts, tuples), ~,
//               + - * / // % **, comparisons, in / not in, and/or/not, `a if c else b`, is [not]
//               tests, .attr / [key] / [a:b:c] slices, calls with keyword arguments
//   filters     abs capitalize count default(d) dictsort e/escape first float indent int items join
//               last length list lower map reject rejectattr replace reverse safe select selectattr
//               string title tojson trim unique upper
//   tests       boolean callable defined divisibleby eq/equalto/== even false float ge gt in integer
//               iterable le lower lt mapping ne none number odd sameas sequence string true
//               undefined upper
//   methods     str: strip lstrip rstrip split upper lower title capitalize startswith endswith
//               replace find count join isdigit isalpha isspace; dict: items keys values get
//   globals     raise_exception strftime_now namespace range dict
// Python semantics where templates see them: None/True/False print as Python does, lists and dicts
// print as repr(), select/map give generators (always true, no length), |safe gives Markup.
// Not supported (an error names them): include/import/extends/block, call blocks, recursive loops,
// loop.cycle, non-string dict keys, list.append and other mutating methods (transformers' sandbox
// forbids them too).
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "slimkv/status.h"
#include "tokenizer/chat/evaluator.h"

namespace slimkv {

class ChatTemplate {
 public:
  // Reads `model_dir`/chat_template.jinja (what transformers 4.4x+ saves), else the
  // "chat_template" of tokenizer_config.json (a string, or a list of {name, template} from which
  // "default" is taken), else chat_template.json's; bos_token/eos_token (and unk/pad/sep/cls/mask,
  // all of which transformers hands the template) come from tokenizer_config.json, each a string or
  // an AddedToken {"content": ...}, when it has them.
  // A GGUF file instead of a directory: its tokenizer.chat_template, with the texts of
  // tokenizer.ggml.bos/eos_token_id as bos_token/eos_token.
  static Expected<ChatTemplate> load(const std::filesystem::path& model_dir);

  // A template from its text; the special tokens are the template's bos_token/eos_token variables
  // (left undefined when absent, as transformers does for tokens a model does not set).
  static Expected<ChatTemplate> from_source(std::string source, std::optional<std::string> bos_token = std::nullopt,
                                            std::optional<std::string> eos_token = std::nullopt);

  // True for load()'s "this model has no chat template" error.
  static bool is_no_chat_template(const Status& status);
  // True for load()'s error of a template this renderer cannot compile (a construct outside its subset),
  // as opposed to unreadable or malformed files: a model can still run without its chat.
  static bool is_unsupported_template(const Status& status);

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
  static Expected<ChatTemplate> load_gguf(const std::string& path);
  ChatTemplate() = default;

  std::string source_;
  std::shared_ptr<const std::vector<chat::Node>> program_;  // shared: a ChatTemplate copies cheaply
  std::optional<std::string> bos_token_;
  std::optional<std::string> eos_token_;
  std::vector<std::pair<std::string, std::string>> other_special_tokens_;  // ("pad_token", "<pad>"), ...
  chat::Clock clock_;
  chat::RenderLimits limits_;
};

}  // namespace slimkv
