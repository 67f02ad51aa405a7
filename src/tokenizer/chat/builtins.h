// What a chat template can call by name: Jinja2's filters (`x | trim`) and tests (`x is string`),
// the methods of Python's str and dict that templates call (`content.split('</think>')`,
// `message.items()`), and transformers' `tojson`. Each follows the Python/Jinja2 behaviour that
// transformers renders with; errors throw TemplateError at `at`.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat/value.h"

namespace slimkv::chat {

struct Location {
  int line = 0;
  int column = 0;
};

[[noreturn]] void fail_at(const Location& at, const std::string& message);

// Whether a filter or test of that name exists: the parser rejects unknown ones when the template
// loads, as Jinja2 does when it compiles, so a model's bad template fails at startup.
bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);
// "unknown filter 'x' (supported: ...)" / "unknown test 'x' (supported: ...)".
std::string unknown_filter_message(std::string_view name);
std::string unknown_test_message(std::string_view name);

// input | name(args). Unknown names fail with the list of supported filters.
Value apply_filter(std::string_view name, const Value& input, const CallArgs& args, const Location& at);

// input is name(args). Unknown names fail with the list of supported tests.
bool apply_test(std::string_view name, const Value& input, const CallArgs& args, const Location& at);

// object.name as Jinja2's getattr does it: a Python attribute first (a bound str/dict method),
// then the dict key. Missing gives undefined (which fails only when used).
Value get_attribute(const Value& object, std::string_view name, const Location& at);

// object[key] as Jinja2's getitem does it: the item first, then a str key as an attribute.
Value get_item(const Value& object, const Value& key, const Location& at);

// object[start:stop:step] for lists and strings (code points), Python's slice rules.
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step, const Location& at);

// transformers' tojson: json.dumps(value, ensure_ascii=False, indent=indent, separators=...,
// sort_keys=...).
std::string to_json(const Value& value, const CallArgs& args, const Location& at);

// markupsafe's escape(): & < > " ' as HTML entities.
std::string html_escape(std::string_view text);

// The code points of valid UTF-8 text, each as its UTF-8 bytes (how Python indexes a str).
std::vector<std::string> code_points(std::string_view text);

}  // namespace slimkv::chat
