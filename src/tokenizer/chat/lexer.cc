#include "tokenizer/chat/lexer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <tuple>

#include "tokenizer/utf8.h"

namespace slimkv::chat {
namespace {

// Maps byte offsets of the template to 1-based line and column for error messages.
class SourcePositions {
 public:
  explicit SourcePositions(std::string_view source) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\n') line_starts_.push_back(i + 1);
    }
  }
  std::pair<int, int> at(size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    return {static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }

 private:
  std::vector<size_t> line_starts_;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

void strip_trailing_space(std::string& text) {
  size_t end = text.size();
  while (end > 0 && is_space(text[end - 1])) --end;
  text.resize(end);
}

// A Python string literal's escapes, as Jinja2 decodes them (unknown escapes stay as written).
size_t read_string_literal(std::string_view source, size_t pos, std::string& out, const SourcePositions& positions) {
  const char quote = source[pos];
  size_t i = pos + 1;
  while (i < source.size() && source[i] != quote) {
    char c = source[i];
    if (c != '\\' || i + 1 >= source.size()) {
      out += c;
      ++i;
      continue;
    }
    const char e = source[i + 1];
    i += 2;
    auto hex_escape = [&](size_t digits) {
      uint32_t code = 0;
      for (size_t k = 0; k < digits; ++k) {
        if (i >= source.size() || !std::isxdigit(static_cast<unsigned char>(source[i]))) {
          const auto [line, column] = positions.at(i);
          throw TemplateError(line, column, "bad \\x/\\u escape in a string literal");
        }
        const char h = source[i++];
        code = code * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                                                                                                : (std::tolower(h) - 'a' + 10));
      }
      if (code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) code = 0xFFFD;
      utf8::append(static_cast<char32_t>(code), out);
    };
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '0': out += '\0'; break;
      case '\n': break;  // a backslash-newline continues the literal
      case 'x': hex_escape(2); break;
      case 'u': hex_escape(4); break;
      case 'U': hex_escape(8); break;
      default:
        out += '\\';
        out += e;
    }
  }
  if (i >= source.size()) {
    const auto [line, column] = positions.at(pos);
    throw TemplateError(line, column, "unterminated string literal");
  }
  return i + 1;
}

// Tokenizes the inside of a tag from `pos` up to its closing `close` ("}}" or "%}"), which must
// come outside brackets. Returns the offset just past the closing marker; `strip_after` tells
// whether the tag ended with `-}}` / `-%}`.
size_t tokenize_tag(std::string_view source, size_t pos, std::string_view close, size_t tag_start,
                    const SourcePositions& positions, std::vector<Token>& tokens, bool& strip_after) {
  static constexpr std::string_view kTwoCharOperators[] = {"**", "//", "==", "!=", "<=", ">="};
  int brace_depth = 0;
  size_t i = pos;
  while (true) {
    while (i < source.size() && is_space(source[i])) ++i;
    if (i >= source.size()) {
      const auto [line, column] = positions.at(tag_start);
      throw TemplateError(line, column, "unterminated tag: expected '" + std::string(close) + "'");
    }
    const auto [line, column] = positions.at(i);
    Token token;
    token.line = line;
    token.column = column;
    const std::string_view rest = source.substr(i);
    if (brace_depth == 0) {
      if (rest.substr(0, 1) == "-" && rest.substr(1, 2) == close) {
        strip_after = true;
        token.kind = Token::Kind::kEnd;
        tokens.push_back(token);
        return i + 3;
      }
      if (rest.substr(0, 1) == "+" && rest.substr(1, 2) == close) {  // `+%}`: keep the newline
        token.kind = Token::Kind::kEnd;
        tokens.push_back(token);
        return i + 3;
      }
      if (rest.substr(0, 2) == close) {
        token.kind = Token::Kind::kEnd;
        tokens.push_back(token);
        return i + 2;
      }
    }
    const char c = source[i];
    if (is_name_start(c)) {
      size_t end = i;
      while (end < source.size() && is_name_char(source[end])) ++end;
      token.kind = Token::Kind::kName;
      token.text = std::string(source.substr(i, end - i));
      i = end;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t end = i;
      while (end < source.size() && (std::isdigit(static_cast<unsigned char>(source[end])) || source[end] == '_')) ++end;
      bool is_float = false;
      if (end + 1 < source.size() && source[end] == '.' && std::isdigit(static_cast<unsigned char>(source[end + 1]))) {
        is_float = true;
        ++end;
        while (end < source.size() && std::isdigit(static_cast<unsigned char>(source[end]))) ++end;
      }
      if (end < source.size() && (source[end] == 'e' || source[end] == 'E')) {
        size_t exp = end + 1;
        if (exp < source.size() && (source[exp] == '+' || source[exp] == '-')) ++exp;
        if (exp < source.size() && std::isdigit(static_cast<unsigned char>(source[exp]))) {
          is_float = true;
          end = exp;
          while (end < source.size() && std::isdigit(static_cast<unsigned char>(source[end]))) ++end;
        }
      }
      std::string digits;
      for (size_t k = i; k < end; ++k) {
        if (source[k] != '_') digits += source[k];
      }
      token.text = digits;
      if (is_float) {
        token.kind = Token::Kind::kFloat;
        token.float_value = std::strtod(digits.c_str(), nullptr);
      } else {
        token.kind = Token::Kind::kInt;
        errno = 0;
        const unsigned long long parsed = std::strtoull(digits.c_str(), nullptr, 10);
        if (errno != 0 || parsed > static_cast<unsigned long long>(INT64_MAX)) {
          throw TemplateError(line, column, "integer literal " + digits + " does not fit in 64 bits");
        }
        token.int_value = static_cast<int64_t>(parsed);
      }
      i = end;
    } else if (c == '\'' || c == '"') {
      token.kind = Token::Kind::kString;
      i = read_string_literal(source, i, token.text, positions);
    } else {
      token.kind = Token::Kind::kOperator;
      bool matched = false;
      for (const std::string_view op : kTwoCharOperators) {
        if (rest.substr(0, 2) == op) {
          token.text = std::string(op);
          i += 2;
          matched = true;
          break;
        }
      }
      if (!matched) {
        if (std::string_view("+-*/%~<>=()[]{},.:|").find(c) == std::string_view::npos) {
          std::string shown = static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f
                                  ? "byte " + std::to_string(static_cast<unsigned char>(c))
                                  : "'" + std::string(1, c) + "'";
          throw TemplateError(line, column, "unexpected character " + shown + " in a tag");
        }
        token.text = std::string(1, c);
        ++i;
        if (c == '{') ++brace_depth;
        if (c == '}' && brace_depth > 0) --brace_depth;
      }
    }
    tokens.push_back(std::move(token));
  }
}

}  // namespace

