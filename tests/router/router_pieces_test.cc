// The small pieces of slimkv router: the SSE reader (events cut anywhere), worker URLs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "router/sse_reader.h"
#include "router/upstream.h"
#include "serve/sse.h"

namespace slimkv {
namespace {

TEST(SseReader, ReadsEventsCutAtEveryByte) {
  const std::string stream = sse_event(R"({"a":1})") + ": waiting\n\n" + "data: two\ndata: lines\n\n" +
                             "event: x\r\ndata:{\"b\":2}\r\n\r\n" + sse_done();
  const std::vector<std::string> expected = {R"({"a":1})", "two\nlines", R"({"b":2})", "[DONE]"};
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    SseReader reader;
    std::vector<std::string> events = reader.feed(std::string_view(stream).substr(0, cut));
    for (const std::string& event : reader.feed(std::string_view(stream).substr(cut))) events.push_back(event);
    EXPECT_EQ(events, expected) << "cut at byte " << cut;
    EXPECT_EQ(reader.pending_bytes(), 0u);
  }
  SseReader reader;
  EXPECT_TRUE(reader.feed("data: half an event").empty());
  EXPECT_EQ(reader.pending_bytes(), 19u);
}

TEST(WorkerUrl, ParsesHostAndPort) {
  Expected<WorkerAddress> address = parse_worker_url("http://10.0.0.7:8001/");
  ASSERT_TRUE(address) << address.status().message();
  EXPECT_EQ(address->host, "10.0.0.7");
  EXPECT_EQ(address->port, 8001);
  address = parse_worker_url("http://[::1]:9");
  ASSERT_TRUE(address);
  EXPECT_EQ(address->host, "::1");
  address = parse_worker_url("decode-0.slimkv-decode:8000");
  ASSERT_TRUE(address);
  EXPECT_EQ(address->host, "decode-0.slimkv-decode");
  for (const char* bad : {"https://x:1", "http://x", "http://x:", "http://:80", "http://x:80/v1", "http://x:0", "http://x:8o"}) {
    Expected<WorkerAddress> refused = parse_worker_url(bad);
    ASSERT_FALSE(refused) << bad;
    EXPECT_NE(refused.status().message().find(bad), std::string::npos) << refused.status().message();
  }
}

}  // namespace
}  // namespace slimkv
