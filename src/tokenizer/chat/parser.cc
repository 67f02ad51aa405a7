#include "tokenizer/chat/parser.h"

#include <initializer_list>

#include "tokenizer/chat/builtins.h"
#include "tokenizer/chat/lexer.h"

namespace slimkv::chat {
namespace {

std::string describe(const Token& token) {
  switch (token.kind) {
    case Token::Kind::kEnd: return "the end of the tag";
    case Token::Kind::kString: return "a string";
    case Token::Kind::kInt:
    case Token::Kind::kFloat: return "number " + token.text;
    default: return "'" + token.text + "'";
  }
}

// The tokens of one tag, read by Jinja2's expression grammar (lowest precedence first):
// conditional, or, and, not, comparisons and `in`, + -, ~, * / // %, **, unary - +, then a
// primary with its postfixes (.attr, [index], [a:b:c], (call)), filters `|f(...)` and tests `is`.
class ExpressionParser {
 public:
  explicit ExpressionParser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  const Token& peek(size_t ahead = 0) const {
    const size_t i = pos_ + ahead;
    return i < tokens_.size() ? tokens_[i] : tokens_.back();
  }
  bool at_end() const { return peek().kind == Token::Kind::kEnd; }
  bool is_operator(std::string_view op, size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::kOperator && peek(ahead).text == op;
  }
  bool is_name(std::string_view name, size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::kName && peek(ahead).text == name;
  }
  const Token& next() {
    const Token& token = peek();
    if (pos_ < tokens_.size() - 1) ++pos_;
    return token;
  }
  [[noreturn]] void fail(const std::string& expected) const {
    throw TemplateError(peek().line, peek().column, "expected " + expected + ", found " + describe(peek()));
  }
  void expect_operator(std::string_view op) {
    if (!is_operator(op)) fail("'" + std::string(op) + "'");
    next();
  }
  std::string expect_name(const std::string& what) {
    if (peek().kind != Token::Kind::kName) fail(what);
    return next().text;
  }
  void expect_end() {
    if (!at_end()) fail("the end of the tag");
  }

  ExprPtr parse_expression() {
    DepthGuard guard(*this);
    ExprPtr value = parse_or();
    while (is_name("if")) {
      ExprPtr node = make(Expr::Kind::kConditional, peek());
      next();
      ExprPtr condition = parse_or();
      ExprPtr otherwise;
      if (is_name("else")) {
        next();
        otherwise = parse_expression();
      }
      node->children.push_back(std::move(condition));
      node->children.push_back(std::move(value));
      node->children.push_back(std::move(otherwise));
      value = std::move(node);
    }
    return value;
  }

  // The `name(args) | name2` of {% filter ... %}: filters applied to a placeholder input (a
  // literal none, replaced by the block's text when it runs).
  ExprPtr parse_filter_block_head() {
    ExprPtr placeholder = make(Expr::Kind::kLiteral, peek());
    placeholder->literal = Value::none();
    ExprPtr node = std::move(placeholder);
    do {
      const Token& at = peek();
      if (is_operator("|")) next();
      ExprPtr filter = make(Expr::Kind::kFilter, at);
      filter->name = expect_name("a filter name after 'filter'");
      if (!is_known_filter(filter->name)) throw TemplateError(at.line, at.column, unknown_filter_message(filter->name));
      filter->children.push_back(std::move(node));
      if (is_operator("(")) parse_call_arguments(*filter);
      node = std::move(filter);
    } while (is_operator("|"));
    return node;
  }

  // `a, b` (for targets and `set a, b = ...`) or one expression; `with_condition` false stops
  // before `if` (the for statement's filter).
  ExprPtr parse_tuple(bool with_condition) {
    const Token& first = peek();
    ExprPtr item = with_condition ? parse_expression() : parse_or();
    if (!is_operator(",")) return item;
    ExprPtr tuple = make(Expr::Kind::kTuple, first);
    tuple->children.push_back(std::move(item));
    while (is_operator(",")) {
      next();
      if (at_end() || is_operator(")") || is_operator("=") || is_name("in")) break;
      tuple->children.push_back(with_condition ? parse_expression() : parse_or());
    }
    return tuple;
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(ExpressionParser& parser) : parser(parser) {
      if (++parser.depth_ > kMaxParseDepth) {
        throw TemplateError(parser.peek().line, parser.peek().column,
                            "expression nested deeper than " + std::to_string(kMaxParseDepth) + " levels");
      }
    }
    ~DepthGuard() { --parser.depth_; }
    ExpressionParser& parser;
  };

