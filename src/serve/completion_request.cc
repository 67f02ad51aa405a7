#include "serve/completion_request.h"

#include <limits>
#include <random>

#include <nlohmann/json.hpp>

namespace slimkv {
namespace {

using nlohmann::json;

// Reads an object's optional fields, each checked for its type and range; remembers the first error.
class FieldReader {
 public:
  explicit FieldReader(const json& object) : object_(object) {}
  std::optional<ApiError> error;

  // Present and not null (OpenAI clients send null for "not set").
  bool has(const char* key) const { return object_.contains(key) && !object_.at(key).is_null(); }
  const json& at(const char* key) const { return object_.at(key); }

  std::optional<int64_t> integer(const char* key, int64_t min, int64_t max) {
    if (!has(key)) return std::nullopt;
    const json& value = object_.at(key);
    if (!value.is_number_integer()) return fail(key, "must be an integer");
    if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
      return fail(key, "is too large");
    }
    const int64_t n = value.get<int64_t>();
    if (n < min || n > max) return fail(key, "must be between " + std::to_string(min) + " and " + std::to_string(max) + ", got " + std::to_string(n));
    return n;
  }
  std::optional<double> number(const char* key, double min, double max) {
    if (!has(key)) return std::nullopt;
    const json& value = object_.at(key);
    if (!value.is_number()) return fail(key, "must be a number");
    const double x = value.get<double>();
    if (!(x >= min && x <= max)) return fail(key, "must be between " + json(min).dump() + " and " + json(max).dump() + ", got " + value.dump());
    return x;
  }
  std::optional<bool> boolean(const char* key) {
    if (!has(key)) return std::nullopt;
    if (!object_.at(key).is_boolean()) return fail(key, "must be true or false");
    return object_.at(key).get<bool>();
  }
  // Refuses a feature slimkv does not have unless the field holds its "off" value.
  void unsupported_unless(const char* key, const json& off_value, const std::string& what) {
    if (has(key) && object_.at(key) != off_value) fail(key, what + " is not supported by slimkv serve");
  }

  std::nullopt_t fail(const std::string& key, const std::string& message) {
    if (!error) error = ApiError::bad_field(key, key + ": " + message);
    return std::nullopt;
  }

