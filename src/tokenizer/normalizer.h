// Normalizers: the text rewrites HF applies before pre-tokenization (tokenizer.json "normalizer").
// Supported: NFC, NFD, NFKC, NFKD (utf8proc), Lowercase, Replace, Prepend, Strip, Sequence.
#pragma once

#include <memory>
#include <string>

#include "slimkv/status.h"
#include "tokenizer/json_field.h"

namespace slimkv {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites valid UTF-8 `text` in place. Clears `keeps_start` when the first character of the
  // result no longer comes from the first character of the input (Strip removed leading spaces,
  // Replace deleted the start): HF tracks this through its alignments, and Metaspace's
  // prepend_scheme "first" depends on it.
  virtual void normalize(std::string& text, bool& keeps_start) const = 0;
};

// Builds the normalizer that `spec` (at `path` in the file) describes; null gives nullptr.
Expected<std::unique_ptr<Normalizer>> parse_normalizer(const json_field::Json& spec, const std::string& path);

}  // namespace slimkv
