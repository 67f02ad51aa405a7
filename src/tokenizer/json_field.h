// Checked access to the fields of a parsed tokenizer.json. Every error names the field by its path
// in the file ("pre_tokenizer.pretokenizers[1].pattern") and says what was expected and found; no
// nlohmann exception ever leaves these functions.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "slimkv/status.h"
#include "tokenizer/regex.h"

namespace slimkv::json_field {

using Json = nlohmann::json;

// "a.b" / "a[3]": the path of a member or element, for error messages.
std::string member_path(const std::string& path, std::string_view key);
std::string element_path(const std::string& path, size_t index);

// "a string", "null", "an array", ...: what a value is, for "expected X, found Y".
std::string describe(const Json& value);

// The member `key` of `object`, or nullptr when it is missing (or `object` is not an object).
const Json* find(const Json& object, std::string_view key);

// `object` must be a JSON object (error: "<path>: expected an object, found ...").
Status expect_object(const Json& value, const std::string& path);

Expected<std::string> required_string(const Json& object, std::string_view key, const std::string& path);
// Missing or null gives nullopt.
Expected<std::optional<std::string>> optional_string(const Json& object, std::string_view key,
                                                     const std::string& path);
// Missing or null gives `fallback`.
Expected<bool> optional_bool(const Json& object, std::string_view key, const std::string& path,
                             bool fallback);
Expected<int64_t> required_int(const Json& object, std::string_view key, const std::string& path);
Expected<int64_t> optional_int(const Json& object, std::string_view key, const std::string& path,
                               int64_t fallback);
// A string holding exactly one character (Rust `char` fields such as Metaspace's replacement).
Expected<char32_t> required_char(const Json& object, std::string_view key, const std::string& path);

// A pattern field as HF writes it: {"String": "literal"} or {"Regex": "oniguruma pattern"}.
Expected<Regex> required_pattern(const Json& object, std::string_view key, const std::string& path);

// A token id: an integer in [0, 2^31 - 1].
Expected<int32_t> as_token_id(const Json& value, const std::string& path);

}  // namespace slimkv::json_field
