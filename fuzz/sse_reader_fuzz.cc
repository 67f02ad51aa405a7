// Fuzzes the router's SSE reader (src/router/sse_reader.h), which reads a decode worker's stream as it
// arrives: for any bytes, fed whole or cut into pieces anywhere (the cuts drawn from the input's first
// bytes), the events and the bytes left pending must be the same: a network that splits the stream
// differently never changes what the router relays. Each event's data must also be found in the input
// line by line (the reader only drops field names, one space and line ends).
// Seeds: fuzz/corpus/sse_reader_fuzz/ (decode worker streams: chunks with token_ids, keep-alive
// comments, CRLF line ends, multi-line data, an error event).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "router/sse_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // The first byte seeds the cut points; the rest is the stream.
  const uint8_t seed = data[0];
  const std::string_view stream(reinterpret_cast<const char*>(data + 1), size - 1);

  slimkv::SseReader whole;
  const std::vector<std::string> expected = whole.feed(stream);

  slimkv::SseReader pieces;
  std::vector<std::string> got;
  uint32_t state = seed | 1u;
  for (size_t at = 0; at < stream.size();) {
    state = state * 1103515245u + 12345u;
    const size_t length = std::min(stream.size() - at, size_t(1 + (state >> 16) % 17));
    for (std::string& event : pieces.feed(stream.substr(at, length))) got.push_back(std::move(event));
    at += length;
  }
  if (got != expected || pieces.pending_bytes() != whole.pending_bytes()) std::abort();
  for (const std::string& event : expected) {
    // Every data line of the event comes from the input.
    size_t start = 0;
    while (start <= event.size()) {
      const size_t end = std::min(event.find('\n', start), event.size());
      if (stream.find(std::string_view(event).substr(start, end - start)) == std::string_view::npos) std::abort();
      start = end + 1;
    }
  }
  return 0;
}
