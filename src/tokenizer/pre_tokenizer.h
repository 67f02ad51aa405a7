// Pre-tokenizers: how HF splits normalized text into words before BPE (tokenizer.json
// "pre_tokenizer"). Supported: ByteLevel, Split, Digits, Metaspace, Whitespace, WhitespaceSplit,
// Punctuation, CharDelimiterSplit, BertPreTokenizer, Sequence.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "slimkv/status.h"
#include "tokenizer/json_field.h"
#include "tokenizer/text_piece.h"

namespace slimkv {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits (and may rewrite) every piece that is not an added token; empty pieces are dropped,
  // added-token pieces pass through unchanged and in place.
  virtual void pre_tokenize(std::vector<TextPiece>& pieces) const = 0;
};

// Builds the pre-tokenizer that `spec` (at `path` in the file) describes; null gives nullptr.
Expected<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const json_field::Json& spec,
                                                            const std::string& path);

// GPT-2's pre-tokenization pattern, which ByteLevel uses when use_regex is true.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace slimkv
