// Token-id lists as users write them (`slimkv logits --tokens 1,2,3`, `--tokens-file`): one parser,
// fuzzed (fuzz/token_ids_fuzz.cc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "slimkv/status.h"

namespace slimkv {

// Non-negative decimal ids (at most INT32_MAX) separated by commas and/or whitespace. `source` names
// where the text came from ("--tokens" or a file) in errors; a bad piece is quoted escaped and cut.
Expected<std::vector<int32_t>> parse_token_ids(std::string_view text, const std::string& source);

}  // namespace slimkv
