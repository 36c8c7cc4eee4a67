// POSIX sockets for the TCP store and the tcp engine (tcp_socket.hpp). Every
// socket is non-blocking; each wait goes through poll() with what is left of
// the operation's deadline, so nothing here blocks past it.
#include "distributed/tcp_socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "rlx/error.hpp"

namespace rlx::distributed::detail {

void Socket::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

int Deadline::poll_ms(int cap) const {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end_ - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, cap));
}

std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", s);
  return text;
}

std::string errno_text(int err) {
  char buf[256];
  // The GNU strerror_r returns the message (possibly not in buf); it is thread-safe, unlike strerror.
  return ::strerror_r(err, buf, sizeof buf);
}

namespace {

std::string prefix(std::string_view ctx) { return std::string(ctx) + ": "; }

Socket new_socket(std::string_view ctx) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error(prefix(ctx) + "socket() failed: " + errno_text(errno));
  return Socket(fd);
}

// Waits for `events` on `s` until the deadline; false when it passed first.
bool wait_for(const Socket& s, short events, const Deadline& deadline) {
  pollfd p{s.fd(), events, 0};
  for (;;) {
    const int r = ::poll(&p, 1, deadline.poll_ms());
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

}  // namespace

sockaddr_in resolve_ipv4(const std::string& host, int port, std::string_view ctx) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1) return addr;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0 || !found)
    throw Error(prefix(ctx) + "cannot resolve '" + host + "' to an IPv4 address: " + ::gai_strerror(rc));
  std::memcpy(&addr.sin_addr, &reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr, sizeof addr.sin_addr);
  ::freeaddrinfo(found);
  return addr;
}

std::string address_text(const sockaddr_in& addr) {
  char host[INET_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET, &addr.sin_addr, host, sizeof host);
  return std::string(host) + ":" + std::to_string(ntohs(addr.sin_port));
}

Socket listen_on(const std::string& host, int port, std::string_view ctx) {
  const sockaddr_in addr = resolve_ipv4(host, port, ctx);
  Socket s = new_socket(ctx);
  // A restarted job can bind while the last one's connections linger in TIME_WAIT; a live listener still
  // makes bind fail (EADDRINUSE), which is the case worth reporting.
  const int one = 1;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(s.fd(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    std::string why = errno_text(err);
    if (err == EADDRINUSE) why += " (another process listens on that port)";
    if (err == EADDRNOTAVAIL) why += " (it is not an address of this host)";
    throw Error(prefix(ctx) + "cannot listen on " + address_text(addr) + ": " + why);
  }
  if (::listen(s.fd(), SOMAXCONN) != 0)
    throw Error(prefix(ctx) + "listen() on " + address_text(addr) + " failed: " + errno_text(errno));
  return s;
}

std::string local_host(const Socket& s) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  ::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&addr), &len);
  char host[INET_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET, &addr.sin_addr, host, sizeof host);
  return host;
}

int local_port(const Socket& s) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  ::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

Socket connect_until(const sockaddr_in& addr, std::string_view what, const Deadline& deadline, std::string_view ctx) {
  std::string last = "timed out";
  for (;;) {
    Socket s = new_socket(ctx);
    int err = 0;
    if (::connect(s.fd(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        err = ETIMEDOUT;
        if (wait_for(s, POLLOUT, deadline)) {
          socklen_t len = sizeof err;
          ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
        }
      }
    }
    if (err == 0) return s;
    last = errno_text(err);
    // Refused (nobody listens yet) and unreachable are what a peer that starts later looks like: retry.
    if (deadline.expired()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50, deadline.poll_ms())));
    if (deadline.expired()) break;
  }
  throw Error(prefix(ctx) + "cannot reach " + std::string(what) + " at " + address_text(addr) + " after " +
              seconds_text(deadline.elapsed_s()) + ": " + last);
}

Socket accept_until(const Socket& listener, std::string_view what, const Deadline& deadline, std::string_view ctx) {
  for (;;) {
    const int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) return Socket(fd);
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
      throw Error(prefix(ctx) + "accept() failed: " + errno_text(errno));
    if (!wait_for(listener, POLLIN, deadline))
      throw Error(prefix(ctx) + "waited " + seconds_text(deadline.elapsed_s()) + " for " + std::string(what));
  }
}

void send_all(const Socket& s, const void* data, std::size_t bytes, const Deadline& deadline, std::string_view peer,
              std::string_view ctx) {
  const auto* p = static_cast<const std::byte*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(s.fd(), p, bytes, MSG_NOSIGNAL);  // a closed peer is an error here, not SIGPIPE
    if (n > 0) {
      p += n;
      bytes -= static_cast<std::size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      throw Error(prefix(ctx) + std::string(peer) + " closed the connection (" + errno_text(errno) + ")");
    if (!wait_for(s, POLLOUT, deadline))
      throw Error(prefix(ctx) + "waited " + seconds_text(deadline.elapsed_s()) + " for " + std::string(peer));
  }
}

void recv_all(const Socket& s, void* data, std::size_t bytes, const Deadline& deadline, std::string_view peer,
              std::string_view ctx) {
  auto* p = static_cast<std::byte*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(s.fd(), p, bytes, 0);
    if (n > 0) {
      p += n;
      bytes -= static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) throw Error(prefix(ctx) + std::string(peer) + " closed the connection");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      throw Error(prefix(ctx) + std::string(peer) + " closed the connection (" + errno_text(errno) + ")");
    if (!wait_for(s, POLLIN, deadline))
      throw Error(prefix(ctx) + "waited " + seconds_text(deadline.elapsed_s()) + " for " + std::string(peer));
  }
}

void set_no_delay(const Socket& s) {
  const int one = 1;
  ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace rlx::distributed::detail
