#include "tokenizer/pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include "tokenizer/byte_level_alphabet.h"
#include "tokenizer/char_class.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace slimkv {
namespace {

using json_field::Json;

constexpr int kMaxNesting = 32;

// Replaces every non-added-token piece by what `split_one(piece, out)` appends for it (HF's
// PreTokenizedString::split). Empty results are dropped.
template <typename SplitOne>
void split_each(std::vector<TextPiece>& pieces, SplitOne&& split_one) {
  std::vector<TextPiece> result;
  result.reserve(pieces.size() * 2);
  for (TextPiece& piece : pieces) {
    if (piece.token_id >= 0) {
      result.push_back(std::move(piece));
      continue;
    }
    const size_t first_new = result.size();
    split_one(piece, result);
    // Drop empty pieces (HF filters them out of every split).
    size_t kept = first_new;
    for (size_t i = first_new; i < result.size(); ++i) {
      if (!result[i].text.empty()) {
        if (kept != i) result[kept] = std::move(result[i]);
        ++kept;
      }
    }
    result.resize(kept);
  }
  pieces = std::move(result);
}

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> gpt2_pattern)
      : add_prefix_space_(add_prefix_space), gpt2_pattern_(std::move(gpt2_pattern)) {}

  void pre_tokenize(std::vector<TextPiece>& pieces) const override {
    if (add_prefix_space_ || gpt2_pattern_) {
      std::vector<Segment> segments;
      split_each(pieces, [&](TextPiece& piece, std::vector<TextPiece>& out) {
        if (add_prefix_space_ && !piece.text.empty() && piece.text[0] != ' ') piece.text.insert(0, " ");
        if (!gpt2_pattern_) {
          out.push_back(std::move(piece));
          return;
        }
        segments_from_regex(*gpt2_pattern_, piece.text, /*invert=*/false, segments);
        split_piece(piece, segments, SplitBehavior::kIsolated, out);
      });
    }
    // Every byte becomes its printable stand-in character.
    for (TextPiece& piece : pieces) {
      if (piece.token_id >= 0) continue;
      std::string mapped;
      mapped.reserve(piece.text.size() * 2);
      for (const char c : piece.text) mapped.append(byte_level::char_for_byte(static_cast<uint8_t>(c)));
      piece.text = std::move(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> gpt2_pattern_;  // null when use_regex is false
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<TextPiece>& pieces) const override {
    std::vector<Segment> segments;
    split_each(pieces, [&](const TextPiece& piece, std::vector<TextPiece>& out) {
      segments_from_regex(pattern_, piece.text, invert_, segments);
      split_piece(piece, segments, behavior_, out);
    });
  }

 private:
  Regex pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// Splits where a character predicate holds, each such character being one match (Digits,
// Punctuation, WhitespaceSplit, CharDelimiterSplit).
template <typename Predicate>
class CharSplitPreTokenizer final : public PreTokenizer {
 public:
  CharSplitPreTokenizer(Predicate is_delimiter, SplitBehavior behavior)
      : is_delimiter_(is_delimiter), behavior_(behavior) {}
  void pre_tokenize(std::vector<TextPiece>& pieces) const override {
    std::vector<Segment> segments;
    split_each(pieces, [&](const TextPiece& piece, std::vector<TextPiece>& out) {
      segments_from_chars(piece.text, is_delimiter_, segments);
      split_piece(piece, segments, behavior_, out);
    });
  }

 private:
  Predicate is_delimiter_;
  SplitBehavior behavior_;
};

template <typename Predicate>
std::unique_ptr<PreTokenizer> make_char_split(Predicate is_delimiter, SplitBehavior behavior) {
  return std::make_unique<CharSplitPreTokenizer<Predicate>>(is_delimiter, behavior);
}

// HF's Whitespace: keeps the matches of `\w+|[^\w\s]+` (regex crate classes), drops the rest.
class WhitespacePreTokenizer final : public PreTokenizer {
 public:
  void pre_tokenize(std::vector<TextPiece>& pieces) const override {
    std::vector<Segment> segments;
    split_each(pieces, [&](const TextPiece& piece, std::vector<TextPiece>& out) {
      segments.clear();
      const std::string& text = piece.text;
      size_t pos = 0;
      size_t unmatched_from = 0;
      while (pos < text.size()) {
        utf8::DecodedChar c = utf8::decode_at(text, pos);
        const bool word = char_class::is_word_char(c.code_point);
        if (!word && char_class::is_whitespace(c.code_point)) {
          pos += c.size_bytes;
          continue;
        }
        const size_t begin = pos;
        while (pos < text.size()) {
          c = utf8::decode_at(text, pos);
          const bool same = word ? char_class::is_word_char(c.code_point)
                                 : !char_class::is_word_char(c.code_point) &&
                                       !char_class::is_whitespace(c.code_point);
          if (!same) break;
          pos += c.size_bytes;
        }
        // Inverted pattern: the regex matches are kept (not matched), whitespace is removed.
        if (unmatched_from < begin) segments.push_back({unmatched_from, begin, true});
        segments.push_back({begin, pos, false});
        unmatched_from = pos;
      }
      if (unmatched_from < text.size()) segments.push_back({unmatched_from, text.size(), true});
      split_piece(piece, segments, SplitBehavior::kRemoved, out);
    });
  }
};

enum class PrependScheme { kFirst, kNever, kAlways };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(char32_t replacement, PrependScheme scheme, bool split)
      : replacement_(replacement), scheme_(scheme), split_(split) {
    utf8::append(replacement, replacement_text_);
  }
  void pre_tokenize(std::vector<TextPiece>& pieces) const override {
    std::vector<Segment> segments;
    split_each(pieces, [&](TextPiece& piece, std::vector<TextPiece>& out) {
      std::string replaced;
      replaced.reserve(piece.text.size() + replacement_text_.size());
      for (const char c : piece.text) {
        if (c == ' ') {
          replaced.append(replacement_text_);
        } else {
          replaced.push_back(c);
        }
      }
      const bool starts_with_replacement = replaced.compare(0, replacement_text_.size(), replacement_text_) == 0;
      if (!starts_with_replacement && !replaced.empty() &&
          (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && piece.at_text_start))) {
        replaced.insert(0, replacement_text_);
      }
      piece.text = std::move(replaced);
      if (!split_) {
        out.push_back(std::move(piece));
        return;
      }
      const char32_t replacement = replacement_;
      segments_from_chars(piece.text, [replacement](char32_t c) { return c == replacement; }, segments);
      split_piece(piece, segments, SplitBehavior::kMergedWithNext, out);
    });
  }

 private:
  char32_t replacement_;
  std::string replacement_text_;
  PrependScheme scheme_;
  bool split_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> stages) : stages_(std::move(stages)) {}
  void pre_tokenize(std::vector<TextPiece>& pieces) const override {
    for (const auto& stage : stages_) stage->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> stages_;
};

