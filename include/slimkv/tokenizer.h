// A text tokenizer that reproduces Hugging Face `tokenizers` exactly from a tokenizer.json:
// encode gives the ids of `tokenizer.encode(text, add_special_tokens=...).ids` and decode the text
// of `tokenizer.decode(ids, skip_special_tokens=...)`.
//
// Pipeline (HF's order): added tokens are cut out of the raw text -> normalizer -> added tokens
// with normalized=true -> pre-tokenizer -> BPE model per word -> post-processor. Decoding maps ids
// to token strings and runs the decoder.
//
// Supported: model BPE (WordPiece, Unigram, WordLevel are refused); the normalizers, pre-tokenizers,
// post-processors and decoders listed in their headers. Anything else is a load error naming the
// field. Non-null "truncation"/"padding" are refused (they would change the ids of encode).
//
// Differences from HF, by design:
//   - Input text with invalid UTF-8 (HF only accepts valid strings) is first made valid by replacing
//     each invalid sequence with U+FFFD, as String::from_utf8_lossy does.
//   - Added-token ids in the file must be those HF would assign; HF warns and reassigns, we refuse.
//
// Thread safety: a loaded Tokenizer is immutable except for an internal word cache that is locked;
// encode and decode may be called from many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "slimkv/status.h"

namespace slimkv {

class AddedVocabulary;
class BpeModel;
class Decoder;
class Normalizer;
class PostProcessor;
class PreTokenizer;

class Tokenizer {
 public:
  static Expected<Tokenizer> load(const std::string& tokenizer_json_path);  // errors name the file
  // The tokenizer of a model: DIR/tokenizer.json, or, for a GGUF file, the one its metadata holds
  // (tokenizer.ggml.*, as `--model FILE.gguf` runs it).
  static Expected<Tokenizer> load_for_model(const std::string& model);
  // `source` names the text in errors (a path, or "<memory>").
  static Expected<Tokenizer> from_json(const std::string& json_text, const std::string& source);

  // Exactly HF `tokenizer.encode(text, add_special_tokens=...).ids`.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Exactly HF `tokenizer.decode(ids, skip_special_tokens=...)`. Unknown ids are skipped, as in HF.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  int64_t vocab_size() const;  // including added tokens (max id + 1)
  std::optional<int32_t> token_id(std::string_view token) const;  // vocab or added token
  bool is_special(int32_t id) const;
  // The token string of `id` (an added token's text, or the model's token), if any.
  std::optional<std::string> token_text(int32_t id) const;

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

 private:
  Tokenizer();

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<AddedVocabulary> added_vocabulary_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
};

// For streaming generation: feed ids one at a time, get the text that became complete (the
// Tokenizer must outlive the StreamingDecoder). It never
// splits a UTF-8 character: bytes are held back until they decode without a trailing U+FFFD, as
// HF's DecodeStream does (and with the same context handling, so decoders that strip a leading space
// from the first token still give " word" for later tokens).
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  // The new text completed by `id` (often empty while a character is incomplete).
  std::string push(int32_t id);
  // Everything still held back (incomplete characters become U+FFFD); the stream starts afresh.
  std::string finish();

 private:
  // The part of `text` (the decode of ids_) that is new past prefix_.
  std::string text_after_prefix(const std::string& text) const;

  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;  // context ids, then the ids not yet emitted
  std::string prefix_;        // decode of ids_[0, prefix_index_)
  size_t prefix_index_ = 0;
};

}  // namespace slimkv
