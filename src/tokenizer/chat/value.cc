#include "tokenizer/chat/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "tokenizer/utf8.h"

namespace slimkv::chat {

const Value* ValueDict::find(std::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k == key) return &v;
  }
  return nullptr;
}

Value* ValueDict::find(std::string_view key) {
  for (auto& [k, v] : entries) {
    if (k == key) return &v;
  }
  return nullptr;
}

void ValueDict::set(std::string key, Value value) {
  if (Value* existing = find(key)) {
    *existing = std::move(value);
    return;
  }
  entries.emplace_back(std::move(key), std::move(value));
}

Value Value::list(ValueList items) {
  Value v(Kind::kList);
  v.list_ = std::make_shared<ValueList>(std::move(items));
  return v;
}

Value Value::generator(ValueList items) {
  Value v = list(std::move(items));
  v.is_generator_ = true;
  return v;
}

Value Value::tuple(ValueList items) {
  Value v = list(std::move(items));
  v.is_tuple_ = true;
  return v;
}

Value Value::dict(ValueDict dict) {
  Value v(Kind::kDict);
  v.dict_ = std::make_shared<ValueDict>(std::move(dict));
  return v;
}

Value Value::name_space(ValueDict dict) {
  Value v = Value::dict(std::move(dict));
  v.is_namespace_ = true;
  return v;
}

Value Value::callable(std::string name, Callable fn) {
  Value v(Kind::kCallable);
  v.text_ = std::move(name);
  v.callable_ = std::make_shared<Callable>(std::move(fn));
  return v;
}

// Text from a client may not be valid UTF-8 (a JSON object built in code is not checked): make it so
// once here, so code-point operations never see a broken sequence.
static std::string valid_utf8(std::string text) {
  return utf8::is_valid(text) ? text : utf8::make_valid_utf8(text);
}

Value Value::from_json(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = json.get<uint64_t>();
      // Beyond int64 a Python int would still be exact; a double is the closest we keep.
      return u <= static_cast<uint64_t>(INT64_MAX) ? integer(static_cast<int64_t>(u))
                                                   : floating(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return floating(json.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(valid_utf8(json.get<std::string>()));
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(from_json(item));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict dict;
      dict.entries.reserve(json.size());
      for (const auto& [key, item] : json.items()) dict.set(valid_utf8(key), from_json(item));
      return Value::dict(std::move(dict));
    }
    default: return none();  // binary and discarded values do not occur in parsed JSON text
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool:
    case Kind::kInt: return int_ != 0;
    case Kind::kFloat: return float_ != 0;
    case Kind::kString: return !text_.empty();
    case Kind::kList: return is_generator_ || !list_->empty();
    case Kind::kDict: return is_namespace_ || !dict_->entries.empty();
    case Kind::kCallable: return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return is_generator_ ? "generator" : "list";
    case Kind::kDict: return is_namespace_ ? "Namespace" : "dict";
    case Kind::kCallable: return "function";
  }
  return "?";
}

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // The shortest digits that round-trip (what Python's repr picks), then Python's layout: fixed
  // notation for exponents -4..15, else d.ddde+XX.
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  std::string sci(buffer, result.ptr);
  const size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string sign;
  if (!mantissa.empty() && mantissa[0] == '-') {
    sign = "-";
    mantissa.erase(0, 1);
  }
  std::string digits;
  for (const char c : mantissa) {
    if (c != '.') digits += c;
  }
  if (exponent >= -4 && exponent < 16) {
    std::string out;
    if (exponent < 0) {
      out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<size_t>(exponent) + 1 >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(exponent) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exponent) + 1) + "." +
            digits.substr(static_cast<size_t>(exponent) + 1);
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_text[16];
  std::snprintf(exp_text, sizeof(exp_text), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return sign + out + exp_text;
}

std::string python_string_repr(std::string_view text) {
  const bool use_double = text.find('\'') != std::string_view::npos && text.find('"') == std::string_view::npos;
  const char quote = use_double ? '"' : '\'';
  std::string out(1, quote);
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (byte < 0x20 || byte == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", byte);
      out += hex;
    } else {
      out += c;  // non-ASCII printable text stays as it is, as in Python 3
    }
  }
  out += quote;
  return out;
}

std::string Value::to_output() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return int_ ? "True" : "False";
    case Kind::kInt: return std::to_string(int_);
    case Kind::kFloat: return python_float_repr(float_);
    case Kind::kString: return text_;
    default: return repr();
  }
}

std::string Value::repr(int depth) const {
  if (depth > kMaxNesting) return "...";
  switch (kind_) {
    case Kind::kString: return python_string_repr(text_);
    case Kind::kList: {
      if (is_generator_) return "<generator object>";
      std::string out = is_tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        out += (*list_)[i].repr(depth + 1);
      }
      if (is_tuple_) return out + (list_->size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case Kind::kDict: {
      std::string out = is_namespace_ ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [key, item] : dict_->entries) {
        if (!first) out += ", ";
        first = false;
        out += python_string_repr(key) + ": " + item.repr(depth + 1);
      }
      return out + (is_namespace_ ? "}>" : "}");
    }
    case Kind::kCallable: return "<function " + text_ + ">";
    default: return to_output();
  }
}

bool Value::equals(const Value& other, int depth) const {
  if (depth > kMaxNesting) return false;
  const bool numeric = (kind_ == Kind::kBool || is_number());
  const bool other_numeric = (other.kind_ == Kind::kBool || other.is_number());
  if (numeric && other_numeric) {
    if (kind_ != Kind::kFloat && other.kind_ != Kind::kFloat) return int_ == other.int_;
    return as_number() == other.as_number();
  }
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return text_ == other.text_;
    case Kind::kList: {
      if (is_generator_ || other.is_generator_) return list_ == other.list_;  // generators compare by identity
      if (list_->size() != other.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].equals((*other.list_)[i], depth + 1)) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (dict_ == other.dict_) return true;
      if (is_namespace_ || other.is_namespace_) return false;  // Python compares namespaces by identity
      if (dict_->entries.size() != other.dict_->entries.size()) return false;
      for (const auto& [key, item] : dict_->entries) {
        const Value* match = other.dict_->find(key);
        if (match == nullptr || !item.equals(*match, depth + 1)) return false;
      }
      return true;
    }
    case Kind::kCallable: return callable_ == other.callable_;
    default: return false;
  }
}

}  // namespace slimkv::chat
