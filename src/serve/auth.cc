#include "serve/auth.h"

namespace slimkv {

bool bearer_key_matches(std::string_view authorization_header, std::string_view api_key) {
  if (api_key.empty()) return true;
  constexpr std::string_view kScheme = "Bearer ";
  if (!authorization_header.starts_with(kScheme)) return false;
  const std::string_view given = authorization_header.substr(kScheme.size());
  unsigned char difference = given.size() == api_key.size() ? 0 : 1;
  for (size_t i = 0; i < api_key.size(); ++i) {
    difference |= (unsigned char)(api_key[i] ^ (i < given.size() ? given[i] : 0));
  }
  return difference == 0;
}

}  // namespace slimkv
