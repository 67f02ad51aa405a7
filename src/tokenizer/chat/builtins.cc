#include "tokenizer/chat/builtins.h"

#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <iterator>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <optional>

#include "tokenizer/chat/lexer.h"
#include "tokenizer/utf8.h"

namespace slimkv::chat {

void fail_at(const Location& at, const std::string& message) { throw TemplateError(at.line, at.column, message); }

namespace {

// ---------------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------------

// The argument at `index`, or the keyword `name`, or undefined when neither was given.
Value argument(const CallArgs& args, size_t index, std::string_view name) {
  if (index < args.positional.size()) return args.positional[index];
  for (const auto& [key, value] : args.keyword) {
    if (key == name) return value;
  }
  return Value();
}

// A keyword-only argument (map's attribute= and default=), or undefined.
Value keyword_argument(const CallArgs& args, std::string_view name) {
  for (const auto& [key, value] : args.keyword) {
    if (key == name) return value;
  }
  return Value();
}

std::string require_string(const Value& value, const Location& at, std::string_view what) {
  if (!value.is_string()) fail_at(at, std::string(what) + " expects a string, got " + value.type_name());
  return value.as_string();
}

// Jinja2's soft_str: what a string filter sees (undefined is "").
std::string as_text(const Value& value) { return value.to_output(); }

// ---------------------------------------------------------------------------------------------
// Strings (Python str semantics on UTF-8)
// ---------------------------------------------------------------------------------------------

bool is_python_space(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

std::string strip(std::string_view text, const Value& chars, bool left, bool right) {
  const std::vector<std::string> points = code_points(text);
  std::vector<std::string> strip_set;
  if (chars.is_string()) strip_set = code_points(chars.as_string());
  auto strippable = [&](const std::string& point) {
    if (!chars.is_string()) return is_python_space(utf8::decode_at(point, 0).code_point);
    return std::find(strip_set.begin(), strip_set.end(), point) != strip_set.end();
  };
  size_t begin = 0, end = points.size();
  if (left) {
    while (begin < end && strippable(points[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strippable(points[end - 1])) --end;
  }
  std::string out;
  for (size_t i = begin; i < end; ++i) out += points[i];
  return out;
}

std::string map_case(std::string_view text, bool upper) {
  std::string out;
  for (const std::string& point : code_points(text)) {
    const char32_t c = utf8::decode_at(point, 0).code_point;
    const utf8proc_int32_t mapped = upper ? utf8proc_toupper(static_cast<utf8proc_int32_t>(c))
                                          : utf8proc_tolower(static_cast<utf8proc_int32_t>(c));
    utf8::append(static_cast<char32_t>(mapped), out);
  }
  return out;
}

// Python's str.capitalize(): first character upper, the rest lower.
std::string capitalize(std::string_view text) {
  const std::vector<std::string> points = code_points(text);
  if (points.empty()) return "";
  std::string rest;
  for (size_t i = 1; i < points.size(); ++i) rest += points[i];
  return map_case(points[0], true) + map_case(rest, false);
}

// Jinja2's title filter: each piece between runs of "-", whitespace, "(", "{", "[", "<" capitalized.
std::string title(std::string_view text) {
  std::string out, word;
  auto flush = [&] {
    out += capitalize(word);
    word.clear();
  };
  for (const std::string& point : code_points(text)) {
    const char32_t c = utf8::decode_at(point, 0).code_point;
    if (c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_python_space(c)) {
      flush();
      out += point;
    } else {
      word += point;
    }
  }
  flush();
  return out;
}

}  // namespace

std::string html_escape(std::string_view text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

std::string replace_all(std::string text, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between every character (and at both ends)
    const std::vector<std::string> points = code_points(text);
    int64_t done = 0;
    for (const std::string& point : points) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      out += point;
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t found = text.find(from, pos);
    if (found == std::string::npos) break;
    out.append(text, pos, found - pos);
    out += to;
    pos = found + from.size();
    ++done;
  }
  out.append(text, pos, std::string::npos);
  return out;
}

Value split(const std::string& text, const Value& separator, const Value& max_splits, const Location& at) {
  int64_t limit = max_splits.is_int() ? max_splits.as_int() : -1;
  ValueList parts;
  if (separator.is_undefined() || separator.is_none()) {  // runs of whitespace, no empty parts
    const std::vector<std::string> points = code_points(text);
    size_t i = 0;
    while (i < points.size()) {
      while (i < points.size() && is_python_space(utf8::decode_at(points[i], 0).code_point)) ++i;
      if (i >= points.size()) break;
      std::string part;
      if (limit == 0) {
        while (i < points.size()) part += points[i++];
        // Python keeps the rest as is but strips trailing whitespace only when splitting further.
        parts.push_back(Value::string(strip(part, Value(), false, true)));
        break;
      }
      while (i < points.size() && !is_python_space(utf8::decode_at(points[i], 0).code_point)) part += points[i++];
      parts.push_back(Value::string(std::move(part)));
      if (limit > 0) --limit;
    }
    return Value::list(std::move(parts));
  }
  const std::string sep = require_string(separator, at, "str.split");
  if (sep.empty()) fail_at(at, "str.split: empty separator");
  size_t pos = 0;
  while (limit != 0) {
    const size_t found = text.find(sep, pos);
    if (found == std::string::npos) break;
    parts.push_back(Value::string(text.substr(pos, found - pos)));
    pos = found + sep.size();
    if (limit > 0) --limit;
  }
  parts.push_back(Value::string(text.substr(pos)));
  return Value::list(std::move(parts));
}

bool starts_or_ends_with(const std::string& text, const Value& affix, bool starts, const Location& at) {
  auto check = [&](const Value& one) {
    const std::string s = require_string(one, at, starts ? "str.startswith" : "str.endswith");
    if (s.size() > text.size()) return false;
    return starts ? text.compare(0, s.size(), s) == 0 : text.compare(text.size() - s.size(), s.size(), s) == 0;
  };
  if (affix.is_list()) {  // a tuple of alternatives
    for (const Value& one : affix.as_list()) {
      if (check(one)) return true;
    }
    return false;
  }
  return check(affix);
}

// A bound method of a str value (`content.strip()`), or undefined when str has none of that name.
Value string_method(const std::string& text, std::string_view name, const Location& at) {
  const std::string method(name);
  auto bind = [&](auto fn) { return Value::callable("str." + method, fn); };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip", right = name != "lstrip";
    return bind([text, left, right](const CallArgs& args) {
      return Value::string(strip(text, argument(args, 0, "chars"), left, right));
    });
  }
  if (name == "upper" || name == "lower") {
    const bool upper = name == "upper";
    return bind([text, upper](const CallArgs&) { return Value::string(map_case(text, upper)); });
  }
  if (name == "title") return bind([text](const CallArgs&) { return Value::string(title(text)); });
  if (name == "capitalize") return bind([text](const CallArgs&) { return Value::string(capitalize(text)); });
  if (name == "startswith" || name == "endswith") {
    const bool starts = name == "startswith";
    return bind([text, starts, at](const CallArgs& args) {
      return Value::boolean(starts_or_ends_with(text, argument(args, 0, "prefix"), starts, at));
    });
  }
  if (name == "split") {
    return bind([text, at](const CallArgs& args) {
      return split(text, argument(args, 0, "sep"), argument(args, 1, "maxsplit"), at);
    });
  }
  if (name == "replace") {
    return bind([text, at](const CallArgs& args) {
      const Value count = argument(args, 2, "count");
      return Value::string(replace_all(text, require_string(argument(args, 0, "old"), at, "str.replace"),
                                       require_string(argument(args, 1, "new"), at, "str.replace"),
                                       count.is_int() ? count.as_int() : -1));
    });
  }
  if (name == "find") {
    return bind([text, at](const CallArgs& args) {
      const size_t found = text.find(require_string(argument(args, 0, "sub"), at, "str.find"));
      if (found == std::string::npos) return Value::integer(-1);
      return Value::integer(static_cast<int64_t>(code_points(text.substr(0, found)).size()));
    });
  }
  if (name == "count") {
    return bind([text, at](const CallArgs& args) {
      const std::string sub = require_string(argument(args, 0, "sub"), at, "str.count");
      if (sub.empty()) return Value::integer(static_cast<int64_t>(code_points(text).size()) + 1);
      int64_t n = 0;
      for (size_t pos = text.find(sub); pos != std::string::npos; pos = text.find(sub, pos + sub.size())) ++n;
      return Value::integer(n);
    });
  }
  if (name == "join") {
    return bind([text, at](const CallArgs& args) {
      const Value items = argument(args, 0, "iterable");
      if (!items.is_list()) fail_at(at, "str.join expects a list, got " + items.type_name());
      std::string out;
      for (size_t i = 0; i < items.as_list().size(); ++i) {
        if (i) out += text;
        out += require_string(items.as_list()[i], at, "str.join");
      }
      return Value::string(std::move(out));
    });
  }
  if (name == "isdigit" || name == "isalpha" || name == "isspace") {
    return bind([text, method](const CallArgs&) {
      const std::vector<std::string> points = code_points(text);
      if (points.empty()) return Value::boolean(false);
      for (const std::string& point : points) {
        const auto c = static_cast<utf8proc_int32_t>(utf8::decode_at(point, 0).code_point);
        const utf8proc_category_t category = utf8proc_category(c);
        bool ok = false;
        if (method == "isdigit") ok = category == UTF8PROC_CATEGORY_ND;
        else if (method == "isspace") ok = is_python_space(static_cast<char32_t>(c));
        else ok = category >= UTF8PROC_CATEGORY_LU && category <= UTF8PROC_CATEGORY_LO;
        if (!ok) return Value::boolean(false);
      }
      return Value::boolean(true);
    });
  }
  return Value::undefined("'str object' has no attribute '" + method + "'");
}

Value dict_method(const Value& dict, std::string_view name) {
  const std::string method(name);
  if (name == "items" || name == "keys" || name == "values") {
    return Value::callable("dict." + method, [dict, method](const CallArgs&) {
      ValueList out;
      for (const auto& [key, value] : dict.as_dict().entries) {
        if (method == "items") out.push_back(Value::tuple({Value::string(key), value}));
        else if (method == "keys") out.push_back(Value::string(key));
        else out.push_back(value);
      }
      return Value::list(std::move(out));
    });
  }
  if (name == "get") {
    return Value::callable("dict.get", [dict](const CallArgs& args) {
      const Value key = argument(args, 0, "key");
      if (key.is_string()) {
        if (const Value* found = dict.as_dict().find(key.as_string())) return *found;
      }
      const Value fallback = argument(args, 1, "default");
      return fallback.is_undefined() ? Value::none() : fallback;
    });
  }
  return Value();
}

// ---------------------------------------------------------------------------------------------
// JSON (Python's json.dumps)
// ---------------------------------------------------------------------------------------------

void append_json_string(std::string_view text, bool ensure_ascii, std::string& out) {
  out += '"';
  size_t i = 0;
  while (i < text.size()) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte >= 0x80) {
      const utf8::DecodedChar decoded = utf8::decode_at(text, i);
      if (ensure_ascii) {
        char buffer[16];
        auto emit = [&](uint32_t unit) {
          std::snprintf(buffer, sizeof(buffer), "\\u%04x", unit);
          out += buffer;
        };
        const uint32_t c = decoded.code_point;
        if (c >= 0x10000) {
          emit(0xD800 + ((c - 0x10000) >> 10));
          emit(0xDC00 + ((c - 0x10000) & 0x3FF));
        } else {
          emit(c);
        }
      } else {
        out.append(text, i, decoded.size_bytes);
      }
      i += decoded.size_bytes;
      continue;
    }
    switch (text[i]) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (byte < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof(buffer), "\\u%04x", byte);
          out += buffer;
        } else {
          out += text[i];
        }
    }
    ++i;
  }
  out += '"';
}

