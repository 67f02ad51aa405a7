#include "router/upstream.h"

#include <chrono>
#include <thread>

namespace slimkv {
namespace {

void set_timeout(double seconds, const std::function<void(time_t, time_t)>& setter) {
  const auto whole = time_t(seconds);
  setter(whole, time_t((seconds - double(whole)) * 1e6));
}

}  // namespace

Expected<WorkerAddress> parse_worker_url(const std::string& url) {
  const auto bad = [&](const std::string& why) {
    return error("worker URL '", url, "': ", why, " (expected http://HOST:PORT, e.g. http://127.0.0.1:8001)");
  };
  std::string rest = url;
  if (rest.starts_with("http://")) rest = rest.substr(7);
  else if (rest.find("://") != std::string::npos) return bad("only http:// is supported");
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos) return bad("a worker URL has no path");
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon + 1 == rest.size()) return bad("no port");
  WorkerAddress address;
  address.url = url;
  address.host = rest.substr(0, colon);
  if (address.host.size() >= 2 && address.host.front() == '[' && address.host.back() == ']') {
    address.host = address.host.substr(1, address.host.size() - 2);
  }
  if (address.host.empty()) return bad("no host");
  const std::string port = rest.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return bad("the port is not a number");
  address.port = std::stoi(port);
  if (address.port < 1 || address.port > 65535) return bad("the port is not in 1..65535");
  return address;
}

UpstreamCall::UpstreamCall(const WorkerAddress& address, const HttpTimeouts& timeouts)
    : client_(address.host, address.port), connect_timeout_s_(timeouts.connect_s) {
  set_timeout(timeouts.connect_s, [this](time_t s, time_t us) { client_.set_connection_timeout(s, us); });
  set_timeout(timeouts.read_s, [this](time_t s, time_t us) { client_.set_read_timeout(s, us); });
  set_timeout(timeouts.read_s, [this](time_t s, time_t us) { client_.set_write_timeout(s, us); });
  client_.set_keep_alive(false);
}

httplib::Result UpstreamCall::send(httplib::Request& request) {
  sending_ = true;
  if (cancelled_) {
    sending_ = false;
    return httplib::Result(nullptr, httplib::Error::Canceled);
  }
  httplib::Result result = client_.send(request);
  sending_ = false;
  if (cancelled_ && result) return httplib::Result(nullptr, httplib::Error::Canceled);
  return result;
}

void UpstreamCall::cancel() {
  cancelled_ = true;
  // stop() shuts the socket of a request in flight; one still connecting has no socket to shut yet, so
  // repeat until send() has returned (bounded: the connect timeout ends it anyway).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(connect_timeout_s_ + 1.0);
  while (sending_ && std::chrono::steady_clock::now() < deadline) {
    client_.stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string describe(httplib::Error error) {
  switch (error) {
    case httplib::Error::Connection: return "cannot connect (refused or unreachable)";
    case httplib::Error::Read: return "the connection broke or timed out while reading the answer";
    case httplib::Error::Write: return "the connection broke or timed out while sending the request";
    case httplib::Error::ConnectionTimeout: return "the connection timed out";
    case httplib::Error::Canceled: return "cancelled";
    default: return httplib::to_string(error);
  }
}

}  // namespace slimkv
