#include "tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "tokenizer/byte_level_alphabet.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace slimkv {
namespace {

using json_field::Json;

constexpr int kMaxNesting = 32;

// Each token's characters back to the bytes they stand for (a token with a character outside the
// alphabet keeps its UTF-8 bytes), then all bytes as one lossy UTF-8 string.
class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    std::string token_bytes;
    for (const std::string& token : tokens) {
      token_bytes.clear();
      bool all_mapped = true;
      for (size_t pos = 0; pos < token.size();) {
        const utf8::DecodedChar c = utf8::decode_at(token, pos);
        const int byte = byte_level::byte_for_char(c.code_point);
        if (byte < 0) {
          all_mapped = false;
          break;
        }
        token_bytes.push_back(static_cast<char>(byte));
        pos += c.size_bytes;
      }
      bytes.append(all_mapped ? token_bytes : token);
    }
    tokens.assign(1, utf8::make_valid_utf8(bytes));
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(char32_t replacement, bool strip_first) : replacement_(replacement), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& token = tokens[i];
      for (size_t pos = 0; pos < token.size();) {
        const utf8::DecodedChar c = utf8::decode_at(token, pos);
        if (c.code_point == replacement_) {
          if (!(i == 0 && strip_first_)) out.push_back(' ');  // HF drops every one in the first token
        } else {
          out.append(token, pos, c.size_bytes);
        }
        pos += c.size_bytes;
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  char32_t replacement_;
  bool strip_first_;  // prepend_scheme is not "never"
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<Regex::Match> matches;
    for (std::string& token : tokens) {
      pattern_.find_all(token, matches);
      if (matches.empty()) continue;
      std::string out;
      size_t last = 0;
      for (const Regex::Match& m : matches) {
        out.append(token, last, m.begin - last);
        out.append(content_);
        last = m.end;
      }
      out.append(token, last, std::string::npos);
      token = std::move(out);
    }
  }

 private:
  Regex pattern_;
  std::string content_;
};

// Runs of <0xNN> tokens become the bytes they name: one string when valid UTF-8, otherwise one
// U+FFFD per byte (as HF does).
class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    auto flush = [&]() {
      if (pending.empty()) return;
      if (utf8::is_valid(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back(utf8::kReplacementChar);
      }
      pending.clear();
    };
    for (std::string& token : tokens) {
      int byte = -1;
      if (token.size() == 6 && token.starts_with("<0x") && token.back() == '>') byte = parse_hex_byte(token.substr(3, 2));
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    tokens = std::move(out);
  }

 private:
  // Rust's u8::from_str_radix(s, 16) for a two-byte s (a leading '+' is allowed).
  static int parse_hex_byte(std::string_view s) {
    auto digit = [](char c) {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    if (s[0] == '+') return digit(s[1]);
    const int high = digit(s[0]);
    const int low = digit(s[1]);
    return high < 0 || low < 0 ? -1 : high * 16 + low;
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const std::string& token : tokens) joined.append(token);
    tokens.assign(1, std::move(joined));
  }
};

// Removes up to `start` leading and `stop` trailing `content` characters from each token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      std::vector<size_t> char_starts;
      for (size_t pos = 0; pos < token.size(); pos += utf8::decode_at(token, pos).size_bytes) char_starts.push_back(pos);
      const size_t count = char_starts.size();
      auto char_at = [&](size_t i) { return utf8::decode_at(token, char_starts[i]).code_point; };
      size_t start_cut = 0;
      for (size_t i = 0; i < std::min(start_, count) && char_at(i) == content_; ++i) start_cut = i + 1;
      size_t stop_cut = count;
      for (size_t i = 0; i < stop_ && i < count; ++i) {
        const size_t index = count - i - 1;
        if (char_at(index) != content_) break;
        stop_cut = index;
      }
      if (stop_cut <= start_cut) {  // HF would panic here; an empty token is the sensible result
        token.clear();
        continue;
      }
      const size_t begin = start_cut < count ? char_starts[start_cut] : token.size();
      const size_t end = stop_cut < count ? char_starts[stop_cut] : token.size();
      token = token.substr(begin, end - begin);
    }
  }

 private:
  char32_t content_;
  size_t start_;
  size_t stop_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> stages) : stages_(std::move(stages)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& stage : stages_) stage->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> stages_;
};

