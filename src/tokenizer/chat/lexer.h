// Splits a Jinja2 template into text, {{ expression }} and {% statement %} pieces, applying the
// whitespace rules transformers renders with (trim_blocks=True, lstrip_blocks=True, plus the `-`
// and `+` markers), and splits the inside of each tag into expression tokens.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace slimkv::chat {

// Any error in a template: its place (1-based line and column of the template text) and what was
// wrong. `raised` marks an error the template asked for with raise_exception(): its message is the
// template's own. Thrown inside the interpreter; ChatTemplate turns it into a Status.
struct TemplateError : std::runtime_error {
  TemplateError(int line, int column, const std::string& message, bool raised = false)
      : std::runtime_error(message), line(line), column(column), raised(raised) {}
  int line;
  int column;
  bool raised;
};

struct Token {
  enum class Kind { kName, kString, kInt, kFloat, kOperator, kEnd };
  Kind kind = Kind::kEnd;
  std::string text;  // the name, the operator, or the string literal's decoded value
  int64_t int_value = 0;
  double float_value = 0;
  int line = 0;
  int column = 0;
};

struct TemplatePiece {
  enum class Kind { kText, kExpression, kStatement };
  Kind kind = Kind::kText;
  std::string text;           // kText: the text as it renders, whitespace rules applied
  std::vector<Token> tokens;  // kExpression / kStatement: the tag's tokens, ending with kEnd
  int line = 0;
  int column = 0;
};

// The pieces of `source` in order; comments are dropped. Throws TemplateError for an unterminated
// tag, comment or string, or a character no expression may hold.
std::vector<TemplatePiece> split_template(std::string_view source);

}  // namespace slimkv::chat
