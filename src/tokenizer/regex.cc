#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/utf8.h"

namespace slimkv {
namespace {

// Oniguruma's Unicode \s (White_Space), written as the inside of a character class.
constexpr std::string_view kSpaceClass =
    "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";
// Oniguruma's Unicode \w: Letter | Mark | Decimal_Number | Connector_Punctuation.
constexpr std::string_view kWordClass = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
// Ruby's \h: a hexadecimal digit.
constexpr std::string_view kHexClass = "0-9a-fA-F";

// Backtracking limits: a pattern from an untrusted file must not hang the engine.
constexpr uint32_t kMatchLimit = 10'000'000;
constexpr uint32_t kDepthLimit = 100'000;

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

}  // namespace

struct Regex::Compiled {
  pcre2_code* code = nullptr;
  pcre2_match_context* match_context = nullptr;
  ~Compiled() {
    pcre2_match_context_free(match_context);
    pcre2_code_free(code);
  }
};

Regex::Regex(std::unique_ptr<Compiled> compiled) : compiled_(std::move(compiled)) {}
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
Regex::~Regex() = default;

std::string Regex::translate_oniguruma(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  int class_depth = 0;  // inside [...]; Oniguruma allows nested classes
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      const bool in_class = class_depth > 0;
      auto emit_class = [&](std::string_view body, bool negated) {
        if (in_class) {
          out.append(body);
        } else {
          out.append(negated ? "[^" : "[");
          out.append(body);
          out.push_back(']');
        }
      };
      ++i;
      switch (e) {
        case 's': emit_class(kSpaceClass, false); continue;
        case 'w': emit_class(kWordClass, false); continue;
        case 'h': emit_class(kHexClass, false); continue;
        case 'S': if (!in_class) { emit_class(kSpaceClass, true); continue; } break;
        case 'W': if (!in_class) { emit_class(kWordClass, true); continue; } break;
        case 'H': if (!in_class) { emit_class(kHexClass, true); continue; } break;
        case 'u':
          if (i + 4 < pattern.size() && is_hex(pattern[i + 1]) && is_hex(pattern[i + 2]) &&
              is_hex(pattern[i + 3]) && is_hex(pattern[i + 4])) {
            out.append("\\x{");
            out.append(pattern.substr(i + 1, 4));
            out.push_back('}');
            i += 4;
            continue;
          }
          break;
        default: break;
      }
      out.push_back('\\');
      out.push_back(e);
      continue;
    }
    if (c == '[') {
      ++class_depth;
      out.push_back(c);
      // A ']' or '^]' right after '[' is a literal ']' in both engines: copy it so it does not close.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out.push_back(c);
  }
  return out;
}

Expected<Regex> Regex::compile(std::string_view pattern) {
  const std::string translated = translate_oniguruma(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_compile_context* compile_context = pcre2_compile_context_create(nullptr);
  if (compile_context == nullptr) return error("out of memory compiling regex");
  pcre2_set_newline(compile_context, PCRE2_NEWLINE_LF);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error_code, &error_offset,
                                   compile_context);
  pcre2_compile_context_free(compile_context);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return error("invalid regex \"", pattern, "\": ", reinterpret_cast<const char*>(message),
                 " (at offset ", error_offset, " of its PCRE2 form \"", translated, "\")");
  }
  auto compiled = std::make_unique<Compiled>();
  compiled->code = code;
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is unavailable
  compiled->match_context = pcre2_match_context_create(nullptr);
  if (compiled->match_context == nullptr) return error("out of memory compiling regex");
  pcre2_set_match_limit(compiled->match_context, kMatchLimit);
  pcre2_set_depth_limit(compiled->match_context, kDepthLimit);
  return Regex(std::move(compiled));
}

Expected<Regex> Regex::compile_literal(std::string_view literal) {
  // Escape every ASCII punctuation character; other bytes (incl. UTF-8) stand for themselves.
  std::string escaped;
  for (const char c : literal) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x80 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
      if (u < 0x20 || u == 0x7F || c == ' ') {
        static constexpr char kHex[] = "0123456789ABCDEF";
        escaped.append("\\x{");
        escaped.push_back(kHex[u >> 4]);
        escaped.push_back(kHex[u & 15]);
        escaped.push_back('}');
        continue;
      }
      escaped.push_back('\\');
    }
    escaped.push_back(c);
  }
  return compile(escaped);
}

void Regex::find_all(std::string_view text, std::vector<Match>& matches) const {
  matches.clear();
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
  if (data == nullptr) return;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t search_from = 0;
  bool have_last_end = false;
  size_t last_end = 0;
  while (search_from <= text.size()) {
    int rc = pcre2_match(compiled_->code, subject, text.size(), search_from, PCRE2_NO_UTF_CHECK, data,
                         compiled_->match_context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // deep recursion: the interpreter uses the heap instead
      rc = pcre2_match(compiled_->code, subject, text.size(), search_from,
                       PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, data, compiled_->match_context);
    }
    if (rc < 0) break;  // no match, or a resource limit: no further matches
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (begin > end || end > text.size()) break;  // \K tricks; not meaningful for splitting
    if (begin == end && have_last_end && last_end == end) {
      // onig's find_iter: skip an empty match where the last one ended, step one character.
      if (search_from >= text.size()) break;
      search_from += utf8::sequence_size(static_cast<unsigned char>(text[search_from]));
      continue;
    }
    matches.push_back({begin, end});
    search_from = end;
    have_last_end = true;
    last_end = end;
  }
  pcre2_match_data_free(data);
}

}  // namespace slimkv
