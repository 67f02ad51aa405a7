// --api-key: the /v1/ endpoints want "Authorization: Bearer <key>".
#pragma once

#include <string_view>

namespace slimkv {

// True when no key is configured, or the header carries it. The comparison takes the same time
// wherever the first difference is, so the key cannot be guessed byte by byte from response times.
bool bearer_key_matches(std::string_view authorization_header, std::string_view api_key);

}  // namespace slimkv