std::vector<TemplatePiece> split_template(std::string_view source) {
  const SourcePositions positions(source);
  std::vector<TemplatePiece> pieces;
  bool strip_next_text = false;  // the previous tag ended with `-`
  size_t pos = 0;

  auto emit_text = [&](size_t begin, size_t end, bool strip_trailing) {
    std::string text(source.substr(begin, end - begin));
    if (strip_next_text) {
      size_t first = 0;
      while (first < text.size() && is_space(text[first])) ++first;
      text.erase(0, first);
    }
    if (strip_trailing) strip_trailing_space(text);
    strip_next_text = false;
    if (text.empty()) return;
    TemplatePiece piece;
    piece.kind = TemplatePiece::Kind::kText;
    piece.text = std::move(text);
    std::tie(piece.line, piece.column) = positions.at(begin);
    pieces.push_back(std::move(piece));
  };

  while (pos < source.size()) {
    size_t tag = source.find('{', pos);
    while (tag != std::string_view::npos && tag + 1 < source.size() && source[tag + 1] != '{' &&
           source[tag + 1] != '%' && source[tag + 1] != '#') {
      tag = source.find('{', tag + 1);
    }
    if (tag == std::string_view::npos || tag + 1 >= source.size()) {
      emit_text(pos, source.size(), false);
      break;
    }
    const char kind = source[tag + 1];
    const char modifier = tag + 2 < source.size() ? source[tag + 2] : '\0';
    size_t text_end = tag;
    // lstrip_blocks: a block or comment tag that only spaces/tabs precede on its line takes them away.
    if ((kind == '%' || kind == '#') && modifier != '+' && modifier != '-') {
      size_t p = tag;
      while (p > pos && (source[p - 1] == ' ' || source[p - 1] == '\t')) --p;
      if (p == 0 || source[p - 1] == '\n') text_end = p;
    }
    emit_text(pos, text_end, modifier == '-');
    const auto [line, column] = positions.at(tag);
    const size_t inner = tag + 2 + ((modifier == '-' || modifier == '+') ? 1 : 0);
    bool strip_after = false;
    size_t after = 0;
    if (kind == '#') {
      const size_t end = source.find("#}", inner);
      if (end == std::string_view::npos) throw TemplateError(line, column, "unterminated comment: expected '#}'");
      strip_after = end > inner && source[end - 1] == '-';
      after = end + 2;
    } else {
      TemplatePiece piece;
      piece.kind = kind == '{' ? TemplatePiece::Kind::kExpression : TemplatePiece::Kind::kStatement;
      piece.line = line;
      piece.column = column;
      after = tokenize_tag(source, inner, kind == '{' ? "}}" : "%}", tag, positions, piece.tokens, strip_after);
      // {% raw %}: everything up to {% endraw %} is text.
      const bool is_raw = piece.kind == TemplatePiece::Kind::kStatement && piece.tokens.size() == 2 &&
                          piece.tokens[0].kind == Token::Kind::kName && piece.tokens[0].text == "raw";
      if (is_raw) {
        size_t search = after;
        while (true) {
          const size_t open = source.find("{%", search);
          if (open == std::string_view::npos) throw TemplateError(line, column, "unterminated {% raw %}: expected '{% endraw %}'");
          size_t k = open + 2;
          const bool strip_before = k < source.size() && source[k] == '-';
          if (k < source.size() && (source[k] == '-' || source[k] == '+')) ++k;
          while (k < source.size() && is_space(source[k])) ++k;
          if (source.substr(k, 6) != "endraw") {
            search = open + 2;
            continue;
          }
          k += 6;
          while (k < source.size() && is_space(source[k])) ++k;
          bool strip_raw_after = false;
          if (k < source.size() && source[k] == '-') {
            strip_raw_after = true;
            ++k;
          }
          if (source.substr(k, 2) != "%}") throw TemplateError(line, column, "malformed {% endraw %}");
          if (strip_after) strip_next_text = true;
          emit_text(after, open, strip_before);
          strip_after = strip_raw_after;
          after = k + 2;
          break;
        }
      } else {
        pieces.push_back(std::move(piece));
      }
    }
    pos = after;
    strip_next_text = strip_after;
    // trim_blocks: the first newline after a block or comment tag is removed.
    if (!strip_after && kind != '{' && source[after - 3] != '+') {
      if (source.substr(pos, 2) == "\r\n") pos += 2;
      else if (pos < source.size() && source[pos] == '\n') ++pos;
    }
  }
  return pieces;
}

}  // namespace slimkv::chat
