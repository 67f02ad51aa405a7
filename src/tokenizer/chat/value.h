// The values a chat template computes with: Python's objects as Jinja2 sees them (undefined, None,
// bool, int, float, str, list, dict, namespace, callable). Lists and dicts are shared by reference as
// in Python, so a namespace() updated inside a loop is seen after it; dicts keep insertion order,
// because transformers' `tojson` and `items` print keys in the order the messages gave them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace slimkv::chat {

class Value;
using ValueList = std::vector<Value>;

// An ordered str -> value map (JSON objects and Jinja dict literals only have string keys here).
struct ValueDict {
  std::vector<std::pair<std::string, Value>> entries;
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(std::string key, Value value);  // replaces an existing key in place
};

// Arguments of a call: positional, then keyword (`tojson(indent=4)`).
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
using Callable = std::function<Value(const CallArgs&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

  Value() = default;  // undefined
  static Value undefined(std::string what) {
    Value v;
    v.text_ = std::move(what);
    return v;
  }
  static Value none() { return Value(Kind::kNone); }
  static Value boolean(bool b) {
    Value v(Kind::kBool);
    v.int_ = b ? 1 : 0;
    return v;
  }
  static Value integer(int64_t i) {
    Value v(Kind::kInt);
    v.int_ = i;
    return v;
  }
  static Value floating(double f) {
    Value v(Kind::kFloat);
    v.float_ = f;
    return v;
  }
  static Value string(std::string s) {
    Value v(Kind::kString);
    v.text_ = std::move(s);
    return v;
  }
  static Value list(ValueList items = {});
  // What Jinja2's select/reject/map filters return: a generator. It iterates like a list, but is
  // always true, has no len() and is not JSON serializable (so `x|selectattr(...)|length` fails as
  // it does under transformers; templates write `|list` first).
  static Value generator(ValueList items);
  // A Python tuple (dict.items() pairs, dictsort, `(a, b)`): a list that prints as (a, b).
  static Value tuple(ValueList items);
  // Markup (what `|safe` and `|e` return): `markup + str` HTML-escapes the str side, as
  // markupsafe's Markup.__add__ does (functionary's template relies on it).
  static Value markup(std::string s) {
    Value v = string(std::move(s));
    v.is_markup_ = true;
    return v;
  }
  static Value dict(ValueDict dict = {});
  // A namespace() object: a dict whose attributes `{% set ns.x = ... %}` may assign.
  static Value name_space(ValueDict dict = {});
  static Value callable(std::string name, Callable fn);
  // A JSON document (messages, tools) as values; objects keep their key order.
  static Value from_json(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kDict && is_namespace_; }
  bool is_generator() const { return kind_ == Kind::kList && is_generator_; }
  bool is_markup() const { return kind_ == Kind::kString && is_markup_; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }
  double as_number() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& as_string() const { return text_; }
  // For undefined: what was looked up ("'foo' is undefined"), for the error when it is used.
  const std::string& undefined_what() const { return text_; }
  const std::string& callable_name() const { return text_; }
  const ValueList& as_list() const { return *list_; }
  const ValueDict& as_dict() const { return *dict_; }
  ValueDict& mutable_dict() const { return *dict_; }  // namespaces only
  const Callable& as_callable() const { return *callable_; }

  // Python's truth value (undefined is false, as Jinja2's Undefined is).
  bool truthy() const;
  // Python's type name, for error messages: "str", "list", "dict", "NoneType", "undefined".
  std::string type_name() const;
  // Jinja2's {{ value }}: Python's str(); undefined prints nothing.
  std::string to_output() const;
  // Python's repr(): how a list or dict prints its items. A namespace can hold itself, so nesting
  // deeper than kMaxNesting prints "..." as Python does for a cycle. ChatTemplate refuses inputs
  // nested deeper than that, so only such cycles reach it.
  std::string repr(int depth = 0) const;
  // Python's ==, deep for lists and dicts (1 == 1.0 == True); false past kMaxNesting.
  bool equals(const Value& other, int depth = 0) const;
  static constexpr int kMaxNesting = 128;

 private:
  explicit Value(Kind kind) : kind_(kind) {}

  Kind kind_ = Kind::kUndefined;
  bool is_namespace_ = false;
  bool is_generator_ = false;
  bool is_tuple_ = false;
  bool is_markup_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::string text_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<Callable> callable_;
};

// Python's repr() of a float ("21.5", "1.0", "1e+20", "inf").
std::string python_float_repr(double value);

// Python's str(s) quoted as repr() does: single quotes unless the text holds ' and no ".
std::string python_string_repr(std::string_view text);

}  // namespace slimkv::chat
