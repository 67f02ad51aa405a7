// The BPE model of tokenizer.json ("model": {"type": "BPE", ...}): turns one pre-tokenized word
// into token ids by applying merges in rank order, exactly as HF's BPE::tokenize.
//
// Supported options: merges as "a b" strings or ["a", "b"] pairs, ignore_merges, byte_fallback,
// unk_token, fuse_unk, continuing_subword_prefix, end_of_word_suffix. dropout other than null/0 is
// refused (inference must be deterministic).
// One extension of slimkv's own (HF's format has none such): "merge_ranks", one integer per merge; a
// word's adjacent pairs merge lowest rank first and, among equal ranks, leftmost first. That is how
// SentencePiece (and llama.cpp's llm_tokenizer_spm) merge pieces of equal score, which a list's order
// cannot say; GGUF SentencePiece vocabularies use it (tokenizer/gguf_tokenizer.cc). Absent, a merge's
// rank is its place in the list.
//
// Speed: words are cached (bounded, shared by threads), and a word is merged with a min-heap of
// candidate merges over a linked list of symbols, O(n log n) in the word's length.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "slimkv/status.h"
#include "tokenizer/json_field.h"

namespace slimkv {

class BpeModel {
 public:
  // `spec` is the "model" object; `path` its place in the file, for errors.
  static Expected<BpeModel> from_json(const json_field::Json& spec, const std::string& path);

  // Appends the ids of one word (non-empty, valid UTF-8) to `ids`.
  void tokenize(std::string_view word, std::vector<int32_t>& ids) const;

  std::optional<int32_t> token_id(std::string_view token) const;
  // The token text of `id`, or nullptr when no vocabulary entry has that id.
  const std::string* token_text(int32_t id) const;
  // Number of vocabulary entries (HF's BPE::get_vocab_size).
  size_t vocab_entries() const { return vocab_.size(); }
  // Largest id in the vocabulary, -1 when it is empty.
  int32_t max_id() const { return max_id_; }

  BpeModel(BpeModel&&) noexcept;
  BpeModel& operator=(BpeModel&&) noexcept;
  ~BpeModel();

 private:
  BpeModel();

  // A string-keyed map that can be searched with a string_view without allocating.
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

  // HF's BPE::merge_word: characters to initial symbols (with unk/byte fallback), then merges.
  void merge_word(std::string_view word, std::vector<int32_t>& ids) const;

  Vocab vocab_;
  std::unordered_map<int32_t, std::string> vocab_by_id_;
  std::unordered_map<uint64_t, Merge> merges_;
  int32_t max_id_ = -1;
  std::optional<std::string> unk_token_;
  std::optional<int32_t> unk_id_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::optional<int32_t> byte_token_ids_[256];  // ids of <0x00>..<0xFF>, when byte_fallback

  struct WordCache;
  std::unique_ptr<WordCache> cache_;
};

}  // namespace slimkv
