// Character predicates with the exact meaning HF tokenizers gives them: Rust's `char` methods
// (is_whitespace, is_numeric, to_lowercase) and the `regex` crate's `\w`. General categories come
// from utf8proc.
#pragma once

#include <string>

namespace slimkv::char_class {

// Rust char::is_whitespace: the Unicode White_Space property.
bool is_whitespace(char32_t c);

// Rust char::is_numeric: general category Nd, Nl or No.
bool is_numeric(char32_t c);

// HF's is_punc: ASCII punctuation (which includes symbols such as $ + < = > ^ ` | ~) or any
// Unicode punctuation category (Pc Pd Ps Pe Pi Pf Po).
bool is_punctuation(char32_t c);

// The `regex` crate's Unicode `\w`: Alphabetic, marks, Nd, Pc and Join_Control.
bool is_word_char(char32_t c);

// Appends Rust's char::to_lowercase(c) (a full mapping: U+0130 becomes two code points).
void append_lowercase(char32_t c, std::string& out);

}  // namespace slimkv::char_class