Expected<size_t> count_field(const Json& spec, std::string_view key, const std::string& path) {
  SLIMKV_ASSIGN_OR_RETURN(const int64_t value, json_field::optional_int(spec, key, path, 0));
  if (value < 0) return error(json_field::member_path(path, key), ": expected a count >= 0, found ", value);
  return static_cast<size_t>(value);
}

Expected<std::unique_ptr<Decoder>> parse(const Json& spec, const std::string& path, int depth) {
  if (spec.is_null()) return std::unique_ptr<Decoder>();
  SLIMKV_RETURN_IF_ERROR(json_field::expect_object(spec, path));
  if (depth > kMaxNesting) return error(path, ": decoders nested deeper than ", kMaxNesting);
  SLIMKV_ASSIGN_OR_RETURN(const std::string type, json_field::required_string(spec, "type", path));
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Metaspace") {
    SLIMKV_ASSIGN_OR_RETURN(const char32_t replacement, json_field::required_char(spec, "replacement", path));
    SLIMKV_ASSIGN_OR_RETURN(const auto scheme, json_field::optional_string(spec, "prepend_scheme", path));
    if (scheme && *scheme != "first" && *scheme != "never" && *scheme != "always") {
      return error(json_field::member_path(path, "prepend_scheme"), ": expected \"first\", \"never\" or \"always\", found \"",
                   *scheme, "\"");
    }
    bool strip_first = !scheme || *scheme != "never";
    const Json* legacy = json_field::find(spec, "add_prefix_space");
    if (legacy != nullptr && legacy->is_boolean() && !legacy->get<bool>()) strip_first = false;
    return std::unique_ptr<Decoder>(new MetaspaceDecoder(replacement, strip_first));
  }
  if (type == "Replace") {
    SLIMKV_ASSIGN_OR_RETURN(Regex pattern, json_field::required_pattern(spec, "pattern", path));
    SLIMKV_ASSIGN_OR_RETURN(std::string content, json_field::required_string(spec, "content", path));
    return std::unique_ptr<Decoder>(new ReplaceDecoder(std::move(pattern), std::move(content)));
  }
  if (type == "Strip") {
    SLIMKV_ASSIGN_OR_RETURN(const char32_t content, json_field::required_char(spec, "content", path));
    SLIMKV_ASSIGN_OR_RETURN(const size_t start, count_field(spec, "start", path));
    SLIMKV_ASSIGN_OR_RETURN(const size_t stop, count_field(spec, "stop", path));
    return std::unique_ptr<Decoder>(new StripDecoder(content, start, stop));
  }
  if (type == "Sequence") {
    const std::string list_path = json_field::member_path(path, "decoders");
    const Json* list = json_field::find(spec, "decoders");
    if (list == nullptr || !list->is_array()) {
      return error(list_path, ": expected an array of decoders, found ",
                   list == nullptr ? std::string("nothing") : json_field::describe(*list));
    }
    std::vector<std::unique_ptr<Decoder>> stages;
    for (size_t i = 0; i < list->size(); ++i) {
      SLIMKV_ASSIGN_OR_RETURN(auto stage, parse((*list)[i], json_field::element_path(list_path, i), depth + 1));
      if (stage) stages.push_back(std::move(stage));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(stages)));
  }
  return error(json_field::member_path(path, "type"), ": unsupported decoder \"", type,
               "\" (supported: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence)");
}

}  // namespace

Expected<std::unique_ptr<Decoder>> parse_decoder(const Json& spec, const std::string& path) {
  return parse(spec, path, 0);
}

}  // namespace slimkv
