#include "tokenizer/json_field.h"

#include <limits>
#include <nlohmann/json.hpp>

#include "tokenizer/utf8.h"

namespace slimkv::json_field {

std::string member_path(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : str_cat(path, ".", key);
}

std::string element_path(const std::string& path, size_t index) { return str_cat(path, "[", index, "]"); }

std::string describe(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::object: return "an object";
    case Json::value_t::array: return "an array";
    case Json::value_t::string: return "a string";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "an integer";
    case Json::value_t::number_float: return "a floating-point number";
    default: return "an unsupported JSON value";
  }
}

const Json* find(const Json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(std::string(key));
  return it == object.end() ? nullptr : &*it;
}

Status expect_object(const Json& value, const std::string& path) {
  if (value.is_object()) return Status::ok();
  return error(path, ": expected an object, found ", describe(value));
}

Expected<std::string> required_string(const Json& object, std::string_view key, const std::string& path) {
  const Json* value = find(object, key);
  if (value == nullptr) return error(member_path(path, key), ": missing (expected a string)");
  if (!value->is_string()) return error(member_path(path, key), ": expected a string, found ", describe(*value));
  return value->get_ref<const std::string&>();
}

Expected<std::optional<std::string>> optional_string(const Json& object, std::string_view key,
                                                     const std::string& path) {
  const Json* value = find(object, key);
  if (value == nullptr || value->is_null()) return std::optional<std::string>();
  if (!value->is_string()) {
    return error(member_path(path, key), ": expected a string or null, found ", describe(*value));
  }
  return std::optional<std::string>(value->get_ref<const std::string&>());
}

Expected<bool> optional_bool(const Json& object, std::string_view key, const std::string& path,
                             bool fallback) {
  const Json* value = find(object, key);
  if (value == nullptr || value->is_null()) return fallback;
  if (!value->is_boolean()) return error(member_path(path, key), ": expected true or false, found ", describe(*value));
  return value->get<bool>();
}

namespace {
Expected<int64_t> to_int(const Json& value, const std::string& path) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return error(path, ": integer ", u, " is too large");
    }
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  return error(path, ": expected an integer, found ", describe(value));
}
}  // namespace

Expected<int64_t> required_int(const Json& object, std::string_view key, const std::string& path) {
  const Json* value = find(object, key);
  if (value == nullptr) return error(member_path(path, key), ": missing (expected an integer)");
  return to_int(*value, member_path(path, key));
}

Expected<int64_t> optional_int(const Json& object, std::string_view key, const std::string& path,
                               int64_t fallback) {
  const Json* value = find(object, key);
  if (value == nullptr || value->is_null()) return fallback;
  return to_int(*value, member_path(path, key));
}

Expected<char32_t> required_char(const Json& object, std::string_view key, const std::string& path) {
  SLIMKV_ASSIGN_OR_RETURN(const std::string text, required_string(object, key, path));
  if (text.empty() || utf8::sequence_size(static_cast<unsigned char>(text[0])) != text.size() ||
      !utf8::is_valid(text)) {
    return error(member_path(path, key), ": expected exactly one character, found \"", text, "\"");
  }
  return utf8::decode_at(text, 0).code_point;
}

Expected<Regex> required_pattern(const Json& object, std::string_view key, const std::string& path) {
  const std::string field = member_path(path, key);
  const Json* value = find(object, key);
  if (value == nullptr) return error(field, ": missing (expected {\"String\": ...} or {\"Regex\": ...})");
  if (!value->is_object() || value->size() != 1) {
    return error(field, ": expected {\"String\": ...} or {\"Regex\": ...}, found ", describe(*value));
  }
  const auto entry = value->begin();
  const std::string& kind = entry.key();
  const Json& text = entry.value();
  if (!text.is_string()) return error(member_path(field, kind), ": expected a string, found ", describe(text));
  const std::string& pattern = text.get_ref<const std::string&>();
  Expected<Regex> regex = Status::error("unset");
  if (kind == "String") {
    regex = Regex::compile_literal(pattern);
  } else if (kind == "Regex") {
    regex = Regex::compile(pattern);
  } else {
    return error(field, ": expected {\"String\": ...} or {\"Regex\": ...}, found key \"", kind, "\"");
  }
  if (!regex.has_value()) return regex.status().with_context(member_path(field, kind));
  return regex;
}

Expected<int32_t> as_token_id(const Json& value, const std::string& path) {
  SLIMKV_ASSIGN_OR_RETURN(const int64_t id, to_int(value, path));
  if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
    return error(path, ": token id ", id, " is out of range (expected 0 .. 2147483647)");
  }
  return static_cast<int32_t>(id);
}

}  // namespace slimkv::json_field
