#include "serve/client_watch.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>

namespace slimkv {
namespace {

// The numeric host and port of a socket address; false if it is not IPv4 or IPv6.
bool numeric_address(const sockaddr_storage& address, socklen_t length, std::string& host, int& port) {
  if (address.ss_family != AF_INET && address.ss_family != AF_INET6) return false;
  char name[NI_MAXHOST] = {}, service[NI_MAXSERV] = {};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, name, sizeof(name), service, sizeof(service),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return false;
  }
  host = name;
  port = std::atoi(service);
  return true;
}

}  // namespace

int find_connection_socket(const std::string& remote_addr, int remote_port, int local_port) {
  std::error_code ignored;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ignored)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const int fd = std::stoi(name);
    struct stat info {};
    if (fstat(fd, &info) != 0 || !S_ISSOCK(info.st_mode)) continue;
    sockaddr_storage peer{}, local{};
    socklen_t peer_length = sizeof(peer), local_length = sizeof(local);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) != 0) {
      continue;  // a listening socket, or not connected
    }
    std::string peer_host, local_host;
    int peer_port = 0, own_port = 0;
    if (!numeric_address(peer, peer_length, peer_host, peer_port) || !numeric_address(local, local_length, local_host, own_port)) {
      continue;
    }
    if (peer_host == remote_addr && peer_port == remote_port && (local_port < 0 || own_port == local_port)) return fd;
  }
  return -1;
}

bool peer_closed(int fd) {
  pollfd watched{.fd = fd, .events = POLLIN | POLLRDHUP, .revents = 0};
  if (poll(&watched, 1, 0) <= 0) return false;
  if (watched.revents & (POLLERR | POLLNVAL)) return true;
  // Readable: the client's EOF (read gives 0) or bytes it sent after its request (a pipelined one).
  char byte = 0;
  const ssize_t got = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (got == 0) return true;
  if (got < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  return false;
}

ClientWatch::ClientWatch(const httplib::Request& request, std::function<void()> on_leave, std::chrono::milliseconds interval)
    : fd_(find_connection_socket(request.remote_addr, request.remote_port, request.local_port)) {
  if (fd_ < 0) return;
  // The descriptor stays this connection's while the handler runs: cpp-httplib closes it after.
  thread_ = std::thread([this, on_leave = std::move(on_leave), interval] {
    std::unique_lock lock(mutex_);
    while (!stop_.wait_for(lock, interval, [&] { return stopping_; })) {
      if (!peer_closed(fd_)) continue;
      left_ = true;
      lock.unlock();
      on_leave();
      return;
    }
  });
}

ClientWatch::~ClientWatch() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  stop_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace slimkv
