// slimkv router: the front of disaggregated serving (docs/disaggregated.md). It speaks serve's OpenAI API
// and runs each request on a prefill worker P and a decode worker D (`slimkv serve --role prefill|decode`):
// P computes the prompt's KV and streams it to D, D generates and streams tokens back through the router.
// Workers that fail are marked down and probed back; their requests are re-dispatched (a decode worker's
// with the tokens generated so far), so a client sees one complete response.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "slimkv/status.h"

namespace slimkv {

struct RouterConfig {
  std::vector<std::string> prefill_urls;  // http://host:port of each prefill worker
  std::vector<std::string> decode_urls;   // http://host:port of each decode worker
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (the one taken is printed)
  std::string api_key;  // "": no authentication (the workers' own keys: the client's header is passed on)
  int max_retries = 3;            // re-dispatches of one request (prefill and decode together) before a 502
  double connect_timeout_s = 2;   // to connect to a worker
  double read_timeout_s = 90;     // a worker's silence, mid-answer, before it counts as failed
  double kv_timeout_s = 60;       // what a decode worker waits for a request's KV (kv_transfer.timeout_s)
  double health_interval_s = 2;   // every worker's /health is probed this often (load; down ones come back)
  size_t max_body_bytes = size_t(32) << 20;
  int http_threads = 256;  // cpp-httplib holds one per open connection (each stream through the router)
};

// Probes the workers, listens, serves until SIGINT or SIGTERM, then stops accepting, lets the
// requests in flight finish (bounded) and returns ok. Errors: a bad URL, or the address cannot be bound.
Status run_router(const RouterConfig& config);

}  // namespace slimkv