  static ExprPtr make(Expr::Kind kind, const Token& at) {
    auto node = std::make_unique<Expr>();
    node->kind = kind;
    node->line = at.line;
    node->column = at.column;
    return node;
  }
  static ExprPtr binary(Expr::Kind kind, const Token& at, std::string op, ExprPtr left, ExprPtr right) {
    ExprPtr node = make(kind, at);
    node->name = std::move(op);
    node->children.push_back(std::move(left));
    node->children.push_back(std::move(right));
    return node;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const Token& at = next();
      left = binary(Expr::Kind::kOr, at, "or", std::move(left), parse_and());
    }
    return left;
  }
  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const Token& at = next();
      left = binary(Expr::Kind::kAnd, at, "and", std::move(left), parse_not());
    }
    return left;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      ExprPtr node = make(Expr::Kind::kUnary, next());
      node->name = "not";
      node->children.push_back(parse_not());
      return node;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr left = parse_add();
    while (true) {
      const Token& at = peek();
      std::string op;
      if (at.kind == Token::Kind::kOperator &&
          (at.text == "==" || at.text == "!=" || at.text == "<" || at.text == ">" || at.text == "<=" || at.text == ">=")) {
        op = at.text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && is_name("in", 1)) {
        op = "not in";
        next();
        next();
      } else {
        return left;
      }
      left = binary(Expr::Kind::kBinary, at, op, std::move(left), parse_add());
    }
  }
  ExprPtr parse_add() {
    ExprPtr left = parse_concat();
    while (is_operator("+") || is_operator("-")) {
      const Token& at = next();
      left = binary(Expr::Kind::kBinary, at, at.text, std::move(left), parse_concat());
    }
    return left;
  }
  ExprPtr parse_concat() {
    ExprPtr left = parse_multiply();
    while (is_operator("~")) {
      const Token& at = next();
      left = binary(Expr::Kind::kBinary, at, "~", std::move(left), parse_multiply());
    }
    return left;
  }
  ExprPtr parse_multiply() {
    ExprPtr left = parse_power();
    while (is_operator("*") || is_operator("/") || is_operator("//") || is_operator("%")) {
      const Token& at = next();
      left = binary(Expr::Kind::kBinary, at, at.text, std::move(left), parse_power());
    }
    return left;
  }
  ExprPtr parse_power() {
    ExprPtr left = parse_unary();
    while (is_operator("**")) {
      const Token& at = next();
      left = binary(Expr::Kind::kBinary, at, "**", std::move(left), parse_unary());
    }
    return left;
  }
  // As in Jinja2, filters bind to the whole signed operand: `-1 | abs` is abs(-1).
  ExprPtr parse_unary(bool with_filters = true) {
    DepthGuard guard(*this);
    ExprPtr node;
    if (is_operator("-") || is_operator("+")) {
      node = make(Expr::Kind::kUnary, peek());
      node->name = next().text;
      node->children.push_back(parse_unary(false));
    } else {
      node = parse_postfix(parse_primary());
    }
    return with_filters ? parse_filters_and_tests(std::move(node)) : std::move(node);
  }

  ExprPtr parse_primary() {
    DepthGuard guard(*this);
    const Token& token = peek();
    switch (token.kind) {
      case Token::Kind::kName: {
        next();
        ExprPtr node = make(Expr::Kind::kLiteral, token);
        if (token.text == "true" || token.text == "True") node->literal = Value::boolean(true);
        else if (token.text == "false" || token.text == "False") node->literal = Value::boolean(false);
        else if (token.text == "none" || token.text == "None") node->literal = Value::none();
        else {
          node->kind = Expr::Kind::kName;
          node->name = token.text;
        }
        return node;
      }
      case Token::Kind::kString: {
        std::string text;
        while (peek().kind == Token::Kind::kString) text += next().text;  // "a" "b" is "ab"
        ExprPtr node = make(Expr::Kind::kLiteral, token);
        node->literal = Value::string(std::move(text));
        return node;
      }
      case Token::Kind::kInt: {
        next();
        ExprPtr node = make(Expr::Kind::kLiteral, token);
        node->literal = Value::integer(token.int_value);
        return node;
      }
      case Token::Kind::kFloat: {
        next();
        ExprPtr node = make(Expr::Kind::kLiteral, token);
        node->literal = Value::floating(token.float_value);
        return node;
      }
      case Token::Kind::kOperator:
        if (token.text == "(") {
          next();
          if (is_operator(")")) {  // () is an empty tuple
            next();
            return make(Expr::Kind::kTuple, token);
          }
          ExprPtr inner = parse_tuple(true);
          expect_operator(")");
          return inner;
        }
        if (token.text == "[") {
          next();
          ExprPtr list = make(Expr::Kind::kList, token);
          while (!is_operator("]")) {
            list->children.push_back(parse_expression());
            if (!is_operator(",")) break;
            next();
          }
          expect_operator("]");
          return list;
        }
        if (token.text == "{") {
          next();
          ExprPtr dict = make(Expr::Kind::kDict, token);
          while (!is_operator("}")) {
            dict->children.push_back(parse_expression());
            expect_operator(":");
            dict->children.push_back(parse_expression());
            if (!is_operator(",")) break;
            next();
          }
          expect_operator("}");
          return dict;
        }
        break;
      default: break;
    }
    fail("an expression");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      const Token& at = peek();
      if (is_operator(".")) {
        next();
        ExprPtr attribute = make(Expr::Kind::kAttribute, at);
        if (peek().kind == Token::Kind::kInt) {  // foo.0 is foo[0]
          attribute->kind = Expr::Kind::kSubscript;
          attribute->children.push_back(std::move(node));
          ExprPtr index = make(Expr::Kind::kLiteral, peek());
          index->literal = Value::integer(next().int_value);
          attribute->children.push_back(std::move(index));
        } else {
          attribute->name = expect_name("an attribute name after '.'");
          attribute->children.push_back(std::move(node));
        }
        node = std::move(attribute);
      } else if (is_operator("[")) {
        next();
        node = parse_subscript(std::move(node), at);
      } else if (is_operator("(")) {
        ExprPtr call = make(Expr::Kind::kCall, at);
        call->children.push_back(std::move(node));
        parse_call_arguments(*call);
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, const Token& at) {
    ExprPtr parts[3];
    bool is_slice = false;
    for (int part = 0; part < 3; ++part) {
      if (!is_operator(":") && !is_operator("]")) parts[part] = parse_expression();
      if (part < 2 && is_operator(":")) {
        next();
        is_slice = true;
        continue;
      }
      break;
    }
    expect_operator("]");
    ExprPtr node = make(is_slice ? Expr::Kind::kSlice : Expr::Kind::kSubscript, at);
    node->children.push_back(std::move(target));
    if (!is_slice) {
      if (!parts[0]) throw TemplateError(at.line, at.column, "expected an index inside '[]'");
      node->children.push_back(std::move(parts[0]));
    } else {
      for (auto& part : parts) node->children.push_back(std::move(part));
    }
    return node;
  }

  // `(a, b, key=value)` into node.children (after what is there) and node.keyword_args.
  void parse_call_arguments(Expr& node) {
    expect_operator("(");
    while (!is_operator(")")) {
      if (peek().kind == Token::Kind::kName && is_operator("=", 1)) {
        std::string key = next().text;
        next();
        node.keyword_args.emplace_back(std::move(key), parse_expression());
      } else {
        if (!node.keyword_args.empty()) fail("a keyword argument (positional arguments come first)");
        node.children.push_back(parse_expression());
      }
      if (!is_operator(",")) break;
      next();
    }
    expect_operator(")");
  }

  ExprPtr parse_filters_and_tests(ExprPtr node) {
    while (true) {
      const Token& at = peek();
      if (is_operator("|")) {
        next();
        ExprPtr filter = make(Expr::Kind::kFilter, at);
        filter->name = expect_name("a filter name after '|'");
        if (!is_known_filter(filter->name)) throw TemplateError(at.line, at.column, unknown_filter_message(filter->name));
        filter->children.push_back(std::move(node));
        if (is_operator("(")) parse_call_arguments(*filter);
        node = std::move(filter);
      } else if (is_name("is")) {
        next();
        ExprPtr test = make(Expr::Kind::kTest, at);
        if (is_name("not")) {
          next();
          test->negated = true;
        }
        test->name = expect_name("a test name after 'is'");
        if (!is_known_test(test->name)) throw TemplateError(at.line, at.column, unknown_test_message(test->name));
        test->children.push_back(std::move(node));
        if (is_operator("(")) {
          parse_call_arguments(*test);
        } else if (starts_test_argument()) {
          test->children.push_back(parse_postfix(parse_primary()));  // `is equalto 'x'`
        }
        node = std::move(test);
      } else {
        return node;
      }
    }
  }

  bool starts_test_argument() const {
    const Token& token = peek();
    if (token.kind == Token::Kind::kString || token.kind == Token::Kind::kInt || token.kind == Token::Kind::kFloat) return true;
    if (token.kind == Token::Kind::kOperator) return token.text == "[" || token.text == "{";
    if (token.kind != Token::Kind::kName) return false;
    for (const char* keyword : {"else", "or", "and", "if", "in", "not", "is"}) {
      if (token.text == keyword) return false;
    }
    return true;
  }

  const std::vector<Token>& tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
};

