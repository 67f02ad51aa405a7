// Decoders: how HF turns token strings back into text (tokenizer.json "decoder"). Supported:
// ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "slimkv/status.h"
#include "tokenizer/json_field.h"

namespace slimkv {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // HF's decode_chain: rewrites the list of token strings; the text is their concatenation.
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// Builds the decoder that `spec` (at `path` in the file) describes; null gives nullptr.
Expected<std::unique_ptr<Decoder>> parse_decoder(const json_field::Json& spec, const std::string& path);

}  // namespace slimkv
