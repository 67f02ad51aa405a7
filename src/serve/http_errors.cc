#include "serve/http_errors.h"

#include <exception>
#include <string>

namespace slimkv {

void send_error(httplib::Response& response, const ApiError& error) {
  response.status = error.status;
  response.set_content(error.body(), "application/json");
}

void install_error_handlers(httplib::Server& server, size_t max_body_bytes) {
  // Responses that already have a body (an ApiError sent by a handler) are left alone.
  server.set_error_handler(httplib::Server::HandlerWithResponse(
      [max_body_bytes](const httplib::Request& request, httplib::Response& response) {
        if (!response.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        if (response.status == 404) send_error(response, ApiError::not_found(request.path));
        else if (response.status == 413) send_error(response, ApiError::body_too_large(max_body_bytes));
        else send_error(response, ApiError::malformed_http(response.status));
        return httplib::Server::HandlerResponse::Handled;
      }));
  server.set_exception_handler([](const httplib::Request&, httplib::Response& response, std::exception_ptr error) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(response, ApiError::internal("the server failed this request: " + what));
  });
}

}  // namespace slimkv