struct JsonStyle {
  bool indented = false;
  std::string indent;  // one level
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};

void append_json(const Value& value, const JsonStyle& style, int depth, const Location& at, std::string& out) {
  if (depth > Value::kMaxNesting) fail_at(at, "tojson: value nested too deeply (circular?)");
  auto newline = [&](int level) {
    if (!style.indented) return;
    out += '\n';
    for (int i = 0; i < level; ++i) out += style.indent;
  };
  switch (value.kind()) {
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += value.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(value.as_int()); return;
    case Value::Kind::kFloat: {
      const double f = value.as_number();
      if (std::isnan(f)) out += "NaN";
      else if (std::isinf(f)) out += f > 0 ? "Infinity" : "-Infinity";
      else out += python_float_repr(f);
      return;
    }
    case Value::Kind::kString: append_json_string(value.as_string(), style.ensure_ascii, out); return;
    case Value::Kind::kList: {
      if (value.is_generator()) fail_at(at, "tojson: Object of type generator is not JSON serializable");
      const ValueList& items = value.as_list();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += style.item_separator;
        newline(depth + 1);
        append_json(items[i], style, depth + 1, at, out);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (value.is_namespace()) fail_at(at, "tojson: Object of type Namespace is not JSON serializable");
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : value.as_dict().entries) entries.push_back(&entry);
      if (entries.empty()) {
        out += "{}";
        return;
      }
      if (style.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += style.item_separator;
        newline(depth + 1);
        append_json_string(entries[i]->first, style.ensure_ascii, out);
        out += style.key_separator;
        append_json(entries[i]->second, style, depth + 1, at, out);
      }
      newline(depth);
      out += '}';
      return;
    }
    case Value::Kind::kUndefined: fail_at(at, "tojson: Object of type Undefined is not JSON serializable");
    case Value::Kind::kCallable: fail_at(at, "tojson: Object of type function is not JSON serializable");
  }
}

