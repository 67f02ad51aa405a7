// Post-processors: the special tokens HF adds around an encoded sequence when add_special_tokens
// is true (tokenizer.json "post_processor"). Supported: TemplateProcessing (the "single" template),
// RobertaProcessing, BertProcessing, ByteLevel (ids unchanged), Sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "slimkv/status.h"
#include "tokenizer/json_field.h"

namespace slimkv {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Rewrites the ids of one sequence; most processors only act when add_special_tokens is true.
  virtual void process(std::vector<int32_t>& ids, bool add_special_tokens) const = 0;
};

// Builds the post-processor that `spec` (at `path` in the file) describes; null gives nullptr.
Expected<std::unique_ptr<PostProcessor>> parse_post_processor(const json_field::Json& spec,
                                                              const std::string& path);

}  // namespace slimkv
