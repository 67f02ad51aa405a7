#include "transfer/tcp_connection.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>
#include <vector>

namespace slimkv {
namespace {

int milliseconds_until(SteadyClock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
  return left <= 0 ? 0 : int(std::min<int64_t>(left, 1 << 30));
}

// Waits until fd is ready for `events`; false when the deadline passed first.
bool poll_ready(int fd, short events, SteadyClock::time_point deadline) {
  for (;;) {
    pollfd poll_fd{fd, events, 0};
    const int ready = ::poll(&poll_fd, 1, milliseconds_until(deadline));
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) return true;  // the read or write that follows reports the error
  }
}

void set_nonblocking_nodelay(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // frames are whole messages: no Nagle delay
}

}  // namespace

Expected<HostPort> parse_host_port(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return error("address '", address, "': expected host:port (e.g. 127.0.0.1:9000 or [::1]:9000)");
  }
  HostPort out;
  out.host = address.substr(0, colon);
  if (out.host.front() == '[' && out.host.back() == ']') out.host = out.host.substr(1, out.host.size() - 2);
  const std::string port = address.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) < 1 ||
      std::stoi(port) > 65535) {
    return error("address '", address, "': the port must be a number from 1 to 65535");
  }
  out.port = std::stoi(port);
  return out;
}

TcpConnection& TcpConnection::operator=(TcpConnection&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = std::exchange(other.fd_, -1);
    peer_ = std::move(other.peer_);
    cancel_ = other.cancel_;
  }
  return *this;
}

void TcpConnection::shutdown_write() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
}

void TcpConnection::close_after_drain(SteadyClock::time_point deadline) {
  shutdown_write();
  uint8_t discard[16384];
  for (;;) {
    const ssize_t got = ::recv(fd_, discard, sizeof discard, 0);
    if (got > 0 || (got < 0 && errno == EINTR)) continue;
    if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) break;
    if (!wait_ready(POLLIN, deadline, "draining", 0).is_ok()) break;
  }
  close();
}

void TcpConnection::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Expected<TcpConnection> TcpConnection::connect(const std::string& address, std::chrono::milliseconds timeout) {
  SLIMKV_ASSIGN_OR_RETURN(HostPort target, parse_host_port(address));
  const SteadyClock::time_point deadline = SteadyClock::now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(target.host.c_str(), std::to_string(target.port).c_str(), &hints, &found); rc != 0) {
    return error("connecting to ", address, ": cannot resolve '", target.host, "': ", ::gai_strerror(rc));
  }
  std::string last_error = "no address";
  for (addrinfo* candidate = found; candidate; candidate = candidate->ai_next) {
    const int fd = ::socket(candidate->ai_family, candidate->ai_socktype | SOCK_CLOEXEC, candidate->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    TcpConnection connection(fd);
    connection.set_peer(address);
    set_nonblocking_nodelay(fd);
    if (::connect(fd, candidate->ai_addr, candidate->ai_addrlen) != 0 && errno != EINPROGRESS) {
      last_error = std::strerror(errno);
      continue;
    }
    if (!poll_ready(fd, POLLOUT, deadline)) {
      last_error = str_cat("no answer within ", timeout.count(), " ms");
      continue;
    }
    int socket_error = 0;
    socklen_t length = sizeof(socket_error);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &socket_error, &length);
    if (socket_error != 0) {
      last_error = std::strerror(socket_error);
      continue;
    }
    ::freeaddrinfo(found);
    return connection;
  }
  ::freeaddrinfo(found);
  return error("connecting to ", address, ": ", last_error);
}

Status TcpConnection::write_all(const uint8_t* data, size_t size, SteadyClock::time_point deadline) {
  while (size > 0) {
    const ssize_t sent = ::send(fd_, data, size, MSG_NOSIGNAL);
    if (sent > 0) {
      data += sent;
      size -= size_t(sent);
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      SLIMKV_RETURN_IF_ERROR(wait_ready(POLLOUT, deadline, "sending to", size));
      continue;
    }
    return error("sending to ", peer_, ": ", std::strerror(errno));
  }
  return Status::ok();
}