// ---------------------------------------------------------------------------------------------
// Filters
// ---------------------------------------------------------------------------------------------

int64_t length_of(const Value& value, const Location& at) {
  if (value.is_string()) return static_cast<int64_t>(code_points(value.as_string()).size());
  if (value.is_list() && !value.is_generator()) return static_cast<int64_t>(value.as_list().size());
  if (value.is_dict()) return static_cast<int64_t>(value.as_dict().entries.size());
  if (value.is_undefined()) return 0;
  fail_at(at, "object of type '" + value.type_name() + "' has no len()");
}

// The items a filter iterates: a list's items, a dict's keys, a string's characters; undefined is empty.
ValueList iterate(const Value& value, const Location& at, std::string_view what) {
  if (value.is_list()) return value.as_list();
  if (value.is_undefined()) return {};
  ValueList out;
  if (value.is_dict()) {
    for (const auto& entry : value.as_dict().entries) out.push_back(Value::string(entry.first));
    return out;
  }
  if (value.is_string()) {
    for (std::string& point : code_points(value.as_string())) out.push_back(Value::string(std::move(point)));
    return out;
  }
  fail_at(at, std::string(what) + ": '" + value.type_name() + "' object is not iterable");
}

// Follows a dotted attribute path ("function.name") as Jinja2's make_attrgetter does.
Value attribute_path(const Value& item, const std::string& path, const Location& at) {
  Value current = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    current = numeric ? get_item(current, Value::integer(std::atoll(part.c_str())), at)
                      : get_item(current, Value::string(part), at);
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

CallArgs shift_arguments(const CallArgs& args, size_t skip) {
  CallArgs rest;
  for (size_t i = skip; i < args.positional.size(); ++i) rest.positional.push_back(args.positional[i]);
  rest.keyword = args.keyword;
  return rest;
}

// select / reject / selectattr / rejectattr.
Value select_items(const Value& input, const CallArgs& args, bool by_attribute, bool keep, const Location& at) {
  std::string attribute;
  size_t next = 0;
  if (by_attribute) {
    attribute = require_string(argument(args, 0, "attribute"), at, "selectattr");
    next = 1;
  }
  const Value test = argument(args, next, "test");
  CallArgs test_args = shift_arguments(args, next + 1);
  test_args.keyword.clear();
  ValueList out;
  if (!input.truthy()) return Value::generator({});  // Jinja2 iterates only a true value
  for (const Value& item : iterate(input, at, "select")) {
    const Value subject = by_attribute ? attribute_path(item, attribute, at) : item;
    const bool passed = test.is_undefined() ? subject.truthy()
                                            : apply_test(require_string(test, at, "select"), subject, test_args, at);
    if (passed == keep) out.push_back(item);
  }
  return Value::generator(std::move(out));
}

std::string indent_lines(const std::string& text, const Value& width, bool first, bool blank) {
  std::string indention;
  if (width.is_string()) indention = width.as_string();
  else indention.assign(width.is_int() ? static_cast<size_t>(std::clamp<int64_t>(width.as_int(), 0, 1024)) : 4, ' ');
  // Python's splitlines on text + "\n" (the quirk Jinja2 relies on to keep a final empty line).
  std::vector<std::string> lines;
  const std::string s = text + "\n";
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find_first_of("\r\n", pos);
    lines.push_back(s.substr(pos, end - pos));
    pos = end + ((s[end] == '\r' && end + 1 < s.size() && s[end + 1] == '\n') ? 2 : 1);
  }
  std::string out;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" + indention : "") + lines[i];
  } else {
    out = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) out += "\n" + (lines[i].empty() ? "" : indention + lines[i]);
  }
  return first ? indention + out : out;
}

}  // namespace

