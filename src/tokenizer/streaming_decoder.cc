// StreamingDecoder: HF's DecodeStream (step_decode_stream), which emits the text a new id completes.
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace slimkv {
namespace {

bool ends_with_replacement(const std::string& text) { return text.ends_with(utf8::kReplacementChar); }

// text.substr(from), with `from` moved forward to a character boundary.
std::string suffix_from(const std::string& text, size_t from) {
  while (from < text.size() && (static_cast<unsigned char>(text[from]) & 0xC0) == 0x80) ++from;
  return from < text.size() ? text.substr(from) : std::string();
}

}  // namespace

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string StreamingDecoder::push(int32_t id) {
  if (prefix_.empty() && !ids_.empty()) {
    std::string new_prefix = tokenizer_->decode(ids_, skip_special_tokens_);
    if (!ends_with_replacement(new_prefix)) {
      prefix_ = std::move(new_prefix);
      prefix_index_ = ids_.size();
    }
  }
  ids_.push_back(id);
  const std::string text = tokenizer_->decode(ids_, skip_special_tokens_);
  if (text.size() <= prefix_.size() || ends_with_replacement(text)) return std::string();
  // HF reports an error when the text no longer starts with the prefix (a decoder that rewrites
  // earlier text); we emit what lies past the prefix's length, which is the best continuation.
  std::string new_text = suffix_from(text, prefix_.size());
  const size_t new_prefix_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  prefix_ = tokenizer_->decode(ids_, skip_special_tokens_);
  prefix_index_ = new_prefix_index;
  return new_text;
}

std::string StreamingDecoder::finish() {
  std::string rest;
  if (!ids_.empty()) {
    const std::string text = tokenizer_->decode(ids_, skip_special_tokens_);
    if (text.size() > prefix_.size()) rest = suffix_from(text, prefix_.size());
  }
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
  return rest;
}

}  // namespace slimkv
