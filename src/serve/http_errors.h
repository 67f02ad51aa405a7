// Sending ApiErrors over cpp-httplib: one error as a response, and the handlers that give the errors
// cpp-httplib answers itself (no route, a body over the limit, a malformed request, an exception in a
// handler) OpenAI's envelope too. Shared by serve and the router.
#pragma once

#include <cstddef>

#include <httplib.h>

#include "serve/api_error.h"

namespace slimkv {

void send_error(httplib::Response& response, const ApiError& error);

// Installs the error and exception handlers on `server`; 413's message names `max_body_bytes`.
void install_error_handlers(httplib::Server& server, size_t max_body_bytes);

}  // namespace slimkv