namespace {

constexpr std::string_view kFilters[] = {  // sorted: the error message lists them in this order
    "abs",  "capitalize", "count",   "d",    "default", "dictsort", "e",          "escape", "first",  "float",
    "forceescape", "indent", "int",  "items", "join",   "last",     "length",     "list",   "lower",  "map",
    "reject", "rejectattr", "replace", "reverse", "safe", "select", "selectattr", "string", "title",  "tojson",
    "trim", "unique", "upper"};
constexpr std::string_view kTests[] = {
    "!=", "<", "<=", "==", ">", ">=", "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "even",
    "false", "float", "ge", "gt", "in", "integer", "iterable", "le", "lower", "lt", "mapping", "ne", "none",
    "number", "odd", "sameas", "sequence", "string", "true", "undefined", "upper"};

template <size_t N>
std::string supported(const std::string_view (&names)[N]) {
  std::string out;
  for (const std::string_view name : names) {
    if (name == "d" || name == "forceescape" || !std::isalpha(static_cast<unsigned char>(name[0]))) continue;  // aliases
    out += (out.empty() ? "" : ", ") + std::string(name);
  }
  return out;
}

}  // namespace

bool is_known_filter(std::string_view name) {
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters);
}
bool is_known_test(std::string_view name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}
std::string unknown_filter_message(std::string_view name) {
  return "unknown filter '" + std::string(name) + "' (supported: " + supported(kFilters) + ")";
}
std::string unknown_test_message(std::string_view name) {
  return "unknown test '" + std::string(name) + "' (supported: " + supported(kTests) + ")";
}

