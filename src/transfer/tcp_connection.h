// TCP on POSIX sockets for the KV stream: a connection whose every read and write has a deadline (a peer
// that dies or stops reading fails the call, never hangs it), and a listener that accepts with one.
// Addresses are "host:port" ("127.0.0.1:9000", "[::1]:9000", "decode-0.slimkv:9000").
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "slimkv/status.h"

namespace slimkv {

using SteadyClock = std::chrono::steady_clock;

struct HostPort {
  std::string host;
  int port = 0;
};
// Splits "host:port" (IPv6 hosts in brackets); errors name the address and what was expected.
Expected<HostPort> parse_host_port(const std::string& address);

class TcpConnection {
 public:
  TcpConnection() = default;
  explicit TcpConnection(int fd) : fd_(fd) {}
  TcpConnection(TcpConnection&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)), peer_(std::move(other.peer_)), cancel_(other.cancel_) {}
  TcpConnection& operator=(TcpConnection&& other) noexcept;
  ~TcpConnection() { close(); }

  // Connects to `address` within `timeout`.
  static Expected<TcpConnection> connect(const std::string& address, std::chrono::milliseconds timeout);

  // All `size` bytes, or an error (the peer closed, reset, or the deadline passed first).
  Status write_all(const uint8_t* data, size_t size, SteadyClock::time_point deadline);
  Status read_exact(uint8_t* data, size_t size, SteadyClock::time_point deadline);
  // The same into several places in turn (readv): every byte of each of `pieces`, in order.
  Status read_exact(std::span<const std::span<uint8_t>> pieces, SteadyClock::time_point deadline);
  // The peer's "host:port", for messages.
  const std::string& peer() const { return peer_; }
  void set_peer(std::string peer) { peer_ = std::move(peer); }
  // A flag that, once true, fails the waits of later and pending reads and writes within ~100 ms (a
  // server shutting down); nullptr: none. It must outlive the connection's calls.
  void set_cancel_flag(const std::atomic<bool>* cancel) { cancel_ = cancel; }
  bool is_open() const { return fd_ >= 0; }
  // Ends this side's sending (the peer reads EOF) and keeps reading possible.
  void shutdown_write();
  // Ends our side and reads the peer's bytes away until it closes or `deadline`: a close with unread
  // bytes would reset the connection, and a reset can discard the answer just written before the peer
  // reads it (the "lingering close" of HTTP servers).
  void close_after_drain(SteadyClock::time_point deadline);
  void close();

 private:
  // Waits until the socket is ready for `events`; an error when the deadline passes or cancel_ is set.
  Status wait_ready(short events, SteadyClock::time_point deadline, const char* what, size_t bytes_left) const;

  int fd_ = -1;
  std::string peer_;
  const std::atomic<bool>* cancel_ = nullptr;
};

class TcpListener {
 public:
  TcpListener() = default;
  TcpListener(TcpListener&& other) noexcept : fd_(std::exchange(other.fd_, -1)), port_(other.port_) {}
  TcpListener& operator=(TcpListener&&) = delete;
  ~TcpListener();

  // Listens on host:port (port 0: any free port; port() says which).
  static Expected<TcpListener> listen(const std::string& host, int port);
  int port() const { return port_; }
  // The next connection, or an empty one when `timeout` passes first (so the caller can check for
  // shutdown); an error when the socket fails.
  Expected<TcpConnection> accept(std::chrono::milliseconds timeout);

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace slimkv
