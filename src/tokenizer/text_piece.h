// The input on its way from raw text to token ids, as a list of pieces (HF's PreTokenizedString):
// added-token matching, normalization and pre-tokenization each split the pieces further; the model
// turns every remaining piece into ids independently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "slimkv/status.h"
#include "tokenizer/utf8.h"

namespace slimkv {

class Regex;

struct TextPiece {
  std::string text;
  // >= 0 when the piece is an added token: it is final and no later stage touches it.
  int32_t token_id = -1;
  // True when the piece's first character comes from byte 0 of the input text. HF reads this as
  // `offsets_original().0 == 0` in Metaspace's prepend_scheme "first".
  bool at_text_start = false;
};

// What a split does with the delimiters it finds (HF's SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
Expected<SplitBehavior> parse_split_behavior(std::string_view name);

// A stretch of a piece's text that a pattern matched (is_match) or did not; the segments of one
// text cover it in order, as HF's Pattern::find_matches returns them.
struct Segment {
  size_t begin;
  size_t end;
  bool is_match;
};

// Segments of `text` for the matches of `regex`; `invert` swaps matched and unmatched.
void segments_from_regex(const Regex& regex, std::string_view text, bool invert,
                         std::vector<Segment>& segments);

// Segments of `text` where every character with `is_delimiter(c)` is one match of its own.
template <typename Predicate>
void segments_from_chars(std::string_view text, Predicate is_delimiter, std::vector<Segment>& segments) {
  segments.clear();
  if (text.empty()) {
    segments.push_back({0, 0, false});
    return;
  }
  size_t last = 0;
  for (size_t pos = 0; pos < text.size();) {
    const utf8::DecodedChar c = utf8::decode_at(text, pos);
    if (is_delimiter(c.code_point)) {
      if (last < pos) segments.push_back({last, pos, false});
      segments.push_back({pos, pos + c.size_bytes, true});
      last = pos + c.size_bytes;
    }
    pos += c.size_bytes;
  }
  if (last < text.size()) segments.push_back({last, text.size(), false});
}

// HF's NormalizedString::split followed by PreTokenizedString::split's filter: appends to `out`
// the non-empty sub-pieces of `piece` that `behavior` keeps.
void split_piece(const TextPiece& piece, const std::vector<Segment>& segments, SplitBehavior behavior,
                 std::vector<TextPiece>& out);

}  // namespace slimkv