std::vector<std::string> code_points(std::string_view text) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t size = std::min(utf8::sequence_size(static_cast<unsigned char>(text[i])), text.size() - i);
    out.emplace_back(text.substr(i, size));
    i += size;
  }
  return out;
}

std::string to_json(const Value& value, const CallArgs& args, const Location& at) {
  JsonStyle style;
  const Value indent = argument(args, 0, "indent");
  if (indent.is_int()) {
    style.indented = true;
    style.indent.assign(static_cast<size_t>(std::clamp<int64_t>(indent.as_int(), 0, 1024)), ' ');
  } else if (indent.is_string()) {
    style.indented = true;
    style.indent = indent.as_string();
  } else if (!indent.is_undefined() && !indent.is_none()) {
    fail_at(at, "tojson: indent must be an int or a string, got " + indent.type_name());
  }
  if (style.indented) style.item_separator = ",";
  const Value separators = argument(args, 1, "separators");
  if (separators.is_list() && separators.as_list().size() == 2) {
    style.item_separator = require_string(separators.as_list()[0], at, "tojson separators");
    style.key_separator = require_string(separators.as_list()[1], at, "tojson separators");
  }
  style.sort_keys = argument(args, 2, "sort_keys").truthy();
  style.ensure_ascii = argument(args, 3, "ensure_ascii").truthy();
  std::string out;
  append_json(value, style, 0, at, out);
  return out;
}

Value get_attribute(const Value& object, std::string_view name, const Location& at) {
  if (object.is_undefined()) fail_at(at, object.undefined_what().empty() ? "undefined value has no attribute '" + std::string(name) + "'"
                                                                         : object.undefined_what() + " (reading its attribute '" + std::string(name) + "')");
  if (object.is_string()) return string_method(object.as_string(), name, at);
  if (object.is_dict()) {
    if (!object.is_namespace()) {
      Value method = dict_method(object, name);
      if (!method.is_undefined()) return method;
    }
    if (const Value* found = object.as_dict().find(name)) return *found;
    return Value::undefined("'" + std::string(object.is_namespace() ? "Namespace" : "dict object") + "' has no attribute '" +
                            std::string(name) + "'");
  }
  return Value::undefined("'" + object.type_name() + " object' has no attribute '" + std::string(name) + "'");
}

