#include "tokenizer/added_vocabulary.h"

#include <nlohmann/json.hpp>

#include "tokenizer/bpe_model.h"
#include "tokenizer/char_class.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

namespace slimkv {

using json_field::Json;

// --- Matcher ---

bool AddedVocabulary::Matcher::add(std::string_view pattern, int32_t id) {
  int32_t node = 0;
  for (const char c : pattern) {
    const auto byte = static_cast<unsigned char>(c);
    auto it = nodes_[static_cast<size_t>(node)].children.find(byte);
    if (it == nodes_[static_cast<size_t>(node)].children.end()) {
      const auto child = static_cast<int32_t>(nodes_.size());
      nodes_[static_cast<size_t>(node)].children.emplace(byte, child);
      nodes_.emplace_back();
      node = child;
    } else {
      node = it->second;
    }
  }
  if (nodes_[static_cast<size_t>(node)].id >= 0) return false;
  nodes_[static_cast<size_t>(node)].id = id;
  first_bytes_[static_cast<unsigned char>(pattern[0])] = true;
  return true;
}

std::optional<AddedVocabulary::Matcher::Found> AddedVocabulary::Matcher::find(std::string_view text,
                                                                             size_t from) const {
  for (size_t begin = from; begin < text.size(); ++begin) {
    if (!first_bytes_[static_cast<unsigned char>(text[begin])]) continue;
    int32_t node = 0;
    std::optional<Found> longest;
    for (size_t pos = begin; pos < text.size(); ++pos) {
      const Node& current = nodes_[static_cast<size_t>(node)];
      auto it = current.children.find(static_cast<unsigned char>(text[pos]));
      if (it == current.children.end()) break;
      node = it->second;
      if (nodes_[static_cast<size_t>(node)].id >= 0) longest = Found{begin, pos + 1, nodes_[static_cast<size_t>(node)].id};
    }
    if (longest) return longest;
  }
  return std::nullopt;
}

// --- loading ---

Expected<AddedVocabulary> AddedVocabulary::from_json(const Json* list, const std::string& path,
                                                     const BpeModel& model, const Normalizer* normalizer) {
  AddedVocabulary vocab;
  if (list == nullptr || list->is_null()) return vocab;
  if (!list->is_array()) return error(path, ": expected an array of added tokens, found ", json_field::describe(*list));

  // HF's AddedVocabulary::add_tokens, all tokens in one call.
  int64_t next_id = static_cast<int64_t>(model.vocab_entries());
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& entry = (*list)[i];
    const std::string entry_path = json_field::element_path(path, i);
    SLIMKV_RETURN_IF_ERROR(json_field::expect_object(entry, entry_path));
    AddedToken token;
    SLIMKV_ASSIGN_OR_RETURN(token.content, json_field::required_string(entry, "content", entry_path));
    const Json* id_field = json_field::find(entry, "id");
    if (id_field == nullptr) return error(json_field::member_path(entry_path, "id"), ": missing (expected a token id)");
    SLIMKV_ASSIGN_OR_RETURN(const int32_t file_id, json_field::as_token_id(*id_field, json_field::member_path(entry_path, "id")));
    SLIMKV_ASSIGN_OR_RETURN(token.single_word, json_field::optional_bool(entry, "single_word", entry_path, false));
    SLIMKV_ASSIGN_OR_RETURN(token.lstrip, json_field::optional_bool(entry, "lstrip", entry_path, false));
    SLIMKV_ASSIGN_OR_RETURN(token.rstrip, json_field::optional_bool(entry, "rstrip", entry_path, false));
    SLIMKV_ASSIGN_OR_RETURN(token.normalized, json_field::optional_bool(entry, "normalized", entry_path, true));
    SLIMKV_ASSIGN_OR_RETURN(token.special, json_field::optional_bool(entry, "special", entry_path, false));
    if (token.content.empty()) continue;  // HF ignores empty tokens

    auto known = vocab.ids_by_content_.find(token.content);
    if (known != vocab.ids_by_content_.end() && vocab.tokens_by_id_[known->second] == token) {
      continue;  // an exact repeat
    }
    int64_t id = 0;
    if (known != vocab.ids_by_content_.end()) {
      id = known->second;
    } else if (auto model_id = model.token_id(token.content)) {
      id = *model_id;
    } else {
      id = next_id++;
    }
    if (id != file_id) {
      return error(json_field::member_path(entry_path, "id"), ": added token \"", token.content, "\" has id ",
                   file_id, " in the file, but Hugging Face tokenizers gives it id ", id,
                   " (the model's id for the same text, or the next id after the model vocabulary); "
                   "ids that collide or leave gaps are not supported");
    }
    if (token.normalized && normalizer != nullptr) {
      std::string normalized = token.content;
      bool keeps_start = true;
      normalizer->normalize(normalized, keeps_start);
      if (normalized != token.content) {
        vocab.normalized_text_by_id_[file_id] = std::move(normalized);
      } else {
        vocab.normalized_text_by_id_.erase(file_id);
      }
    }
    vocab.ids_by_content_[token.content] = file_id;
    if (token.special) vocab.special_contents_.insert(token.content);
    vocab.tokens_by_id_[file_id] = std::move(token);
    if (file_id > vocab.max_id_) vocab.max_id_ = file_id;
  }

