// Reads a server-sent event stream as it arrives, in pieces cut anywhere: whole events out, each the
// data of its "data:" lines (joined by newlines); comments (": waiting") and other fields are skipped.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace slimkv {

class SseReader {
 public:
  // Takes the next bytes; returns the data of the events they completed.
  std::vector<std::string> feed(std::string_view bytes);
  // Bytes of an event not yet ended by a blank line (a stream cut mid-event leaves some).
  size_t pending_bytes() const { return buffer_.size(); }

 private:
  std::string buffer_;
};

}  // namespace slimkv