class BertPreTokenizer final : public PreTokenizer {
 public:
  void pre_tokenize(std::vector<TextPiece>& pieces) const override {
    whitespace_->pre_tokenize(pieces);
    punctuation_->pre_tokenize(pieces);
  }

 private:
  std::unique_ptr<PreTokenizer> whitespace_ = make_char_split(char_class::is_whitespace, SplitBehavior::kRemoved);
  std::unique_ptr<PreTokenizer> punctuation_ = make_char_split(char_class::is_punctuation, SplitBehavior::kIsolated);
};

Expected<SplitBehavior> behavior_field(const Json& spec, const std::string& path, std::optional<SplitBehavior> fallback) {
  const std::string field = json_field::member_path(path, "behavior");
  const Json* value = json_field::find(spec, "behavior");
  if ((value == nullptr || value->is_null()) && fallback) return *fallback;
  if (value == nullptr) return error(field, ": missing (expected a split behavior such as \"Isolated\")");
  if (!value->is_string()) return error(field, ": expected a string, found ", json_field::describe(*value));
  Expected<SplitBehavior> behavior = parse_split_behavior(value->get_ref<const std::string&>());
  if (!behavior.has_value()) return behavior.status().with_context(field);
  return behavior;
}

Expected<std::unique_ptr<PreTokenizer>> parse(const Json& spec, const std::string& path, int depth) {
  if (spec.is_null()) return std::unique_ptr<PreTokenizer>();
  SLIMKV_RETURN_IF_ERROR(json_field::expect_object(spec, path));
  if (depth > kMaxNesting) return error(path, ": pre-tokenizers nested deeper than ", kMaxNesting);
  SLIMKV_ASSIGN_OR_RETURN(const std::string type, json_field::required_string(spec, "type", path));
  if (type == "ByteLevel") {
    SLIMKV_ASSIGN_OR_RETURN(const bool add_prefix_space, json_field::optional_bool(spec, "add_prefix_space", path, true));
    SLIMKV_ASSIGN_OR_RETURN(const bool use_regex, json_field::optional_bool(spec, "use_regex", path, true));
    std::unique_ptr<Regex> pattern;
    if (use_regex) {
      SLIMKV_ASSIGN_OR_RETURN(Regex gpt2, Regex::compile(kGpt2Pattern));
      pattern = std::make_unique<Regex>(std::move(gpt2));
    }
    return std::unique_ptr<PreTokenizer>(new ByteLevelPreTokenizer(add_prefix_space, std::move(pattern)));
  }
  if (type == "Split") {
    SLIMKV_ASSIGN_OR_RETURN(Regex pattern, json_field::required_pattern(spec, "pattern", path));
    SLIMKV_ASSIGN_OR_RETURN(const SplitBehavior behavior, behavior_field(spec, path, std::nullopt));
    SLIMKV_ASSIGN_OR_RETURN(const bool invert, json_field::optional_bool(spec, "invert", path, false));
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(std::move(pattern), behavior, invert));
  }
  if (type == "Digits") {
    SLIMKV_ASSIGN_OR_RETURN(const bool individual, json_field::optional_bool(spec, "individual_digits", path, false));
    return make_char_split(char_class::is_numeric,
                           individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous);
  }
  if (type == "Punctuation") {
    SLIMKV_ASSIGN_OR_RETURN(const SplitBehavior behavior, behavior_field(spec, path, SplitBehavior::kIsolated));
    return make_char_split(char_class::is_punctuation, behavior);
  }
  if (type == "WhitespaceSplit") return make_char_split(char_class::is_whitespace, SplitBehavior::kRemoved);
  if (type == "Whitespace") return std::unique_ptr<PreTokenizer>(new WhitespacePreTokenizer());
  if (type == "BertPreTokenizer") return std::unique_ptr<PreTokenizer>(new BertPreTokenizer());
  if (type == "CharDelimiterSplit") {
    SLIMKV_ASSIGN_OR_RETURN(const char32_t delimiter, json_field::required_char(spec, "delimiter", path));
    return make_char_split([delimiter](char32_t c) { return c == delimiter; }, SplitBehavior::kRemoved);
  }
  if (type == "Metaspace") {
    SLIMKV_ASSIGN_OR_RETURN(const char32_t replacement, json_field::required_char(spec, "replacement", path));
    SLIMKV_ASSIGN_OR_RETURN(const auto scheme_name, json_field::optional_string(spec, "prepend_scheme", path));
    PrependScheme scheme = PrependScheme::kAlways;  // HF's default
    if (scheme_name) {
      if (*scheme_name == "first") {
        scheme = PrependScheme::kFirst;
      } else if (*scheme_name == "never") {
        scheme = PrependScheme::kNever;
      } else if (*scheme_name == "always") {
        scheme = PrependScheme::kAlways;
      } else {
        return error(json_field::member_path(path, "prepend_scheme"),
                     ": expected \"first\", \"never\" or \"always\", found \"", *scheme_name, "\"");
      }
    }
    // Older files say add_prefix_space instead; false means "never".
    const Json* legacy = json_field::find(spec, "add_prefix_space");
    if (legacy != nullptr && legacy->is_boolean() && !legacy->get<bool>()) {
      if (scheme != PrependScheme::kNever && scheme_name) {
        return error(path, ": add_prefix_space false does not match prepend_scheme \"", *scheme_name, "\"");
      }
      scheme = PrependScheme::kNever;
    }
    SLIMKV_ASSIGN_OR_RETURN(const bool split, json_field::optional_bool(spec, "split", path, true));
    return std::unique_ptr<PreTokenizer>(new MetaspacePreTokenizer(replacement, scheme, split));
  }
  if (type == "Sequence") {
    const std::string list_path = json_field::member_path(path, "pretokenizers");
    const Json* list = json_field::find(spec, "pretokenizers");
    if (list == nullptr || !list->is_array()) {
      return error(list_path, ": expected an array of pre-tokenizers, found ",
                   list == nullptr ? std::string("nothing") : json_field::describe(*list));
    }
    std::vector<std::unique_ptr<PreTokenizer>> stages;
    for (size_t i = 0; i < list->size(); ++i) {
      SLIMKV_ASSIGN_OR_RETURN(auto stage, parse((*list)[i], json_field::element_path(list_path, i), depth + 1));
      if (stage) stages.push_back(std::move(stage));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(stages)));
  }
  return error(json_field::member_path(path, "type"), ": unsupported pre-tokenizer \"", type,
               "\" (supported: ByteLevel, Split, Digits, Metaspace, Whitespace, WhitespaceSplit, Punctuation, "
               "CharDelimiterSplit, BertPreTokenizer, Sequence)");
}

}  // namespace

Expected<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const Json& spec, const std::string& path) {
  return parse(spec, path, 0);
}

}  // namespace slimkv
