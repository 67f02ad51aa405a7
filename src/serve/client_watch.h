// Notices a client that leaves while its non-streamed answer is being computed. A stream notices it when
// a write fails (every second at most), but a whole answer is written once, at the end: without this, a
// request whose client left would run to its end, holding its KV. cpp-httplib (0.11) does not hand
// the handler its socket, so the watch finds it among this process's descriptors by the connection's
// two addresses, and polls it: the client's end closed (EOF with nothing unread) or reset means gone.
// A client that half-closes its sending side while it waits (legal HTTP/1.1, rare) counts as gone too.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include <httplib.h>

namespace slimkv {

class ClientWatch {
 public:
  // Watches the connection `request` arrived on; calls `on_leave` once, on the watch's own thread, if
  // its client leaves before the watch ends. A connection not found (not TCP) is not watched.
  ClientWatch(const httplib::Request& request, std::function<void()> on_leave,
              std::chrono::milliseconds interval = std::chrono::milliseconds(100));
  ~ClientWatch();  // stops watching and joins
  ClientWatch(const ClientWatch&) = delete;
  ClientWatch& operator=(const ClientWatch&) = delete;

  bool watching() const { return fd_ >= 0; }
  bool client_left() const { return left_; }

 private:
  int fd_ = -1;
  std::atomic<bool> left_{false};
  std::mutex mutex_;
  std::condition_variable stop_;
  bool stopping_ = false;
  std::thread thread_;
};

// This process's socket connected from local_port to remote_addr:remote_port (numeric host, as
// cpp-httplib writes Request::remote_addr), or -1.
int find_connection_socket(const std::string& remote_addr, int remote_port, int local_port);
// True once the peer of the connected socket `fd` has closed its end with nothing left unread, or the
// connection failed. Never blocks.
bool peer_closed(int fd);

}  // namespace slimkv
