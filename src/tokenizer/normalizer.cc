#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "tokenizer/char_class.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace slimkv {
namespace {

using json_field::Json;

// Nested Sequences deeper than this are refused (a hostile file must not exhaust the stack).
constexpr int kMaxNesting = 32;

bool is_ascii(const std::string& text) {
  for (const char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

// Unicode normalization forms through utf8proc. ASCII text is unchanged by all four forms.
class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(utf8proc_option_t options) : options_(options) {}
  void normalize(std::string& text, bool& /*keeps_start*/) const override {
    if (is_ascii(text)) return;
    utf8proc_uint8_t* result = nullptr;
    const utf8proc_ssize_t size =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                     static_cast<utf8proc_ssize_t>(text.size()), &result, options_);
    if (size >= 0 && result != nullptr) text.assign(reinterpret_cast<const char*>(result), static_cast<size_t>(size));
    std::free(result);  // on error (out of memory) the text stays as it was
  }

 private:
  utf8proc_option_t options_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text, bool& /*keeps_start*/) const override {
    std::string out;
    out.reserve(text.size());
    for (size_t pos = 0; pos < text.size();) {
      const utf8::DecodedChar c = utf8::decode_at(text, pos);
      char_class::append_lowercase(c.code_point, out);
      pos += c.size_bytes;
    }
    text = std::move(out);
  }
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text, bool& keeps_start) const override {
    std::vector<Regex::Match> matches;
    pattern_.find_all(text, matches);
    if (matches.empty()) return;
    std::string out;
    out.reserve(text.size());
    size_t last = 0;
    for (const Regex::Match& m : matches) {
      out.append(text, last, m.begin - last);
      out.append(content_);
      last = m.end;
    }
    out.append(text, last, std::string::npos);
    // HF aligns the replacement with the last replaced character: the start survives only when a
    // single character at the start is replaced by something non-empty.
    const Regex::Match& first = matches.front();
    if (first.begin == 0 && first.end > 0 &&
        (content_.empty() || utf8::sequence_size(static_cast<unsigned char>(text[0])) != first.end)) {
      keeps_start = false;
    }
    text = std::move(out);
  }

 private:
  Regex pattern_;
  std::string content_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text, bool& /*keeps_start*/) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text, bool& keeps_start) const override {
    size_t begin = 0;
    size_t end = text.size();
    if (left_) {
      while (begin < end) {
        const utf8::DecodedChar c = utf8::decode_at(text, begin);
        if (!char_class::is_whitespace(c.code_point)) break;
        begin += c.size_bytes;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        if (!char_class::is_whitespace(utf8::decode_at(text, start).code_point)) break;
        end = start;
      }
    }
    if (begin > 0) keeps_start = false;
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_;
  bool right_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> stages) : stages_(std::move(stages)) {}
  void normalize(std::string& text, bool& keeps_start) const override {
    for (const auto& stage : stages_) stage->normalize(text, keeps_start);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> stages_;
};

Expected<std::unique_ptr<Normalizer>> parse(const Json& spec, const std::string& path, int depth) {
  if (spec.is_null()) return std::unique_ptr<Normalizer>();
  SLIMKV_RETURN_IF_ERROR(json_field::expect_object(spec, path));
  if (depth > kMaxNesting) return error(path, ": normalizers nested deeper than ", kMaxNesting);
  SLIMKV_ASSIGN_OR_RETURN(const std::string type, json_field::required_string(spec, "type", path));
  if (type == "NFC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(
      static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE)));
  if (type == "NFD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(
      static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE)));
  if (type == "NFKC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(
      static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT)));
  if (type == "NFKD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(
      static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT)));
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer());
  if (type == "Replace") {
    SLIMKV_ASSIGN_OR_RETURN(Regex pattern, json_field::required_pattern(spec, "pattern", path));
    SLIMKV_ASSIGN_OR_RETURN(std::string content, json_field::required_string(spec, "content", path));
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(pattern), std::move(content)));
  }
  if (type == "Prepend") {
    SLIMKV_ASSIGN_OR_RETURN(std::string prefix, json_field::required_string(spec, "prepend", path));
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(prefix)));
  }
  if (type == "Strip") {
    SLIMKV_ASSIGN_OR_RETURN(const bool left, json_field::optional_bool(spec, "strip_left", path, true));
    SLIMKV_ASSIGN_OR_RETURN(const bool right, json_field::optional_bool(spec, "strip_right", path, true));
    return std::unique_ptr<Normalizer>(new StripNormalizer(left, right));
  }
  if (type == "Sequence") {
    const std::string list_path = json_field::member_path(path, "normalizers");
    const Json* list = json_field::find(spec, "normalizers");
    if (list == nullptr || !list->is_array()) {
      return error(list_path, ": expected an array of normalizers, found ",
                   list == nullptr ? std::string("nothing") : json_field::describe(*list));
    }
    std::vector<std::unique_ptr<Normalizer>> stages;
    for (size_t i = 0; i < list->size(); ++i) {
      SLIMKV_ASSIGN_OR_RETURN(auto stage, parse((*list)[i], json_field::element_path(list_path, i), depth + 1));
      if (stage) stages.push_back(std::move(stage));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(stages)));
  }
  return error(json_field::member_path(path, "type"), ": unsupported normalizer \"", type,
               "\" (supported: NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Strip, Sequence)");
}

}  // namespace

Expected<std::unique_ptr<Normalizer>> parse_normalizer(const Json& spec, const std::string& path) {
  return parse(spec, path, 0);
}

}  // namespace slimkv
