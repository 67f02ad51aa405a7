// The request bodies of disaggregated serving (docs/disaggregated.md): the `kv_transfer` field a router
// adds to a decode worker's completion request, and POST /internal/v1/prefill's body to a prefill
// worker. Checked field by field like the completion request; errors are 400s naming the field.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/api_error.h"

namespace slimkv {

// "kv_transfer": {"request_id": ID, "timeout_s": 60}: generate from the KV stream tagged ID.
struct KvTransferField {
  std::string request_id;
  std::chrono::milliseconds timeout{60000};
};
// The field of a completion body, when present (`out` empty when not).
std::optional<ApiError> parse_kv_transfer_field(std::string_view body, std::optional<KvTransferField>& out);

// POST /internal/v1/prefill's body.
struct PrefillRequest {
  std::string request_id;
  std::string endpoint;  // "/v1/completions" or "/v1/chat/completions"
  bool chat = false;     // endpoint is the chat one
  nlohmann::json request;  // the client's body, checked later as that endpoint checks it
  std::string decode_kv_address;  // host:port of the decode worker's KV stream
  std::vector<int64_t> resume_token_ids;  // checked against the vocabulary later
  int attempt = 0;
};
std::optional<ApiError> parse_prefill_request(std::string_view body, PrefillRequest& out);

}  // namespace slimkv