// Reads the statement structure over the template's pieces.
class TemplateParser {
 public:
  explicit TemplateParser(std::vector<TemplatePiece> pieces) : pieces_(std::move(pieces)) {}

  std::vector<Node> parse() {
    std::vector<Node> body;
    const std::string end = parse_body(body, {});
    (void)end;
    return body;
  }

 private:
  // Parses nodes into `body` until a statement whose keyword is in `terminators` (returned, its
  // piece left at index_ so the caller reads the rest of it) or the end of the template ("").
  std::string parse_body(std::vector<Node>& body, std::initializer_list<const char*> terminators,
                         const char* open_tag = nullptr, const TemplatePiece* opener = nullptr) {
    if (++depth_ > kMaxParseDepth) {
      const TemplatePiece& at = pieces_[index_ > 0 ? index_ - 1 : 0];
      throw TemplateError(at.line, at.column, "statements nested deeper than " + std::to_string(kMaxParseDepth) + " levels");
    }
    while (index_ < pieces_.size()) {
      const TemplatePiece& piece = pieces_[index_];
      if (piece.kind == TemplatePiece::Kind::kText) {
        Node node;
        node.kind = Node::Kind::kText;
        node.line = piece.line;
        node.column = piece.column;
        node.text = piece.text;
        body.push_back(std::move(node));
        ++index_;
        continue;
      }
      ExpressionParser tokens(piece.tokens);
      if (piece.kind == TemplatePiece::Kind::kExpression) {
        Node node;
        node.kind = Node::Kind::kOutput;
        node.line = piece.line;
        node.column = piece.column;
        if (tokens.at_end()) tokens.fail("an expression inside '{{ }}'");
        node.expr = tokens.parse_tuple(true);
        tokens.expect_end();
        body.push_back(std::move(node));
        ++index_;
        continue;
      }
      const std::string keyword = tokens.expect_name("a statement name after '{%'");
      for (const char* terminator : terminators) {
        if (keyword == terminator) {
          --depth_;
          return keyword;
        }
      }
      ++index_;
      parse_statement(keyword, piece, tokens, body);
    }
    if (open_tag != nullptr) {
      std::string expected;
      for (const char* terminator : terminators) {
        expected += expected.empty() ? "" : " or ";
        expected += std::string("'{% ") + terminator + " %}'";
      }
      throw TemplateError(opener->line, opener->column,
                          std::string("unclosed '{% ") + open_tag + " %}': expected " + expected + " before the end of the template");
    }
    --depth_;
    return "";
  }

