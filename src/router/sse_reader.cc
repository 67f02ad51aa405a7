#include "router/sse_reader.h"

#include <optional>

namespace slimkv {
namespace {

// The data of one event's lines (SSE: "data:" then an optional space, the rest of the line); none for an
// event of comments only (a keep-alive).
std::optional<std::string> event_data(std::string_view event) {
  std::string data;
  bool any = false;
  while (!event.empty()) {
    const size_t end = event.find('\n');
    std::string_view line = event.substr(0, end);
    event = end == std::string_view::npos ? std::string_view() : event.substr(end + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.starts_with("data:")) continue;
    line.remove_prefix(5);
    if (line.starts_with(' ')) line.remove_prefix(1);
    if (any) data += '\n';
    data += line;
    any = true;
  }
  if (!any) return std::nullopt;
  return data;
}

}  // namespace

std::vector<std::string> SseReader::feed(std::string_view bytes) {
  buffer_ += bytes;
  std::vector<std::string> events;
  size_t start = 0;
  while (true) {
    // An event ends at a blank line: "\n\n" or "\r\n\r\n".
    const size_t lf = buffer_.find("\n\n", start);
    const size_t crlf = buffer_.find("\r\n\r\n", start);
    const size_t end = std::min(lf, crlf);
    if (end == std::string::npos) break;
    const std::string_view event(buffer_.data() + start, end - start);
    if (std::optional<std::string> data = event_data(event)) events.push_back(std::move(*data));
    start = end + (end == lf ? 2 : 4);
  }
  buffer_.erase(0, start);
  return events;
}

}  // namespace slimkv
