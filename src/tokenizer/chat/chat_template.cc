#include "tokenizer/chat/chat_template.h"

#include <ctime>
#include <system_error>

#include "tensor/gguf.h"
#include "tokenizer/chat/lexer.h"
#include "tokenizer/chat/parser.h"
#include "tokenizer/utf8.h"
#include "util/mapped_file.h"
#include "util/json_error.h"

namespace slimkv {
namespace {

constexpr std::string_view kNoChatTemplate = "no chat template: ";
constexpr std::string_view kUnusableTemplate = "chat template not supported: ";

using OrderedJson = nlohmann::ordered_json;

std::string describe_error(const chat::TemplateError& error) {
  return str_cat("line ", error.line, ", column ", error.column, ": ", error.what());
}

// A special token as tokenizer_config.json writes it: "<s>", {"content": "<s>", ...} or null.
Expected<std::optional<std::string>> special_token(const OrderedJson& config, const char* key, const std::string& file) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) return std::optional<std::string>(content->get<std::string>());
  }
  return error(file, ": \"", key, "\": expected a string or an object with a string \"content\", found ", it->dump());
}

// tokenizer_config.json's "chat_template": a string, or named templates of which "default" is used.
Expected<std::optional<std::string>> config_template(const OrderedJson& config, const std::string& file) {
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_array()) {
    std::string names;
    for (const auto& entry : *it) {
      if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") || !entry["name"].is_string() ||
          !entry["template"].is_string()) {
        return error(file, ": \"chat_template\": expected a list of {\"name\": string, \"template\": string}, found ",
                     entry.dump());
      }
      if (entry["name"] == "default") return std::optional<std::string>(entry["template"].get<std::string>());
      names += (names.empty() ? "" : ", ") + entry["name"].get<std::string>();
    }
    return error(file, ": \"chat_template\" lists templates (", names, ") but none named \"default\"");
  }
  return error(file, ": \"chat_template\": expected a string or a list of named templates, found ", it->dump());
}

Expected<OrderedJson> read_json(const std::filesystem::path& path) {
  SLIMKV_ASSIGN_OR_RETURN(const std::string text, read_text_file(path.string()));
  OrderedJson json;
  try {
    json = OrderedJson::parse(text);
  } catch (const OrderedJson::parse_error& e) {
    return Status::error(json_syntax_error(path.string(), text, e.byte, e.what()));
  } catch (const std::exception& e) {  // e.g. out of memory
    return error(path.string(), ": cannot parse JSON: ", e.what());
  }
  if (!json.is_object()) return error(path.string(), ": is a JSON ", json.type_name(), ", expected an object");
  return json;
}

// Whether `json` holds arrays/objects nested more than `limit` deep (recursion stops at the limit).
bool nesting_exceeds(const OrderedJson& json, int limit) {
  if (!json.is_structured()) return false;
  if (limit == 0) return true;
  for (const auto& item : json) {
    if (nesting_exceeds(item, limit - 1)) return true;
  }
  return false;
}

std::tm local_now() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  return local;
}

}  // namespace

Expected<ChatTemplate> ChatTemplate::load_gguf(const std::string& path) {
  SLIMKV_ASSIGN_OR_RETURN(const GgufFile file, GgufFile::open(path));
  if (!file.find("tokenizer.chat_template")) {
    return error(kNoChatTemplate, path, " has no tokenizer.chat_template; chat requests need one (send a prompt to ",
                 "/v1/completions instead)");
  }
  SLIMKV_ASSIGN_OR_RETURN(std::string source, file.get_string("tokenizer.chat_template"));
  // The special tokens' texts, when the file names them.
  const auto token_text = [&](const std::string& key) -> std::optional<std::string> {
    const GgufValue* id = file.find(key);
    const GgufValue* tokens = file.find("tokenizer.ggml.tokens");
    if (!id || !id->is_integer() || !tokens || id->integer < 0 || size_t(id->integer) >= tokens->texts.size()) {
      return std::nullopt;
    }
    return tokens->texts[size_t(id->integer)];
  };
  Expected<ChatTemplate> loaded =
      from_source(std::move(source), token_text("tokenizer.ggml.bos_token_id"), token_text("tokenizer.ggml.eos_token_id"));
  if (!loaded) return error(kUnusableTemplate, path, " (tokenizer.chat_template): ", loaded.status().message());
  return loaded;
}