Value get_item(const Value& object, const Value& key, const Location& at) {
  if (object.is_undefined()) fail_at(at, object.undefined_what().empty() ? "undefined value is not subscriptable"
                                                                         : object.undefined_what() + " (reading an item of it)");
  if (object.is_dict() && key.is_string()) {
    if (const Value* found = object.as_dict().find(key.as_string())) return *found;
    if (!object.is_namespace()) {
      Value method = dict_method(object, key.as_string());
      if (!method.is_undefined()) return method;
    }
    return Value::undefined("'dict object' has no attribute '" + key.as_string() + "'");
  }
  if (object.is_generator()) return Value::undefined("'generator object' is not subscriptable");
  if ((object.is_list() || object.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t index = key.as_int();
    if (object.is_list()) {
      const auto size = static_cast<int64_t>(object.as_list().size());
      if (index < 0) index += size;
      if (index < 0 || index >= size) return Value::undefined(object.type_name() + " object has no element " + std::to_string(key.as_int()));
      return object.as_list()[static_cast<size_t>(index)];
    }
    const std::vector<std::string> points = code_points(object.as_string());
    const auto size = static_cast<int64_t>(points.size());
    if (index < 0) index += size;
    if (index < 0 || index >= size) return Value::undefined("str object has no element " + std::to_string(key.as_int()));
    return Value::string(points[static_cast<size_t>(index)]);
  }
  if (key.is_string()) return get_attribute(object, key.as_string(), at);
  return Value::undefined("'" + object.type_name() + " object' has no element " + key.repr());
}

Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step, const Location& at) {
  if (!object.is_list() && !object.is_string()) {
    if (object.is_undefined()) fail_at(at, object.undefined_what().empty() ? "undefined value cannot be sliced" : object.undefined_what());
    fail_at(at, "'" + object.type_name() + "' object cannot be sliced");
  }
  auto bound = [&](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) fail_at(at, std::string("slice ") + what + " must be an integer, got " + v.type_name());
    return v.as_int();
  };
  const std::optional<int64_t> begin_arg = bound(start, "start"), end_arg = bound(stop, "stop"), step_arg = bound(step, "step");
  const int64_t stride = step_arg.value_or(1);
  if (stride == 0) fail_at(at, "slice step cannot be zero");
  std::vector<std::string> points;
  if (object.is_string()) points = code_points(object.as_string());
  const auto size = static_cast<int64_t>(object.is_list() ? object.as_list().size() : points.size());
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t i = *v;
    if (i < 0) {
      i += size;
      if (i < 0) i = stride < 0 ? -1 : 0;
    } else if (i >= size) {
      i = stride < 0 ? size - 1 : size;
    }
    return i;
  };
  const int64_t begin = adjust(begin_arg, stride < 0 ? size - 1 : 0);
  const int64_t end = adjust(end_arg, stride < 0 ? -1 : size);
  ValueList items;
  std::string text;
  for (int64_t i = begin; stride > 0 ? i < end : i > end; i += stride) {
    if (object.is_list()) items.push_back(object.as_list()[static_cast<size_t>(i)]);
    else text += points[static_cast<size_t>(i)];
  }
  return object.is_list() ? Value::list(std::move(items)) : Value::string(std::move(text));
}

