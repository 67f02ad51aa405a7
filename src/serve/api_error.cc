#include "serve/api_error.h"

#include <nlohmann/json.hpp>

namespace slimkv {
namespace {

ApiError make(int status, std::string message, std::string type, std::string param, std::string code) {
  ApiError error;
  error.status = status;
  error.message = std::move(message);
  error.type = std::move(type);
  error.param = std::move(param);
  error.code = std::move(code);
  return error;
}

}  // namespace

std::string ApiError::body() const {
  const auto or_null = [](const std::string& s) { return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s); };
  return nlohmann::json{{"error", {{"message", message}, {"type", type}, {"param", or_null(param)}, {"code", or_null(code)}}}}
      .dump();
}

ApiError ApiError::bad_field(std::string param, std::string message) {
  return make(400, std::move(message), "invalid_request_error", std::move(param), "");
}

ApiError ApiError::unauthorized() {
  return make(401, "missing or invalid API key: send the header 'Authorization: Bearer <key>' with the server's --api-key",
              "authentication_error", "", "invalid_api_key");
}

ApiError ApiError::unknown_model(const std::string& model, const std::string& served) {
  return make(404, "the model '" + model + "' does not exist here; this server serves '" + served + "'",
              "invalid_request_error", "model", "model_not_found");
}

ApiError ApiError::not_found(const std::string& path) {
  return make(404, "no endpoint " + path + " (see GET /v1/models, POST /v1/completions, POST /v1/chat/completions)",
              "invalid_request_error", "", "not_found");
}

ApiError ApiError::body_too_large(size_t max_bytes) {
  return make(413, "the request body is larger than the server's limit of " + std::to_string(max_bytes) + " bytes",
              "invalid_request_error", "", "request_too_large");
}

ApiError ApiError::unavailable(std::string message) {
  return make(503, std::move(message), "service_unavailable", "", "unavailable");
}

ApiError ApiError::internal(std::string message) {
  return make(500, std::move(message), "server_error", "", "internal_error");
}

ApiError ApiError::malformed_http(int status) {
  return make(status, "the HTTP request is malformed (status " + std::to_string(status) + ")", "invalid_request_error", "",
              "bad_http");
}

ApiError ApiError::timeout(std::string message) { return make(504, std::move(message), "timeout", "", "timeout"); }

ApiError ApiError::kv_refused(std::string message) {
  return make(409, std::move(message), "kv_refused", "", "kv_refused");
}

ApiError ApiError::kv_transfer_failed(std::string message) {
  return make(502, std::move(message), "kv_transfer_failed", "", "kv_transfer_failed");
}

}  // namespace slimkv
