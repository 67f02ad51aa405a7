// Regular expressions with the semantics HF tokenizers gets from Oniguruma (Ruby syntax), run by
// PCRE2 (UTF + UCP, JIT-compiled).
//
// The classes that differ between the two engines are rewritten before compiling, so that they
// mean what Oniguruma means: `\s` (White_Space; PCRE2 adds U+180E), `\w` (letters, marks, Nd, Pc;
// PCRE2 has no marks), `\h` (a hex digit in Ruby, horizontal space in PCRE2), `\uHHHH`. `^`/`$`
// match at line boundaries, as in Ruby. `\p{L}`, `\p{N}`, `(?i:...)` and `(?!...)` already agree.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "slimkv/status.h"

namespace slimkv {

class Regex {
 public:
  // Compiles an Oniguruma (Ruby syntax) pattern; the error names PCRE2's complaint and offset.
  static Expected<Regex> compile(std::string_view pattern);
  // A pattern matching `literal` exactly (HF escapes String patterns into a regex the same way).
  static Expected<Regex> compile_literal(std::string_view literal);

  struct Match {
    size_t begin;
    size_t end;
  };
  // All matches in valid UTF-8 `text`, as onig's find_iter yields them: leftmost, non-overlapping;
  // an empty match right where the previous match ended is skipped. A match that exceeds PCRE2's
  // backtracking limits ends the search (no crash, no hang on pathological patterns).
  void find_all(std::string_view text, std::vector<Match>& matches) const;

  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();

  // The Oniguruma pattern rewritten for PCRE2 (exposed for tests).
  static std::string translate_oniguruma(std::string_view pattern);

 private:
  struct Compiled;
  explicit Regex(std::unique_ptr<Compiled> compiled);
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace slimkv
