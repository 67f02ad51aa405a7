// How the router talks to one worker: its address (from --prefill/--decode URLs), the timeouts every
// call has, and a call that another thread can cancel (a client that left, a sibling call that failed).
#pragma once

#include <atomic>
#include <string>

#include <httplib.h>

#include "slimkv/status.h"

namespace slimkv {

struct WorkerAddress {
  std::string url;   // as given, for messages and metric labels: http://host:port
  std::string host;  // a name, an IPv4 address or an IPv6 one (without brackets)
  int port = 0;
};

// "http://host:port", "host:port" or "http://[::1]:port"; errors quote the URL and say what is expected.
Expected<WorkerAddress> parse_worker_url(const std::string& url);

struct HttpTimeouts {
  double connect_s = 2;
  double read_s = 90;  // silence mid-answer
};

// One HTTP request to a worker at a time; cancel() from any thread ends a running send() soon (its
// socket is shut), and every later send() at once, with httplib::Error::Canceled.
class UpstreamCall {
 public:
  UpstreamCall(const WorkerAddress& address, const HttpTimeouts& timeouts);
  httplib::Result send(httplib::Request& request);
  void cancel();
  bool cancelled() const { return cancelled_.load(); }

 private:
  httplib::Client client_;
  double connect_timeout_s_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> sending_{false};
};

// "connection refused", "timed out", ...: a failed call's reason, for messages.
std::string describe(httplib::Error error);

}  // namespace slimkv