  void parse_statement(const std::string& keyword, const TemplatePiece& piece, ExpressionParser& tokens,
                       std::vector<Node>& body) {
    Node node;
    node.line = piece.line;
    node.column = piece.column;
    if (keyword == "if") {
      node.kind = Node::Kind::kIf;
      node.conditions.push_back(tokens.parse_expression());
      tokens.expect_end();
      while (true) {
        node.bodies.emplace_back();
        const std::string end = parse_body(node.bodies.back(), {"elif", "else", "endif"}, "if", &piece);
        const TemplatePiece& closer = pieces_[index_++];
        ExpressionParser close_tokens(closer.tokens);
        close_tokens.next();
        if (end == "elif") {
          node.conditions.push_back(close_tokens.parse_expression());
          close_tokens.expect_end();
          continue;
        }
        close_tokens.expect_end();
        if (end == "else") {
          node.bodies.emplace_back();
          parse_body(node.bodies.back(), {"endif"}, "if", &piece);
          ExpressionParser endif_tokens(pieces_[index_++].tokens);
          endif_tokens.next();
          endif_tokens.expect_end();
        }
        break;
      }
    } else if (keyword == "for") {
      node.kind = Node::Kind::kFor;
      do {
        node.targets.push_back(tokens.expect_name("a loop variable name"));
        if (!tokens.is_operator(",")) break;
        tokens.next();
      } while (true);
      if (!tokens.is_name("in")) tokens.fail("'in'");
      tokens.next();
      node.expr = tokens.parse_tuple(false);
      if (tokens.is_name("if")) {
        tokens.next();
        node.filter = tokens.parse_expression();
      }
      if (tokens.is_name("recursive")) {
        throw TemplateError(piece.line, piece.column, "recursive for loops are not supported");
      }
      tokens.expect_end();
      node.bodies.emplace_back();
      ++loop_depth_;
      const std::string end = parse_body(node.bodies.back(), {"else", "endfor"}, "for", &piece);
      --loop_depth_;
      ExpressionParser close_tokens(pieces_[index_++].tokens);
      close_tokens.next();
      close_tokens.expect_end();
      if (end == "else") {
        node.bodies.emplace_back();
        parse_body(node.bodies.back(), {"endfor"}, "for", &piece);
        ExpressionParser endfor_tokens(pieces_[index_++].tokens);
        endfor_tokens.next();
        endfor_tokens.expect_end();
      }
    } else if (keyword == "set") {
      node.targets.push_back(tokens.expect_name("a variable name after 'set'"));
      if (tokens.is_operator(".")) {
        tokens.next();
        node.attribute = tokens.expect_name("an attribute name");
      } else {
        while (tokens.is_operator(",")) {
          tokens.next();
          node.targets.push_back(tokens.expect_name("a variable name"));
        }
      }
      if (tokens.is_operator("=")) {
        tokens.next();
        node.kind = Node::Kind::kSet;
        node.expr = tokens.parse_tuple(true);
        tokens.expect_end();
      } else {
        tokens.expect_end();
        if (!node.attribute.empty() || node.targets.size() != 1) tokens.fail("'='");
        node.kind = Node::Kind::kSetBlock;
        node.bodies.emplace_back();
        parse_body(node.bodies.back(), {"endset"}, "set", &piece);
        ExpressionParser close_tokens(pieces_[index_++].tokens);
        close_tokens.next();
        close_tokens.expect_end();
      }
    } else if (keyword == "macro") {
      node.kind = Node::Kind::kMacro;
      node.name = tokens.expect_name("a macro name");
      tokens.expect_operator("(");
      while (!tokens.is_operator(")")) {
        node.params.push_back(tokens.expect_name("a parameter name"));
        ExprPtr default_value;
        if (tokens.is_operator("=")) {
          tokens.next();
          default_value = tokens.parse_expression();
        }
        node.defaults.push_back(std::move(default_value));
        if (!tokens.is_operator(",")) break;
        tokens.next();
      }
      tokens.expect_operator(")");
      tokens.expect_end();
      node.bodies.emplace_back();
      const int enclosing_loops = loop_depth_;
      loop_depth_ = 0;  // a macro body is not inside the loop it is defined in
      parse_body(node.bodies.back(), {"endmacro"}, "macro", &piece);
      loop_depth_ = enclosing_loops;
      ExpressionParser close_tokens(pieces_[index_++].tokens);
      close_tokens.next();
      close_tokens.expect_end();
    } else if (keyword == "filter") {
      // {% filter trim %}...{% endfilter %}: the body's text goes through the filter.
      node.kind = Node::Kind::kFilterBlock;
      node.expr = tokens.parse_filter_block_head();
      tokens.expect_end();
      node.bodies.emplace_back();
      parse_body(node.bodies.back(), {"endfilter"}, "filter", &piece);
      ExpressionParser close_tokens(pieces_[index_++].tokens);
      close_tokens.next();
      close_tokens.expect_end();
    } else if (keyword == "break" || keyword == "continue") {
      node.kind = keyword == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      if (loop_depth_ == 0) throw TemplateError(piece.line, piece.column, "'{% " + keyword + " %}' outside a for loop");
      tokens.expect_end();
    } else if (keyword == "generation") {
      // transformers' {% generation %} marks assistant text for masks; it renders its body as is.
      tokens.expect_end();
      parse_body(body, {"endgeneration"}, "generation", &piece);
      ExpressionParser close_tokens(pieces_[index_++].tokens);
      close_tokens.next();
      close_tokens.expect_end();
      return;
    } else if (keyword == "elif" || keyword == "else" || keyword.rfind("end", 0) == 0) {
      throw TemplateError(piece.line, piece.column, "unexpected '{% " + keyword + " %}' with no open block it could close");
    } else {
      throw TemplateError(piece.line, piece.column,
                          "unknown statement '{% " + keyword +
                              " %}' (supported: if, elif, else, for, set, macro, filter, break, continue, raw, generation)");
    }
    body.push_back(std::move(node));
  }

  std::vector<TemplatePiece> pieces_;
  size_t index_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;  // for bodies around the statement being parsed
};

}  // namespace

std::vector<Node> parse_template(std::string_view source) {
  TemplateParser parser(split_template(source));
  return parser.parse();
}

}  // namespace slimkv::chat