Value apply_filter(std::string_view name, const Value& input, const CallArgs& args, const Location& at) {
  if (name == "default" || name == "d") {
    const bool boolean = argument(args, 1, "boolean").truthy();
    if (input.is_undefined() || (boolean && !input.truthy())) {
      const Value fallback = argument(args, 0, "default_value");
      return fallback.is_undefined() ? Value::string("") : fallback;
    }
    return input;
  }
  if (name == "tojson") return Value::string(to_json(input, args, at));
  if (name == "length" || name == "count") return Value::integer(length_of(input, at));
  if (name == "string") return input.is_string() ? input : Value::string(input.to_output());
  if (name == "trim") return Value::string(strip(as_text(input), argument(args, 0, "chars"), true, true));
  if (name == "upper" || name == "lower") return Value::string(map_case(as_text(input), name == "upper"));
  if (name == "capitalize") return Value::string(capitalize(as_text(input)));
  if (name == "title") return Value::string(title(as_text(input)));
  if (name == "safe" || name == "e" || name == "escape" || name == "forceescape") {
    if (name == "safe" || (input.is_markup() && name != "forceescape")) return Value::markup(as_text(input));
    return Value::markup(html_escape(as_text(input)));
  }
  if (name == "dictsort") {
    if (!input.is_dict()) fail_at(at, "dictsort expects a mapping, got " + input.type_name());
    const bool case_sensitive = argument(args, 0, "case_sensitive").truthy();
    const bool by_value = argument(args, 1, "by").is_string() && argument(args, 1, "by").as_string() == "value";
    const bool reverse = argument(args, 2, "reverse").truthy();
    ValueList pairs;
    for (const auto& [key, value] : input.as_dict().entries) pairs.push_back(Value::tuple({Value::string(key), value}));
    auto sort_key = [&](const Value& pair) {
      const Value& v = pair.as_list()[by_value ? 1 : 0];
      if (!v.is_string()) fail_at(at, "dictsort: can only sort string keys and values here");
      return case_sensitive ? v.as_string() : map_case(v.as_string(), false);
    };
    std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& a, const Value& b) {
      return reverse ? sort_key(b) < sort_key(a) : sort_key(a) < sort_key(b);
    });
    return Value::list(std::move(pairs));
  }
  if (name == "replace") {
    const Value count = argument(args, 2, "count");
    return Value::string(replace_all(as_text(input), as_text(argument(args, 0, "old")), as_text(argument(args, 1, "new")),
                                     count.is_int() ? count.as_int() : -1));
  }
  if (name == "join") {
    const Value separator = argument(args, 0, "d");
    const Value attribute = argument(args, 1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(input, at, "join")) {
      if (!first) out += separator.is_undefined() ? "" : as_text(separator);
      first = false;
      out += as_text(attribute.is_undefined() ? item : attribute_path(item, as_text(attribute), at));
    }
    return Value::string(std::move(out));
  }
  if (name == "items") {
    if (input.is_undefined()) return Value::list();
    if (!input.is_dict()) fail_at(at, "items filter expects a mapping, got " + input.type_name());
    ValueList out;
    for (const auto& [key, value] : input.as_dict().entries) out.push_back(Value::tuple({Value::string(key), value}));
    return Value::list(std::move(out));
  }
  if (name == "list") return Value::list(iterate(input, at, "list"));
  if (name == "first" || name == "last") {
    const ValueList items = iterate(input, at, name);
    if (items.empty()) return Value::undefined("no " + std::string(name) + " item, sequence was empty");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    if (input.is_string()) {
      std::vector<std::string> points = code_points(input.as_string());
      std::string out;
      for (auto it = points.rbegin(); it != points.rend(); ++it) out += *it;
      return Value::string(std::move(out));
    }
    ValueList items = iterate(input, at, "reverse");
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (name == "select" || name == "reject") return select_items(input, args, false, name == "select", at);
  if (name == "selectattr" || name == "rejectattr") return select_items(input, args, true, name == "selectattr", at);
  if (name == "map") {
    const Value attribute = keyword_argument(args, "attribute");
    ValueList out;
    if (!input.truthy()) return Value::generator({});
    for (const Value& item : iterate(input, at, "map")) {
      if (!attribute.is_undefined()) {
        Value mapped = attribute_path(item, as_text(attribute), at);
        if (mapped.is_undefined()) {
          const Value fallback = keyword_argument(args, "default");
          if (!fallback.is_undefined()) mapped = fallback;
        }
        out.push_back(std::move(mapped));
      } else {
        const std::string filter = require_string(argument(args, 0, "filter"), at, "map");
        out.push_back(apply_filter(filter, item, shift_arguments(args, 1), at));
      }
    }
    return Value::generator(std::move(out));
  }
  if (name == "unique") {
    ValueList out;
    for (const Value& item : iterate(input, at, "unique")) {
      if (std::none_of(out.begin(), out.end(), [&](const Value& seen) { return seen.equals(item); })) out.push_back(item);
    }
    return Value::list(std::move(out));
  }
  if (name == "int") {
    if (input.is_int() || input.is_bool()) return Value::integer(input.as_int());
    if (input.is_float() && std::isfinite(input.as_number()) && std::fabs(input.as_number()) < 9.2e18) {
      return Value::integer(static_cast<int64_t>(input.as_number()));
    }
    if (input.is_string()) {
      const std::string text = strip(input.as_string(), Value(), true, true);
      char* end = nullptr;
      errno = 0;
      const long long parsed = std::strtoll(text.c_str(), &end, 10);
      if (!text.empty() && end == text.c_str() + text.size() && errno == 0) return Value::integer(parsed);
    }
    const Value fallback = argument(args, 0, "default");
    return fallback.is_undefined() ? Value::integer(0) : fallback;
  }
  if (name == "float") {
    if (input.is_number() || input.is_bool()) return Value::floating(input.as_number());
    if (input.is_string()) {
      const std::string text = strip(input.as_string(), Value(), true, true);
      char* end = nullptr;
      const double parsed = std::strtod(text.c_str(), &end);
      if (!text.empty() && end == text.c_str() + text.size()) return Value::floating(parsed);
    }
    const Value fallback = argument(args, 0, "default");
    return fallback.is_undefined() ? Value::floating(0) : fallback;
  }
  if (name == "abs") {
    if (input.is_int() || input.is_bool()) {
      if (input.as_int() == INT64_MIN) fail_at(at, "abs: integer overflow");
      return Value::integer(std::llabs(input.as_int()));
    }
    if (input.is_float()) return Value::floating(std::fabs(input.as_number()));
    fail_at(at, "abs expects a number, got " + input.type_name());
  }
  if (name == "indent") {
    return Value::string(indent_lines(as_text(input), argument(args, 0, "width"), argument(args, 1, "first").truthy(),
                                      argument(args, 2, "blank").truthy()));
  }
  fail_at(at, unknown_filter_message(name));
}

