// A JSON syntax error as a message with file, line and column, the bytes at that place quoted escaped
// and cut (never echoed raw), for every config file we parse (config.json, tokenizer.json,
// generation_config.json, the shard index, tokenizer_config.json).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace slimkv {

// "SOURCE:LINE:COLUMN: not valid JSON: REASON (near "...")". `byte` is the parser's 1-based offset of
// the failure (nlohmann::json::parse_error::byte); `what` its what(), from which the reason is taken
// without the "last read" echo of raw input.
std::string json_syntax_error(std::string_view source, std::string_view text, size_t byte, std::string_view what);

}  // namespace slimkv
