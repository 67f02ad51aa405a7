#include "serve/sse.h"

namespace slimkv {

std::string sse_event(std::string_view json) {
  std::string event = "data: ";
  event += json;
  event += "\n\n";
  return event;
}

std::string sse_done() { return "data: [DONE]\n\n"; }

}  // namespace slimkv
