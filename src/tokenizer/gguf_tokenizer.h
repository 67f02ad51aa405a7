// The tokenizer a GGUF file carries in its metadata (`tokenizer.ggml.*`), as the tokenizer.json that
// says the same thing, so that it runs through slimkv's one BPE implementation.
//
// Read: tokenizer.ggml.model, .tokens (by id), .token_type (3 control and 4 user-defined tokens
// become added tokens, special or not, as the converter derived them), .bos/eos_token_id and
// .add_bos_token/.add_eos_token (the post-processor). Then per model:
//   "gpt2" (byte-level BPE): .merges ("a b", by rank) and .pre (the pre-tokenizer: a row of
//     kPreTokenizers in the .cc, named as llama.cpp names them);
//   "llama" (SentencePiece: Llama 2, Mistral v0.1, Gemma): .scores, the merges derived from them as
//     transformers does for tokenizer.json (merges of equal score ranked equal, so that the leftmost
//     merges first, as in llama.cpp), byte fallback to <0xNN> tokens, ▁ for spaces and
//     .add_space_prefix (default true, as llama.cpp's).
// Other models and pre-tokenizers are refused, naming the key and the value.
#pragma once

#include <string>

#include "slimkv/status.h"
#include "slimkv/tokenizer.h"
#include "tensor/gguf.h"

namespace slimkv {

// tokenizer.json text equivalent to the file's tokenizer; errors name the file and the key.
Expected<std::string> gguf_tokenizer_json(const GgufFile& file);

// The tokenizer of the GGUF file at `path`.
Expected<Tokenizer> load_gguf_tokenizer(const std::string& path);

// tokenizer.chat_template, or an empty string when the file has none.
Expected<std::string> gguf_chat_template(const GgufFile& file);

}  // namespace slimkv
