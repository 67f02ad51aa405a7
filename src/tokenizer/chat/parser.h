// Parses a template's pieces (lexer.h) into statements (ast.h): the Jinja2 statements chat
// templates use (if/elif/else, for with `if` filter and else, set, set blocks, macro, break,
// continue, generation) and Jinja2's expression grammar with its operator precedence.
#pragma once

#include <string_view>
#include <vector>

#include "tokenizer/chat/ast.h"

namespace slimkv::chat {

// Throws TemplateError naming the line, column and what was expected (an unknown tag, a missing
// {% endfor %}, an unexpected token, nesting deeper than kMaxParseDepth).
std::vector<Node> parse_template(std::string_view source);

inline constexpr int kMaxParseDepth = 200;

}  // namespace slimkv::chat
