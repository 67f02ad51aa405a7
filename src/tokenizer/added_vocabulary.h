// Added tokens (tokenizer.json "added_tokens"): strings that are matched in the input before any
// other processing and map straight to one id, as HF's AddedVocabulary does.
//
// Tokens with normalized=false are matched on the raw text, the others on each normalized piece;
// at every position the longest token wins (leftmost-longest); single_word, lstrip and rstrip act
// as in HF. Special tokens in user text are recognised (HF's default).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "slimkv/status.h"
#include "tokenizer/json_field.h"
#include "tokenizer/text_piece.h"

namespace slimkv {

class BpeModel;
class Normalizer;

struct AddedToken {
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
  bool operator==(const AddedToken&) const = default;
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;

  // Reads the "added_tokens" array (null or missing: none). Ids are resolved as HF resolves them
  // (a token already in the model keeps the model's id; others get the next free id); an id in the
  // file that disagrees is an error naming the entry, as are entries that are not well formed.
  static Expected<AddedVocabulary> from_json(const json_field::Json* list, const std::string& path,
                                             const BpeModel& model, const Normalizer* normalizer);

  // HF's extract_and_normalize: splits `text` (valid UTF-8) into added-token pieces and normalized
  // text pieces, appended to `pieces` (empty pieces are left out).
  void split_and_normalize(std::string_view text, const Normalizer* normalizer,
                           std::vector<TextPiece>& pieces) const;

  std::optional<int32_t> token_id(std::string_view content) const;
  // The text of added token `id` (its normalized form when it is a normalized token), or nullptr.
  const std::string* token_text(int32_t id) const;
  // HF's is_special_token: compares token text, so it applies to model tokens of the same text too.
  bool is_special_text(std::string_view text) const { return special_contents_.contains(std::string(text)); }
  // True when `id` is an added token marked special.
  bool is_special_id(int32_t id) const {
    auto it = tokens_by_id_.find(id);
    return it != tokens_by_id_.end() && special_contents_.contains(it->second.content);
  }
  // Largest added-token id, -1 when there are none.
  int32_t max_id() const { return max_id_; }
  bool empty() const { return tokens_by_id_.empty(); }

 private:
  // Finds added tokens in text: a byte trie, searched leftmost-longest.
  class Matcher {
   public:
    bool empty() const { return nodes_.size() <= 1; }
    // Returns false when `pattern` is already present (with another id).
    bool add(std::string_view pattern, int32_t id);
    struct Found {
      size_t begin;
      size_t end;
      int32_t id;
    };
    // The leftmost-longest match starting at or after `from`, if any.
    std::optional<Found> find(std::string_view text, size_t from) const;

   private:
    struct Node {
      int32_t id = -1;
      std::unordered_map<unsigned char, int32_t> children;
    };
    std::vector<Node> nodes_{Node{}};
    bool first_bytes_[256] = {};
  };

  // HF's find_matches + split_with_indices for one piece with one matcher.
  void split_piece_on_tokens(const TextPiece& piece, const Matcher& matcher, std::vector<TextPiece>& out) const;

  std::unordered_map<std::string, int32_t> ids_by_content_;
  std::unordered_map<int32_t, AddedToken> tokens_by_id_;
  std::unordered_map<int32_t, std::string> normalized_text_by_id_;  // only where it differs
  std::unordered_set<std::string> special_contents_;
  Matcher raw_matcher_;         // tokens with normalized=false
  Matcher normalized_matcher_;  // tokens with normalized=true, in normalized form
  int32_t max_id_ = -1;
};

}  // namespace slimkv