bool apply_test(std::string_view name, const Value& input, const CallArgs& args, const Location& at) {
  if (name == "defined") return !input.is_undefined();
  if (name == "undefined") return input.is_undefined();
  if (name == "none") return input.is_none();
  if (name == "boolean") return input.is_bool();
  if (name == "true") return input.is_bool() && input.as_bool();
  if (name == "false") return input.is_bool() && !input.as_bool();
  if (name == "integer") return input.is_int();
  if (name == "float") return input.is_float();
  if (name == "number") return input.is_number() || input.is_bool();
  if (name == "string") return input.is_string();
  if (name == "mapping") return input.is_dict();
  // Jinja2's Undefined has __iter__, __len__ and __getitem__, so it passes these two.
  if (name == "iterable") return input.is_string() || input.is_list() || input.is_dict() || input.is_undefined();
  if (name == "sequence") return input.is_string() || input.is_list() || input.is_dict() || input.is_undefined();
  if (name == "callable") return input.is_callable();
  if (name == "lower") return input.is_string() && map_case(input.as_string(), false) == input.as_string();
  if (name == "upper") return input.is_string() && map_case(input.as_string(), true) == input.as_string();
  const Value other = argument(args, 0, "other");
  if (name == "equalto" || name == "eq" || name == "==") return input.equals(other);
  if (name == "ne" || name == "!=") return !input.equals(other);
  if (name == "sameas") {
    if (input.kind() != other.kind()) return false;
    if (input.is_none() || input.is_bool()) return input.equals(other);
    return input.is_list() || input.is_dict() ? input.equals(other) && input.repr() == other.repr() : input.equals(other);
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!input.is_int() && !input.is_bool()) fail_at(at, std::string(name) + " test expects an integer, got " + input.type_name());
    if (name == "divisibleby") {
      if (!other.is_int() || other.as_int() == 0) fail_at(at, "divisibleby expects a non-zero integer");
      return other.as_int() == -1 || input.as_int() % other.as_int() == 0;
    }
    const bool odd = (input.as_int() % 2) != 0;
    return name == "odd" ? odd : !odd;
  }
  if (name == "in") {
    if (other.is_list()) {
      return std::any_of(other.as_list().begin(), other.as_list().end(), [&](const Value& v) { return v.equals(input); });
    }
    if (other.is_dict()) return input.is_string() && other.as_dict().find(input.as_string()) != nullptr;
    if (other.is_string() && input.is_string()) return other.as_string().find(input.as_string()) != std::string::npos;
    fail_at(at, "in test: cannot look into a " + other.type_name());
  }
  if (name == "lt" || name == "gt" || name == "le" || name == "ge" || name == "<" || name == ">" || name == "<=" || name == ">=") {
    if (!(input.is_number() || input.is_bool()) || !(other.is_number() || other.is_bool())) {
      if (input.is_string() && other.is_string()) {
        const int c = input.as_string().compare(other.as_string());
        if (name == "lt" || name == "<") return c < 0;
        if (name == "gt" || name == ">") return c > 0;
        if (name == "le" || name == "<=") return c <= 0;
        return c >= 0;
      }
      fail_at(at, "comparison test between " + input.type_name() + " and " + other.type_name());
    }
    const double a = input.as_number(), b = other.as_number();
    if (name == "lt" || name == "<") return a < b;
    if (name == "gt" || name == ">") return a > b;
    if (name == "le" || name == "<=") return a <= b;
    return a >= b;
  }
  fail_at(at, unknown_test_message(name));
}

}  // namespace slimkv::chat