Status TcpConnection::read_exact(uint8_t* data, size_t size, SteadyClock::time_point deadline) {
  const std::span<uint8_t> whole(data, size);
  return read_exact(std::span(&whole, 1), deadline);
}

Status TcpConnection::read_exact(std::span<const std::span<uint8_t>> pieces, SteadyClock::time_point deadline) {
  std::vector<iovec> left;
  size_t size = 0;
  for (const std::span<uint8_t> piece : pieces) {
    if (!piece.empty()) left.push_back({piece.data(), piece.size()});
    size += piece.size();
  }
  size_t first = 0;  // the first piece not filled yet
  while (first < left.size()) {
    const ssize_t got = ::readv(fd_, left.data() + first, int(std::min<size_t>(left.size() - first, IOV_MAX)));
    if (got > 0) {
      size -= size_t(got);
      for (size_t n = size_t(got); n > 0;) {  // past the pieces it filled, into the one it filled in part
        const size_t taken = std::min(n, left[first].iov_len);
        left[first].iov_base = static_cast<uint8_t*>(left[first].iov_base) + taken;
        left[first].iov_len -= taken;
        n -= taken;
        if (left[first].iov_len == 0) ++first;
      }
      continue;
    }
    if (got == 0) return error("reading from ", peer_, ": the connection closed with ", size, " bytes still expected");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      SLIMKV_RETURN_IF_ERROR(wait_ready(POLLIN, deadline, "reading from", size));
      continue;
    }
    return error("reading from ", peer_, ": ", std::strerror(errno));
  }
  return Status::ok();
}

Status TcpConnection::wait_ready(short events, SteadyClock::time_point deadline, const char* what,
                                 size_t bytes_left) const {
  // In slices, so that a cancel flag is seen soon.
  for (;;) {
    if (cancel_ && cancel_->load()) return error(what, " ", peer_, ": cancelled (shutting down)");
    const SteadyClock::time_point now = SteadyClock::now();
    if (now >= deadline) {
      return error(what, " ", peer_, ": timed out with ", bytes_left, " bytes left (the peer stopped ",
                   events == POLLIN ? "sending" : "reading", ")");
    }
    if (poll_ready(fd_, events, std::min(deadline, now + std::chrono::milliseconds(100)))) return Status::ok();
  }
}

TcpListener::~TcpListener() {
  if (fd_ >= 0) ::close(fd_);
}

Expected<TcpListener> TcpListener::listen(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    return error("listening on ", host, ":", port, ": cannot resolve '", host, "': ", ::gai_strerror(rc));
  }
  std::string last_error = "no address";
  for (addrinfo* candidate = found; candidate; candidate = candidate->ai_next) {
    const int fd = ::socket(candidate->ai_family, candidate->ai_socktype | SOCK_CLOEXEC, candidate->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, candidate->ai_addr, candidate->ai_addrlen) != 0 || ::listen(fd, 64) != 0) {
      last_error = std::strerror(errno);
      ::close(fd);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
    TcpListener listener;
    listener.fd_ = fd;
    listener.port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                                 : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    ::freeaddrinfo(found);
    return listener;
  }
  ::freeaddrinfo(found);
  return error("listening on ", host, ":", port, ": ", last_error, " (in use, or not an address of this machine)");
}

Expected<TcpConnection> TcpListener::accept(std::chrono::milliseconds timeout) {
  if (!poll_ready(fd_, POLLIN, SteadyClock::now() + timeout)) return TcpConnection();
  sockaddr_storage peer{};
  socklen_t length = sizeof(peer);
  const int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&peer), &length, SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) return TcpConnection();
    return error("accepting a KV stream connection: ", std::strerror(errno));
  }
  set_nonblocking_nodelay(fd);
  char host[NI_MAXHOST] = "?", service[NI_MAXSERV] = "?";
  ::getnameinfo(reinterpret_cast<sockaddr*>(&peer), length, host, sizeof(host), service, sizeof(service),
                NI_NUMERICHOST | NI_NUMERICSERV);
  TcpConnection connection(fd);
  connection.set_peer(str_cat(host, ":", service));
  return connection;
}

}  // namespace slimkv
