#include "tokenizer/chat/evaluator.h"

#include <cmath>
#include <memory>

#include "tokenizer/chat/builtins.h"
#include "tokenizer/chat/lexer.h"

namespace slimkv::chat {
namespace {

Location where(const Expr& expr) { return {expr.line, expr.column}; }
Location where(const Node& node) { return {node.line, node.column}; }

enum class Flow { kNormal, kBreak, kContinue };

class Evaluator {
 public:
  Evaluator(const ValueDict& variables, const RenderLimits& limits, const Clock& clock)
      : limits_(limits), clock_(clock) {
    auto globals = std::make_shared<ValueDict>();
    add_globals(*globals);
    for (const auto& [name, value] : variables.entries) globals->set(name, value);
    scopes_.push_back(std::move(globals));
  }

  std::string render(const std::vector<Node>& program) {
    std::string out;
    run_body(program, out);  // break/continue only occur inside loops (the parser checks)
    return out;
  }

 private:
  // ------------------------------------------------------------------------------------------
  // Statements
  // ------------------------------------------------------------------------------------------

  Flow run_body(const std::vector<Node>& body, std::string& out) {
    for (const Node& node : body) {
      const Flow flow = run(node, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow run(const Node& node, std::string& out) {
    count_step(where(node));
    switch (node.kind) {
      case Node::Kind::kText: append(out, node.text, where(node)); return Flow::kNormal;
      case Node::Kind::kOutput: append(out, eval(*node.expr).to_output(), where(node)); return Flow::kNormal;
      case Node::Kind::kIf:
        for (size_t i = 0; i < node.bodies.size(); ++i) {
          if (i >= node.conditions.size() || eval(*node.conditions[i]).truthy()) return run_body(node.bodies[i], out);
        }
        return Flow::kNormal;
      case Node::Kind::kFor: run_for(node, out); return Flow::kNormal;
      case Node::Kind::kSet: {
        Value value = eval(*node.expr);
        if (!node.attribute.empty()) {
          const Value target = lookup(node.targets[0]);
          if (!target.is_namespace()) {
            fail_at(where(node), "cannot assign attribute '" + node.attribute + "' on '" + node.targets[0] +
                                     "' (a " + target.type_name() + "): only a namespace() takes attributes");
          }
          target.mutable_dict().set(node.attribute, std::move(value));
        } else {
          assign(node.targets, value, where(node));
        }
        return Flow::kNormal;
      }
      case Node::Kind::kSetBlock: {
        std::string captured;
        run_body(node.bodies[0], captured);
        scopes_.back()->set(node.targets[0], Value::string(std::move(captured)));
        return Flow::kNormal;
      }
      case Node::Kind::kMacro: scopes_.back()->set(node.name, make_macro(node)); return Flow::kNormal;
      case Node::Kind::kFilterBlock: {
        std::string captured;
        const Flow flow = run_body(node.bodies[0], captured);
        append(out, filter_chain(*node.expr, Value::string(std::move(captured))).to_output(), where(node));
        return flow;
      }
      case Node::Kind::kBreak: return Flow::kBreak;
      case Node::Kind::kContinue: return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  void assign(const std::vector<std::string>& targets, const Value& value, const Location& at) {
    if (targets.size() == 1) {
      scopes_.back()->set(targets[0], value);
      return;
    }
    if (!value.is_list() || value.as_list().size() != targets.size()) {
      fail_at(at, "cannot unpack " + value.type_name() + " into " + std::to_string(targets.size()) + " names");
    }
    for (size_t i = 0; i < targets.size(); ++i) scopes_.back()->set(targets[i], value.as_list()[i]);
  }

  void run_for(const Node& node, std::string& out) {
    const Value iterable = eval(*node.expr);
    ValueList items;
    if (iterable.is_list()) {
      items = iterable.as_list();
    } else if (iterable.is_dict() && !iterable.is_namespace()) {
      for (const auto& entry : iterable.as_dict().entries) items.push_back(Value::string(entry.first));
    } else if (iterable.is_string()) {
      for (std::string& point : code_points(iterable.as_string())) items.push_back(Value::string(std::move(point)));
    } else if (!iterable.is_undefined()) {  // Jinja2's Undefined iterates as empty
      fail_at(where(*node.expr), "'" + iterable.type_name() + "' object is not iterable");
    }
    // `for x in xs if cond`: the filter runs first, so loop.length and loop.last count only what passes.
    if (node.filter) {
      ValueList kept;
      for (const Value& item : items) {
        count_step(where(node));
        ScopeGuard scope(*this);
        assign(node.targets, item, where(node));
        if (eval(*node.filter).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (node.bodies.size() > 1) {
        ScopeGuard scope(*this);
        run_body(node.bodies[1], out);
      }
      return;
    }
    const auto length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      count_step(where(node));  // an empty body still costs a step, so nested empty loops stay bounded
      ScopeGuard scope(*this);
      ValueDict loop;
      loop.set("index", Value::integer(i + 1));
      loop.set("index0", Value::integer(i));
      loop.set("revindex", Value::integer(length - i));
      loop.set("revindex0", Value::integer(length - i - 1));
      loop.set("first", Value::boolean(i == 0));
      loop.set("last", Value::boolean(i == length - 1));
      loop.set("length", Value::integer(length));
      loop.set("depth", Value::integer(1));
      loop.set("depth0", Value::integer(0));
      loop.set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item"));
      loop.set("nextitem", i + 1 < length ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item"));
      scopes_.back()->set("loop", Value::dict(std::move(loop)));
      assign(node.targets, items[static_cast<size_t>(i)], where(node));
      if (run_body(node.bodies[0], out) == Flow::kBreak) break;
    }
  }

  Value make_macro(const Node& node) {
    const Node* macro = &node;
    return Value::callable(node.name, [this, macro](const CallArgs& args) {
      if (++call_depth_ > limits_.max_call_depth) {
        fail_at(where(*macro), "macro '" + macro->name + "' nested deeper than " + std::to_string(limits_.max_call_depth) +
                                   " calls (runaway recursion?)");
      }
      // A macro sees the template's globals and its own parameters, not its caller's locals.
      std::vector<std::shared_ptr<ValueDict>> saved = std::move(scopes_);
      scopes_ = {saved.front(), std::make_shared<ValueDict>()};
      std::string out;
      try {
        if (args.positional.size() > macro->params.size()) {
          fail_at(where(*macro), "macro '" + macro->name + "' takes " + std::to_string(macro->params.size()) +
                                     " arguments, " + std::to_string(args.positional.size()) + " given");
        }
        for (size_t i = 0; i < macro->params.size(); ++i) {
          Value value;
          bool given = false;
          if (i < args.positional.size()) {
            value = args.positional[i];
            given = true;
          }
          for (const auto& [key, keyword_value] : args.keyword) {
            if (key == macro->params[i]) {
              value = keyword_value;
              given = true;
            }
          }
          if (!given) value = macro->defaults[i] ? eval(*macro->defaults[i]) : Value::undefined("'" + macro->params[i] + "' is undefined");
          scopes_.back()->set(macro->params[i], std::move(value));
        }
        run_body(macro->bodies[0], out);
      } catch (...) {
        scopes_ = std::move(saved);
        --call_depth_;
        throw;
      }
      scopes_ = std::move(saved);
      --call_depth_;
      return Value::string(std::move(out));
    });
  }

  // ------------------------------------------------------------------------------------------
  // Expressions
  // ------------------------------------------------------------------------------------------

  Value eval(const Expr& expr) {
    count_step(where(expr));
    switch (expr.kind) {
      case Expr::Kind::kLiteral: return expr.literal;
      case Expr::Kind::kName: return lookup(expr.name);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        ValueList items;
        for (const ExprPtr& child : expr.children) items.push_back(eval(*child));
        return expr.kind == Expr::Kind::kTuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
      }
      case Expr::Kind::kDict: {
        ValueDict dict;
        for (size_t i = 0; i + 1 < expr.children.size(); i += 2) {
          const Value key = eval(*expr.children[i]);
          if (!key.is_string()) fail_at(where(*expr.children[i]), "dict keys must be strings here, got " + key.type_name());
          dict.set(key.as_string(), eval(*expr.children[i + 1]));
        }
        return Value::dict(std::move(dict));
      }
      case Expr::Kind::kAttribute: return get_attribute(eval(*expr.children[0]), expr.name, where(expr));
      case Expr::Kind::kSubscript: return get_item(eval(*expr.children[0]), eval(*expr.children[1]), where(expr));
      case Expr::Kind::kSlice: {
        const Value target = eval(*expr.children[0]);
        auto part = [&](size_t i) { return expr.children[i] ? eval(*expr.children[i]) : Value(); };
        return get_slice(target, part(1), part(2), part(3), where(expr));
      }
      case Expr::Kind::kCall: {
        const Value callee = eval(*expr.children[0]);
        const CallArgs args = eval_arguments(expr, 1);
        if (callee.is_undefined()) {
          fail_at(where(expr), callee.undefined_what().empty() ? "called an undefined value" : callee.undefined_what() + " (called as a function)");
        }
        if (!callee.is_callable()) fail_at(where(expr), "'" + callee.type_name() + "' object is not callable");
        current_ = where(expr);  // errors raised inside a global (raise_exception, range) point at the call
        Value result = callee.as_callable()(args);
        check_size(result, where(expr));
        return result;
      }
      case Expr::Kind::kFilter: {
        const Value input = eval(*expr.children[0]);
        Value result = apply_filter(expr.name, input, eval_arguments(expr, 1), where(expr));
        check_size(result, where(expr));
        return result;
      }
      case Expr::Kind::kTest: {
        const Value input = eval(*expr.children[0]);
        const bool passed = apply_test(expr.name, input, eval_arguments(expr, 1), where(expr));
        return Value::boolean(passed != expr.negated);
      }
      case Expr::Kind::kUnary: {
        const Value operand = eval(*expr.children[0]);
        if (expr.name == "not") return Value::boolean(!operand.truthy());
        if (operand.is_float()) return Value::floating(expr.name == "-" ? -operand.as_number() : operand.as_number());
        if (operand.is_int() || operand.is_bool()) {
          if (expr.name == "+") return Value::integer(operand.as_int());
          if (operand.as_int() == INT64_MIN) fail_at(where(expr), "integer overflow");
          return Value::integer(-operand.as_int());
        }
        fail_at(where(expr), "bad operand type for unary " + expr.name + ": '" + operand.type_name() + "'");
      }
      case Expr::Kind::kAnd: {  // Python's and/or return an operand, not a bool
        Value left = eval(*expr.children[0]);
        return left.truthy() ? eval(*expr.children[1]) : left;
      }
      case Expr::Kind::kOr: {
        Value left = eval(*expr.children[0]);
        return left.truthy() ? left : eval(*expr.children[1]);
      }
      case Expr::Kind::kConditional:
        if (eval(*expr.children[0]).truthy()) return eval(*expr.children[1]);
        return expr.children[2] ? eval(*expr.children[2]) : Value::undefined("the conditional expression had no else");
      case Expr::Kind::kBinary: {
        Value result = binary(expr.name, eval(*expr.children[0]), eval(*expr.children[1]), where(expr));
        check_size(result, where(expr));
        return result;
      }
    }
    fail_at(where(expr), "unsupported expression");
  }

  // A {% filter %} head (parser: a chain of kFilter over a placeholder) applied to `input`.
  Value filter_chain(const Expr& filter, Value input) {
    if (filter.kind != Expr::Kind::kFilter) return input;
    Value inner = filter_chain(*filter.children[0], std::move(input));
    return apply_filter(filter.name, inner, eval_arguments(filter, 1), where(filter));
  }

  CallArgs eval_arguments(const Expr& expr, size_t first) {
    CallArgs args;
    for (size_t i = first; i < expr.children.size(); ++i) args.positional.push_back(eval(*expr.children[i]));
    for (const auto& [key, value] : expr.keyword_args) args.keyword.emplace_back(key, eval(*value));
    return args;
  }

  static bool numeric(const Value& v) { return v.is_number() || v.is_bool(); }

  [[noreturn]] static void operand_error(const std::string& op, const Value& a, const Value& b, const Location& at) {
    if (a.is_undefined() && !a.undefined_what().empty()) fail_at(at, a.undefined_what() + " (used with '" + op + "')");
    if (b.is_undefined() && !b.undefined_what().empty()) fail_at(at, b.undefined_what() + " (used with '" + op + "')");
    fail_at(at, "unsupported operand types for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
  }

  Value binary(const std::string& op, const Value& a, const Value& b, const Location& at) {
    if (op == "~") return Value::string(a.to_output() + b.to_output());
    if (op == "==") return Value::boolean(a.equals(b));
    if (op == "!=") return Value::boolean(!a.equals(b));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (b.is_string()) {
        if (!a.is_string()) fail_at(at, "'in <string>' requires a string on the left, not " + a.type_name());
        found = b.as_string().find(a.as_string()) != std::string::npos;
      } else if (b.is_list()) {
        for (const Value& item : b.as_list()) found = found || item.equals(a);
      } else if (b.is_dict()) {
        found = a.is_string() && b.as_dict().find(a.as_string()) != nullptr;
      } else if (!b.is_undefined()) {
        fail_at(at, "argument of type '" + b.type_name() + "' is not iterable");
      }
      return Value::boolean(op == "in" ? found : !found);
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int order = 0;
      if (numeric(a) && numeric(b)) {
        const double x = a.as_number(), y = b.as_number();
        if (a.is_float() || b.is_float()) order = x < y ? -1 : (x > y ? 1 : 0);
        else order = a.as_int() < b.as_int() ? -1 : (a.as_int() > b.as_int() ? 1 : 0);
        if (std::isnan(x) || std::isnan(y)) return Value::boolean(false);
      } else if (a.is_string() && b.is_string()) {
        order = a.as_string().compare(b.as_string());  // UTF-8 byte order is code point order
      } else {
        fail_at(at, "'" + op + "' not supported between '" + a.type_name() + "' and '" + b.type_name() + "'");
      }
      if (op == "<") return Value::boolean(order < 0);
      if (op == ">") return Value::boolean(order > 0);
      if (op == "<=") return Value::boolean(order <= 0);
      return Value::boolean(order >= 0);
    }
    if (op == "+") {
      if (a.is_markup() || b.is_markup()) {  // Markup + str escapes the plain side
        if (a.is_string() && b.is_string()) {
          return Value::markup((a.is_markup() ? a.as_string() : html_escape(a.as_string())) +
                               (b.is_markup() ? b.as_string() : html_escape(b.as_string())));
        }
      }
      if (a.is_string() && b.is_string()) return Value::string(a.as_string() + b.as_string());
      if (a.is_list() && b.is_list()) {
        ValueList items = a.as_list();
        items.insert(items.end(), b.as_list().begin(), b.as_list().end());
        return Value::list(std::move(items));
      }
    }
    if (op == "*") {  // sequence repetition
      const Value* sequence = a.is_string() || a.is_list() ? &a : (b.is_string() || b.is_list() ? &b : nullptr);
      const Value* count = sequence == &a ? &b : &a;
      if (sequence != nullptr && (count->is_int() || count->is_bool())) {
        const int64_t n = std::max<int64_t>(0, count->as_int());
        const size_t unit = sequence->is_string() ? sequence->as_string().size() : sequence->as_list().size();
        if (unit != 0 && static_cast<uint64_t>(n) > limits_.max_output_bytes / unit) fail_at(at, "repetition result too large");
        if (sequence->is_string()) {
          std::string out;
          for (int64_t i = 0; i < n; ++i) out += sequence->as_string();
          return Value::string(std::move(out));
        }
        ValueList items;
        for (int64_t i = 0; i < n; ++i) items.insert(items.end(), sequence->as_list().begin(), sequence->as_list().end());
        return Value::list(std::move(items));
      }
    }
    if (!numeric(a) || !numeric(b)) {
      if (op == "+" && a.is_string()) fail_at(at, "can only concatenate str (not \"" + b.type_name() + "\") to str");
      operand_error(op, a, b, at);
    }
    const bool integers = !a.is_float() && !b.is_float();
    if (op == "/") {
      if (b.as_number() == 0) fail_at(at, "division by zero");
      return Value::floating(a.as_number() / b.as_number());
    }
    if (integers) {
      const int64_t x = a.as_int(), y = b.as_int();
      int64_t r = 0;
      if (op == "+") {
        if (__builtin_add_overflow(x, y, &r)) fail_at(at, "integer overflow");
        return Value::integer(r);
      }
      if (op == "-") {
        if (__builtin_sub_overflow(x, y, &r)) fail_at(at, "integer overflow");
        return Value::integer(r);
      }
      if (op == "*") {
        if (__builtin_mul_overflow(x, y, &r)) fail_at(at, "integer overflow");
        return Value::integer(r);
      }
      if (op == "//" || op == "%") {  // Python floors toward negative infinity
        if (y == 0) fail_at(at, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) fail_at(at, "integer overflow");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        return Value::integer(op == "//" ? q : m);
      }
      if (op == "**") {
        if (y < 0) return Value::floating(std::pow(static_cast<double>(x), static_cast<double>(y)));
        int64_t result = 1;
        for (int64_t i = 0; i < y; ++i) {
          if (__builtin_mul_overflow(result, x, &result)) fail_at(at, "integer overflow");
          if (result == 0 || result == 1) break;
        }
        return Value::integer(result);
      }
    }
    const double x = a.as_number(), y = b.as_number();
    if (op == "+") return Value::floating(x + y);
    if (op == "-") return Value::floating(x - y);
    if (op == "*") return Value::floating(x * y);
    if (op == "**") return Value::floating(std::pow(x, y));
    if (op == "//" || op == "%") {
      if (y == 0) fail_at(at, "float division or modulo by zero");
      const double q = std::floor(x / y);
      return Value::floating(op == "//" ? q : x - q * y);
    }
    fail_at(at, "unknown operator '" + op + "'");
  }

  // ------------------------------------------------------------------------------------------
  // Names, globals, limits
  // ------------------------------------------------------------------------------------------

  Value lookup(const std::string& name) const {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      if (const Value* found = (*scope)->find(name)) return *found;
    }
    return Value::undefined("'" + name + "' is undefined");
  }

  void add_globals(ValueDict& globals) {
    globals.set("raise_exception", Value::callable("raise_exception", [this](const CallArgs& args) -> Value {
                  const std::string message = args.positional.empty() ? "" : args.positional[0].to_output();
                  throw TemplateError(current_.line, current_.column, message, /*raised=*/true);
                }));
    globals.set("strftime_now", Value::callable("strftime_now", [this](const CallArgs& args) {
                  if (args.positional.empty() || !args.positional[0].is_string()) {
                    fail_at(current_, "strftime_now expects a format string");
                  }
                  const std::tm now = clock_();
                  char buffer[512];
                  const size_t n = std::strftime(buffer, sizeof(buffer), args.positional[0].as_string().c_str(), &now);
                  return Value::string(std::string(buffer, n));
                }));
    globals.set("namespace", Value::callable("namespace", [](const CallArgs& args) {
                  ValueDict fields;
                  for (const Value& positional : args.positional) {  // namespace({'a': 1}) as dict(...) takes it
                    if (positional.is_dict()) {
                      for (const auto& [key, value] : positional.as_dict().entries) fields.set(key, value);
                    }
                  }
                  for (const auto& [key, value] : args.keyword) fields.set(key, value);
                  return Value::name_space(std::move(fields));
                }));
    globals.set("dict", Value::callable("dict", [](const CallArgs& args) {
                  ValueDict fields;
                  for (const auto& [key, value] : args.keyword) fields.set(key, value);
                  return Value::dict(std::move(fields));
                }));
    globals.set("range", Value::callable("range", [this](const CallArgs& args) {
                  int64_t start = 0, stop = 0, step = 1;
                  for (const Value& v : args.positional) {
                    if (!v.is_int() && !v.is_bool()) fail_at(current_, "range expects integers, got " + v.type_name());
                  }
                  if (args.positional.size() == 1) {
                    stop = args.positional[0].as_int();
                  } else if (args.positional.size() >= 2) {
                    start = args.positional[0].as_int();
                    stop = args.positional[1].as_int();
                    if (args.positional.size() >= 3) step = args.positional[2].as_int();
                  }
                  if (step == 0) fail_at(current_, "range() step must not be zero");
                  ValueList items;
                  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
                    if (static_cast<int64_t>(items.size()) >= limits_.max_range_items) {
                      fail_at(current_, "range() longer than " + std::to_string(limits_.max_range_items) + " items");
                    }
                    items.push_back(Value::integer(i));
                    if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
                  }
                  return Value::list(std::move(items));
                }));
  }

  void count_step(const Location& at) {
    current_ = at;
    if (++steps_ > limits_.max_steps) {
      fail_at(at, "template ran more than " + std::to_string(limits_.max_steps) + " steps (a runaway loop?)");
    }
  }

  void append(std::string& out, const std::string& text, const Location& at) {
    if (out.size() + text.size() > limits_.max_output_bytes) {
      fail_at(at, "output larger than " + std::to_string(limits_.max_output_bytes) + " bytes");
    }
    out += text;
  }

  void check_size(const Value& value, const Location& at) const {
    if (value.is_string() && value.as_string().size() > limits_.max_output_bytes) {
      fail_at(at, "string larger than " + std::to_string(limits_.max_output_bytes) + " bytes");
    }
  }

  struct ScopeGuard {
    explicit ScopeGuard(Evaluator& evaluator) : evaluator(evaluator) {
      evaluator.scopes_.push_back(std::make_shared<ValueDict>());
    }
    ~ScopeGuard() { evaluator.scopes_.pop_back(); }
    Evaluator& evaluator;
  };

  const RenderLimits& limits_;
  const Clock& clock_;
  std::vector<std::shared_ptr<ValueDict>> scopes_;  // [globals, ..., innermost]
  uint64_t steps_ = 0;
  int call_depth_ = 0;
  Location current_;  // the node or expression being evaluated, for errors raised by globals
};

}  // namespace

std::string render_template(const std::vector<Node>& program, const ValueDict& variables, const RenderLimits& limits,
                            const Clock& clock) {
  Evaluator evaluator(variables, limits, clock);
  return evaluator.render(program);
}

}  // namespace slimkv::chat
