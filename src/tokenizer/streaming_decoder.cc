// StreamingDecoder: HF's DecodeStream (step_decode_stream), which emits the text a new id completes.
#include "slimkv/tokenizer.h"
#include "tokenizer/utf8.h"

namespace slimkv {
namespace {

bool ends_with_replacement(const std::string& text) { return text.ends_with(utf8::kReplacementChar); }

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
  std::string new_text = text_after_prefix(text);
  const size_t new_prefix_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  prefix_ = tokenizer_->decode(ids_, skip_special_tokens_);
  prefix_index_ = new_prefix_index;
  return new_text;
}

std::string StreamingDecoder::text_after_prefix(const std::string& text) const {
  if (text.starts_with(prefix_)) return text.substr(prefix_.size());
  // HF fails here (DecodeStreamError::InvalidPrefix): the context decodes differently once the new
  // id is appended, e.g. a byte-fallback run that turned invalid. The pending ids decoded on their
  // own are the best continuation.
  const std::span<const int32_t> pending(ids_.data() + prefix_index_, ids_.size() - prefix_index_);
  return tokenizer_->decode(pending, skip_special_tokens_);
}

std::string StreamingDecoder::finish() {
  std::string rest;
  if (!ids_.empty()) {
    rest = text_after_prefix(tokenizer_->decode(ids_, skip_special_tokens_));
  }
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
  return rest;
}

}  // namespace slimkv