Expected<ChatTemplate> ChatTemplate::load(const std::filesystem::path& model_dir) {
  if (has_gguf_magic(model_dir.string())) return load_gguf(model_dir.string());
  std::error_code ignored;
  const std::filesystem::path jinja_path = model_dir / "chat_template.jinja";
  const std::filesystem::path config_path = model_dir / "tokenizer_config.json";
  const std::filesystem::path processor_path = model_dir / "chat_template.json";

  OrderedJson config = OrderedJson::object();
  if (std::filesystem::exists(config_path, ignored)) {
    SLIMKV_ASSIGN_OR_RETURN(config, read_json(config_path));
  }
  std::optional<std::string> source;
  std::string origin;
  if (std::filesystem::exists(jinja_path, ignored)) {
    SLIMKV_ASSIGN_OR_RETURN(std::string text, read_text_file(jinja_path.string()));
    source = std::move(text);
    origin = jinja_path.string();
  } else {
    SLIMKV_ASSIGN_OR_RETURN(source, config_template(config, config_path.string()));
    origin = config_path.string();
    if (!source && std::filesystem::exists(processor_path, ignored)) {
      SLIMKV_ASSIGN_OR_RETURN(const OrderedJson processor, read_json(processor_path));
      SLIMKV_ASSIGN_OR_RETURN(source, config_template(processor, processor_path.string()));
      origin = processor_path.string();
    }
  }
  if (!source) {
    return error(kNoChatTemplate, model_dir.string(),
                 " has neither chat_template.jinja nor a \"chat_template\" in tokenizer_config.json; chat requests "
                 "need one (send a prompt to /v1/completions instead, or add the model's template)");
  }
  SLIMKV_ASSIGN_OR_RETURN(std::optional<std::string> bos, special_token(config, "bos_token", config_path.string()));
  SLIMKV_ASSIGN_OR_RETURN(std::optional<std::string> eos, special_token(config, "eos_token", config_path.string()));
  Expected<ChatTemplate> loaded = from_source(std::move(*source), std::move(bos), std::move(eos));
  if (!loaded) return error(kUnusableTemplate, origin, ": ", loaded.status().message());
  for (const char* key : {"unk_token", "pad_token", "sep_token", "cls_token", "mask_token"}) {
    SLIMKV_ASSIGN_OR_RETURN(std::optional<std::string> token, special_token(config, key, config_path.string()));
    if (token) loaded->other_special_tokens_.emplace_back(key, std::move(*token));
  }
  return loaded;
}

Expected<ChatTemplate> ChatTemplate::from_source(std::string source, std::optional<std::string> bos_token,
                                                 std::optional<std::string> eos_token) {
  ChatTemplate chat_template;
  chat_template.source_ = utf8::make_valid_utf8(source);
  try {
    chat_template.program_ =
        std::make_shared<const std::vector<chat::Node>>(chat::parse_template(chat_template.source_));
  } catch (const chat::TemplateError& e) {
    return error("chat template ", describe_error(e));
  }
  chat_template.bos_token_ = std::move(bos_token);
  chat_template.eos_token_ = std::move(eos_token);
  chat_template.clock_ = local_now;
  return chat_template;
}

bool ChatTemplate::is_no_chat_template(const Status& status) {
  return !status.is_ok() && status.message().rfind(kNoChatTemplate, 0) == 0;
}

bool ChatTemplate::is_unsupported_template(const Status& status) {
  return !status.is_ok() && status.message().rfind(kUnusableTemplate, 0) == 0;
}

Expected<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                           const nlohmann::ordered_json& extra) const {
  if (!messages.is_array()) return error("messages: expected an array of {\"role\", \"content\"} objects, found a ", messages.type_name());
  // transformers refuses an empty conversation before rendering.
  if (messages.empty()) return error("messages: Cannot apply chat template to an empty conversation. Provide at least one message.");
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object()) return error("messages[", i, "]: expected an object, found a ", messages[i].type_name());
  }
  if (!extra.is_null() && !extra.is_object()) return error("chat template variables: expected an object, found a ", extra.type_name());
  // Values are converted and compared recursively: bound the nesting a client can send.
  if (nesting_exceeds(messages, chat::Value::kMaxNesting)) {
    return error("messages: nested deeper than ", chat::Value::kMaxNesting, " levels");
  }
  if (nesting_exceeds(extra, chat::Value::kMaxNesting)) {
    return error("chat template variables: nested deeper than ", chat::Value::kMaxNesting, " levels");
  }

  chat::ValueDict variables;
  variables.set("messages", chat::Value::from_json(messages));
  // transformers always passes tools and documents (None when the request has none).
  variables.set("tools", chat::Value::none());
  variables.set("documents", chat::Value::none());
  if (bos_token_) variables.set("bos_token", chat::Value::string(*bos_token_));
  if (eos_token_) variables.set("eos_token", chat::Value::string(*eos_token_));
  for (const auto& [name, token] : other_special_tokens_) variables.set(name, chat::Value::string(token));
  variables.set("add_generation_prompt", chat::Value::boolean(add_generation_prompt));
  if (extra.is_object()) {
    for (const auto& [key, value] : extra.items()) variables.set(key, chat::Value::from_json(value));
  }
  try {
    return chat::render_template(*program_, variables, limits_, clock_ ? clock_ : chat::Clock(local_now));
  } catch (const chat::TemplateError& e) {
    if (e.raised) return error("chat template refused the conversation (line ", e.line, "): ", e.what());
    return error("chat template ", describe_error(e));
  } catch (const std::bad_alloc&) {
    return error("chat template: out of memory while rendering");
  } catch (const std::exception& e) {  // nothing else is expected; still an error, never a crash
    return error("chat template: ", e.what());
  }
}

}  // namespace slimkv
