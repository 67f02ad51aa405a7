// Errors as the OpenAI API returns them: {"error": {"message", "type", "param", "code"}} with the
// HTTP status that says who is at fault. Every error the server sends is built here.
#pragma once

#include <string>

namespace slimkv {

struct ApiError {
  int status = 400;
  std::string message;                        // what was wrong and what was expected
  std::string type = "invalid_request_error";  // OpenAI's error types
  std::string param;                          // the request field at fault ("" when none)
  std::string code;                           // a machine-readable reason ("" when none)

  // The JSON body: {"error": {...}}, param and code null when empty.
  std::string body() const;

  // 400: a field's value (or the body's JSON) is wrong; the message names the field.
  static ApiError bad_field(std::string param, std::string message);
  static ApiError unauthorized();                             // 401: no valid bearer key
  static ApiError unknown_model(const std::string& model, const std::string& served);  // 404
  static ApiError not_found(const std::string& path);         // 404: no such endpoint
  static ApiError body_too_large(size_t max_bytes);           // 413
  static ApiError unavailable(std::string message);           // 503: loading or shutting down
  static ApiError internal(std::string message);              // 500: the engine failed the request
  static ApiError malformed_http(int status);                  // what cpp-httplib refused itself
  // Disaggregated serving (docs/disaggregated.md):
  static ApiError timeout(std::string message);             // 504: the request's KV stream never arrived
  static ApiError kv_refused(std::string message);          // 409: the decode worker refused the KV stream
  static ApiError kv_transfer_failed(std::string message);  // 502: the KV stream to the decode worker failed
};

}  // namespace slimkv
