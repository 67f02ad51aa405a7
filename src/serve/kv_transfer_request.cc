#include "serve/kv_transfer_request.h"

namespace slimkv {
namespace {

using nlohmann::json;

// A request id: what the router assigns (32 hex digits), or any short printable tag.
std::optional<ApiError> check_request_id(const json& value, const std::string& field, std::string& out) {
  if (!value.is_string() || value.get<std::string>().empty() || value.get<std::string>().size() > 256) {
    return ApiError::bad_field(field, field + ": must be a string of 1 to 256 characters (the router's request id)");
  }
  out = value.get<std::string>();
  for (const char c : out) {
    if (c < 0x21 || c > 0x7e) return ApiError::bad_field(field, field + ": must be printable ASCII without spaces");
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_kv_transfer_field(std::string_view body, std::optional<KvTransferField>& out) {
  out.reset();
  const json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object() || !parsed.contains("kv_transfer") || parsed["kv_transfer"].is_null()) return std::nullopt;
  const json& field = parsed["kv_transfer"];
  if (!field.is_object()) return ApiError::bad_field("kv_transfer", "kv_transfer: must be an object {request_id, timeout_s}");
  KvTransferField result;
  if (!field.contains("request_id")) return ApiError::bad_field("kv_transfer.request_id", "kv_transfer.request_id: is required");
  if (auto error = check_request_id(field["request_id"], "kv_transfer.request_id", result.request_id)) return error;
  if (field.contains("timeout_s") && !field["timeout_s"].is_null()) {
    const json& timeout = field["timeout_s"];
    if (!timeout.is_number() || timeout.get<double>() <= 0 || timeout.get<double>() > 3600) {
      return ApiError::bad_field("kv_transfer.timeout_s", "kv_transfer.timeout_s: must be a number of seconds in (0, 3600]");
    }
    result.timeout = std::chrono::milliseconds(int64_t(timeout.get<double>() * 1000));
  }
  out = std::move(result);
  return std::nullopt;
}

std::optional<ApiError> parse_prefill_request(std::string_view body, PrefillRequest& out) {
  const json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) return ApiError::bad_field("", "the body must be a JSON object");
  if (!parsed.contains("request_id")) return ApiError::bad_field("request_id", "request_id: is required");
  if (auto error = check_request_id(parsed["request_id"], "request_id", out.request_id)) return error;
  const json endpoint = parsed.value("endpoint", json());
  if (endpoint != "/v1/completions" && endpoint != "/v1/chat/completions") {
    return ApiError::bad_field("endpoint", "endpoint: must be \"/v1/completions\" or \"/v1/chat/completions\"");
  }
  out.endpoint = endpoint.get<std::string>();
  out.chat = out.endpoint == "/v1/chat/completions";
  if (!parsed.contains("request") || !parsed["request"].is_object()) {
    return ApiError::bad_field("request", "request: must be the client's request body (a JSON object)");
  }
  out.request = parsed["request"];
  if (!parsed.contains("decode_kv_address") || !parsed["decode_kv_address"].is_string() ||
      parsed["decode_kv_address"].get<std::string>().empty()) {
    return ApiError::bad_field("decode_kv_address", "decode_kv_address: must be the decode worker's kv_address (host:port)");
  }
  out.decode_kv_address = parsed["decode_kv_address"].get<std::string>();
  out.resume_token_ids.clear();
  if (parsed.contains("resume_token_ids") && !parsed["resume_token_ids"].is_null()) {
    if (!parsed["resume_token_ids"].is_array()) {
      return ApiError::bad_field("resume_token_ids", "resume_token_ids: must be an array of token ids");
    }
    for (const json& id : parsed["resume_token_ids"]) {
      if (!id.is_number_integer()) {
        return ApiError::bad_field("resume_token_ids", "resume_token_ids: " + id.dump() + " is not a token id");
      }
      out.resume_token_ids.push_back(id.get<int64_t>());
    }
  }
  out.attempt = 0;
  if (parsed.contains("attempt") && !parsed["attempt"].is_null()) {
    if (!parsed["attempt"].is_number_unsigned() || parsed["attempt"].get<uint64_t>() > 1000000) {
      return ApiError::bad_field("attempt", "attempt: must be an integer from 0 to 1000000");
    }
    out.attempt = parsed["attempt"].get<int>();
  }
  return std::nullopt;
}

}  // namespace slimkv