 private:
  const json& object_;
};

// OpenAI's "content": a string, or a list of {"type": "text", "text": ...} parts.
std::optional<std::string> message_content(const json& content, const std::string& field, FieldReader& fields) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return fields.fail(field, "must be a string or a list of text parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string where = field + "[" + std::to_string(i) + "]";
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") || !part["text"].is_string()) {
      return fields.fail(where, "must be {\"type\": \"text\", \"text\": string} (slimkv serves text only)");
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

void parse_messages(FieldReader& fields, CompletionRequest& request) {
  if (!fields.has("messages")) {
    fields.fail("messages", "is required: a list of {\"role\", \"content\"}");
    return;
  }
  const json& messages = fields.at("messages");
  if (!messages.is_array() || messages.empty()) {
    fields.fail("messages", "must be a non-empty list of {\"role\", \"content\"}");
    return;
  }
  for (size_t i = 0; i < messages.size() && !fields.error; ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const json& message = messages[i];
    if (!message.is_object()) {
      fields.fail(where, "must be an object {\"role\", \"content\"}");
      return;
    }
    const json role = message.value("role", json());
    if (!role.is_string() || (role != "system" && role != "developer" && role != "user" && role != "assistant" && role != "tool")) {
      fields.fail(where + ".role", "must be one of system, developer, user, assistant, tool");
      return;
    }
    if (message.contains("tool_calls") && !message["tool_calls"].is_null()) {
      fields.fail(where + ".tool_calls", "tool calls are not supported by slimkv serve");
      return;
    }
    if (!message.contains("content") || message["content"].is_null()) {
      fields.fail(where + ".content", "is required");
      return;
    }
    std::optional<std::string> content = message_content(message["content"], where + ".content", fields);
    if (!content) return;
    request.messages.push_back({role.get<std::string>(), std::move(*content)});
  }
}

bool all_integers(const json& array) {
  for (const json& x : array) {
    if (!x.is_number_integer()) return false;
  }
  return true;
}

void parse_prompt(FieldReader& fields, CompletionRequest& request) {
  if (!fields.has("prompt")) {
    fields.fail("prompt", "is required: a string or a list of token ids");
    return;
  }
  json prompt = fields.at("prompt");
  // OpenAI also takes a batch: a list of strings or of id lists. slimkv takes one prompt per request.
  if (prompt.is_array() && !prompt.empty() && (prompt[0].is_string() || prompt[0].is_array())) {
    if (prompt.size() != 1) {
      fields.fail("prompt", "holds " + std::to_string(prompt.size()) + " prompts; slimkv serve takes one per request");
      return;
    }
    prompt = json(prompt[0]);
  }
  if (prompt.is_string()) {
    if (prompt.get<std::string>().empty()) fields.fail("prompt", "is empty");
    request.prompt_text = prompt.get<std::string>();
  } else if (prompt.is_array() && all_integers(prompt)) {
    if (prompt.empty()) fields.fail("prompt", "is an empty list of token ids");
    for (const json& id : prompt) {
      if (id.is_number_unsigned() ? id.get<uint64_t>() > uint64_t(std::numeric_limits<int32_t>::max())
                                  : (id.get<int64_t>() < 0 || id.get<int64_t>() > std::numeric_limits<int32_t>::max())) {
        fields.fail("prompt", "token id " + id.dump() + " is outside the vocabulary");
        return;
      }
      request.prompt_ids.push_back(id.get<int32_t>());
    }
  } else {
    fields.fail("prompt", "must be a string or a list of token ids");
  }
}

void parse_stop(FieldReader& fields, CompletionRequest& request) {
  if (!fields.has("stop")) return;
  const json& stop = fields.at("stop");
  const json list = stop.is_string() ? json::array({stop}) : stop;
  if (!list.is_array() || list.size() > 16) {
    fields.fail("stop", "must be a string or a list of at most 16 strings");
    return;
  }
  for (const json& s : list) {
    if (!s.is_string() || s.get<std::string>().empty()) {
      fields.fail("stop", "must hold non-empty strings");
      return;
    }
    request.generation.stop.push_back(s.get<std::string>());
  }
}

}  // namespace

std::optional<ApiError> parse_completion_request(std::string_view body, bool chat, CompletionRequest& request) {
  json object;
  try {
    object = json::parse(body);
  } catch (const json::parse_error& e) {
    return ApiError::bad_field("", std::string("the body is not valid JSON: ") + e.what());
  }
  if (!object.is_object()) return ApiError::bad_field("", "the body must be a JSON object");
  request = {};
  request.chat = chat;
  FieldReader fields(object);

  if (fields.has("model")) {
    if (!object["model"].is_string()) return ApiError::bad_field("model", "model: must be a string");
    request.model = object["model"].get<std::string>();
  }
  if (chat) {
    parse_messages(fields, request);
  } else {
    parse_prompt(fields, request);
  }

  const auto max_tokens = fields.integer("max_tokens", 1, std::numeric_limits<int32_t>::max());
  const auto max_completion_tokens =
      chat ? fields.integer("max_completion_tokens", 1, std::numeric_limits<int32_t>::max()) : std::nullopt;
  request.max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;
  if (const auto t = fields.number("temperature", 0.0, 2.0)) request.temperature = float(*t);
  if (const auto p = fields.number("top_p", 0.0, 1.0)) {
    if (*p == 0.0) fields.fail("top_p", "must be greater than 0");
    request.top_p = float(*p);
  }
  if (const auto k = fields.integer("top_k", -1, std::numeric_limits<int32_t>::max())) request.top_k = int(*k < 0 ? 0 : *k);
  // Without a seed each request draws its own (OpenAI's behaviour); with one, the same tokens every time.
  if (const auto seed = fields.integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
    request.generation.sampling.seed = uint64_t(*seed);
  } else {
    request.generation.sampling.seed = std::random_device()() | uint64_t(std::random_device()()) << 32;
  }
  parse_stop(fields, request);
  if (const auto ignore_eos = fields.boolean("ignore_eos")) request.generation.ignore_eos = *ignore_eos;
  if (const auto skip = fields.boolean("skip_special_tokens")) request.generation.skip_special_tokens = *skip;
  if (const auto n = fields.integer("n", 1, std::numeric_limits<int32_t>::max()); n && *n != 1) {
    fields.fail("n", "only n=1 is supported (one choice per request)");
  }
  if (const auto stream = fields.boolean("stream")) request.stream = *stream;
  if (fields.has("stream_options")) {
    const json& options = object["stream_options"];
    if (!request.stream) {
      fields.fail("stream_options", "is only allowed when stream is true");
    } else if (!options.is_object()) {
      fields.fail("stream_options", "must be an object {\"include_usage\": bool}");
    } else if (options.contains("include_usage") && !options["include_usage"].is_boolean()) {
      fields.fail("stream_options.include_usage", "must be true or false");
    } else {
      request.include_usage = options.value("include_usage", false);
    }
  }

  // What OpenAI has and slimkv does not: refused unless off, never silently ignored.
  fields.unsupported_unless("best_of", 1, "best_of other than 1");
  fields.unsupported_unless("echo", false, "echo");
  fields.unsupported_unless("suffix", "", "suffix");
  fields.unsupported_unless("logprobs", chat ? json(false) : json(0), "logprobs");
  fields.unsupported_unless("top_logprobs", 0, "top_logprobs");
  fields.unsupported_unless("presence_penalty", 0, "presence_penalty");
  fields.unsupported_unless("frequency_penalty", 0, "frequency_penalty");
  fields.unsupported_unless("repetition_penalty", 1, "repetition_penalty");
  fields.unsupported_unless("logit_bias", json::object(), "logit_bias");
  fields.unsupported_unless("tools", json::array(), "tools");
  fields.unsupported_unless("functions", json::array(), "functions");
  fields.unsupported_unless("response_format", json{{"type", "text"}}, "response_format other than text");
  if (fields.error) return fields.error;
  return std::nullopt;
}

std::optional<ApiError> check_model_name(const std::string& model, const ServedModel& served) {
  if (!model.empty() && model != served.name) return ApiError::unknown_model(model, served.name);
  return std::nullopt;
}

std::optional<ApiError> finish_completion_request(CompletionRequest& request, std::vector<int32_t> prompt_ids,
                                                  const ServedModel& served, const std::string& field) {
  if (prompt_ids.empty()) return ApiError::bad_field(field, field + ": encodes to no tokens");
  for (size_t i = 0; i < prompt_ids.size(); ++i) {
    if (prompt_ids[i] < 0 || prompt_ids[i] >= served.vocab_size) {
      return ApiError::bad_field(field, field + ": token id " + std::to_string(prompt_ids[i]) + " at index " + std::to_string(i) +
                                            " is outside the vocabulary [0, " + std::to_string(served.vocab_size) + ")");
    }
  }
  const int64_t prompt_tokens = int64_t(prompt_ids.size());
  if (prompt_tokens >= served.max_model_len) {
    return ApiError::bad_field(field, field + ": the prompt has " + std::to_string(prompt_tokens) +
                                          " tokens; this model's context holds " + std::to_string(served.max_model_len) +
                                          " (the prompt and at least one generated token)");
  }
  const int64_t room = served.max_model_len - prompt_tokens;
  const std::string max_field = request.chat ? "max_completion_tokens" : "max_tokens";
  if (request.max_tokens && *request.max_tokens > room) {
    return ApiError::bad_field(max_field, max_field + ": " + std::to_string(*request.max_tokens) + " tokens after a prompt of " +
                                              std::to_string(prompt_tokens) + " exceed this model's context of " +
                                              std::to_string(served.max_model_len) + " tokens (at most " +
                                              std::to_string(room) + ")");
  }
  request.generation.prompt = std::move(prompt_ids);
  request.generation.max_tokens = int(request.max_tokens.value_or(request.chat ? room : std::min<int64_t>(16, room)));
  SamplingParams& sampling = request.generation.sampling;
  sampling.temperature = request.temperature.value_or(served.defaults.temperature);
  sampling.top_p = request.top_p.value_or(served.defaults.top_p);
  sampling.top_k = request.top_k.value_or(served.defaults.top_k);
  return std::nullopt;
}

}  // namespace slimkv