  // HF's refresh_added_tokens: the two matchers.
  for (const auto& [id, token] : vocab.tokens_by_id_) {
    if (!token.normalized) {
      vocab.raw_matcher_.add(token.content, id);  // contents are unique, so this cannot collide
      continue;
    }
    auto normalized = vocab.normalized_text_by_id_.find(id);
    const std::string& pattern = normalized == vocab.normalized_text_by_id_.end() ? token.content : normalized->second;
    if (pattern.empty()) continue;
    if (!vocab.normalized_matcher_.add(pattern, id)) {
      return error(path, ": two normalized added tokens become the same text \"", pattern,
                   "\" after normalization (Hugging Face tokenizers refuses this too)");
    }
  }
  return vocab;
}

// --- lookups ---

std::optional<int32_t> AddedVocabulary::token_id(std::string_view content) const {
  auto it = ids_by_content_.find(std::string(content));
  if (it == ids_by_content_.end()) return std::nullopt;
  return it->second;
}

const std::string* AddedVocabulary::token_text(int32_t id) const {
  auto normalized = normalized_text_by_id_.find(id);
  if (normalized != normalized_text_by_id_.end()) return &normalized->second;
  auto it = tokens_by_id_.find(id);
  return it == tokens_by_id_.end() ? nullptr : &it->second.content;
}

// --- splitting ---

namespace {

bool ends_with_word_char(std::string_view text) {
  if (text.empty()) return false;
  size_t start = text.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return char_class::is_word_char(utf8::decode_at(text, start).code_point);
}

bool starts_with_word_char(std::string_view text) {
  return !text.empty() && char_class::is_word_char(utf8::decode_at(text, 0).code_point);
}

}  // namespace

void AddedVocabulary::split_piece_on_tokens(const TextPiece& piece, const Matcher& matcher,
                                            std::vector<TextPiece>& out) const {
  const std::string_view sentence = piece.text;
  auto push_text = [&](size_t begin, size_t end) {
    if (begin >= end) return;
    TextPiece sub;
    sub.text.assign(sentence.substr(begin, end - begin));
    sub.at_text_start = piece.at_text_start && begin == 0;
    out.push_back(std::move(sub));
  };
  if (matcher.empty()) {
    push_text(0, sentence.size());
    return;
  }
  size_t start_offset = 0;
  size_t search_from = 0;
  while (auto found = matcher.find(sentence, search_from)) {
    search_from = found->end;  // the search resumes after the match, whatever is done with it
    size_t start = found->begin;
    size_t stop = found->end;
    const AddedToken& token = tokens_by_id_.at(found->id);
    if (token.single_word) {
      const bool start_space = start == 0 || !ends_with_word_char(sentence.substr(0, start));
      const bool stop_space = stop == sentence.size() || !starts_with_word_char(sentence.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) {
      size_t new_start = start;  // beginning of the whitespace run that ends at `start`
      while (new_start > 0) {
        size_t prev = new_start - 1;
        while (prev > 0 && (static_cast<unsigned char>(sentence[prev]) & 0xC0) == 0x80) --prev;
        if (!char_class::is_whitespace(utf8::decode_at(sentence, prev).code_point)) break;
        new_start = prev;
      }
      start = std::max(new_start, start_offset);
    }
    if (token.rstrip) {
      while (stop < sentence.size()) {
        const utf8::DecodedChar c = utf8::decode_at(sentence, stop);
        if (!char_class::is_whitespace(c.code_point)) break;
        stop += c.size_bytes;
      }
    }
    if (start_offset < start) push_text(start_offset, start);
    TextPiece token_piece;
    token_piece.token_id = found->id;
    token_piece.text.assign(sentence.substr(start, stop - start));
    out.push_back(std::move(token_piece));
    start_offset = stop;
  }
  if (start_offset < sentence.size()) push_text(start_offset, sentence.size());
}

void AddedVocabulary::split_and_normalize(std::string_view text, const Normalizer* normalizer,
                                          std::vector<TextPiece>& pieces) const {
  if (text.empty()) return;
  TextPiece whole;
  whole.text.assign(text);
  whole.at_text_start = true;
  std::vector<TextPiece> raw_split;
  split_piece_on_tokens(whole, raw_matcher_, raw_split);
  for (TextPiece& piece : raw_split) {
    if (piece.token_id >= 0) {
      pieces.push_back(std::move(piece));
      continue;
    }
    if (normalizer != nullptr) {
      bool keeps_start = true;
      normalizer->normalize(piece.text, keeps_start);
      piece.at_text_start = piece.at_text_start && keeps_start;
      if (piece.text.empty()) continue;
    }
    split_piece_on_tokens(piece, normalized_matcher_, pieces);
  }
}

}  // namespace slimkv
