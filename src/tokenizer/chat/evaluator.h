// Runs a parsed template (parser.h) over variables and returns the text, as Jinja2 renders it for
// transformers: Python semantics for values and operators, Jinja2's scoping (a for loop's body
// has its own scope; `if` has none; a namespace() carries values out of loops), loop variables,
// macros, and the globals transformers adds (raise_exception, strftime_now) besides Jinja2's
// (namespace, range, dict). Work is bounded: a runaway loop, deep recursion or huge output stops
// with an error instead of running on.
#pragma once

#include <cstdint>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "tokenizer/chat/ast.h"
#include "tokenizer/chat/value.h"

namespace slimkv::chat {

struct RenderLimits {
  uint64_t max_steps = 1'000'000;  // statements, expressions and loop iterations (real templates: ~10^4)
  size_t max_output_bytes = 64u << 20;  // the rendered text (and any one string built)
  int max_call_depth = 64;              // nested macro calls
  int64_t max_range_items = 1'000'000;  // range(n)
};

// The local time strftime_now() formats; tests pass a fixed one.
using Clock = std::function<std::tm()>;

// Throws TemplateError (lexer.h) on any runtime error; `raised` is set for raise_exception().
std::string render_template(const std::vector<Node>& program, const ValueDict& variables, const RenderLimits& limits,
                            const Clock& clock);

}  // namespace slimkv::chat
