#include "tokenizer/text_piece.h"

#include <algorithm>

#include "tokenizer/regex.h"

namespace slimkv {

Expected<SplitBehavior> parse_split_behavior(std::string_view name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return error("expected one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous; found \"",
               name, "\"");
}

void segments_from_regex(const Regex& regex, std::string_view text, bool invert,
                         std::vector<Segment>& segments) {
  segments.clear();
  if (text.empty()) {
    segments.push_back({0, 0, invert});
    return;
  }
  std::vector<Regex::Match> matches;
  regex.find_all(text, matches);
  size_t previous = 0;
  for (const Regex::Match& m : matches) {
    if (previous != m.begin) segments.push_back({previous, m.begin, invert});
    segments.push_back({m.begin, m.end, !invert});
    previous = m.end;
  }
  if (previous != text.size()) segments.push_back({previous, text.size(), invert});
}

void split_piece(const TextPiece& piece, const std::vector<Segment>& segments, SplitBehavior behavior,
                 std::vector<TextPiece>& out) {
  // The ranges to keep, with `remove` marking the dropped ones (HF computes the same list).
  struct Range {
    size_t begin;
    size_t end;
    bool remove;
  };
  std::vector<Range> ranges;
  ranges.reserve(segments.size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Segment& s : segments) ranges.push_back({s.begin, s.end, false});
      break;
    case SplitBehavior::kRemoved:
      for (const Segment& s : segments) ranges.push_back({s.begin, s.end, s.is_match});
      break;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Segment& s : segments) {
        if (s.is_match == previous_match && !ranges.empty()) {
          ranges.back().end = s.end;
        } else {
          ranges.push_back({s.begin, s.end, false});
        }
        previous_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Segment& s : segments) {
        if (s.is_match && !previous_match && !ranges.empty()) {
          ranges.back().end = s.end;
        } else {
          ranges.push_back({s.begin, s.end, false});
        }
        previous_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (size_t i = segments.size(); i-- > 0;) {
        const Segment& s = segments[i];
        if (s.is_match && !previous_match && !ranges.empty()) {
          ranges.back().begin = s.begin;
        } else {
          ranges.push_back({s.begin, s.end, false});
        }
        previous_match = s.is_match;
      }
      std::reverse(ranges.begin(), ranges.end());
      break;
    }
  }
  for (const Range& r : ranges) {
    if (r.remove || r.begin >= r.end) continue;
    TextPiece sub;
    sub.text.assign(piece.text, r.begin, r.end - r.begin);
    sub.at_text_start = piece.at_text_start && r.begin == 0;
    out.push_back(std::move(sub));
  }
}

}  // namespace slimkv
