#pragma once
// The POSIX socket pieces the TCP store and the tcp engine share: an owning
// fd, a deadline, and blocking-with-timeout connect, accept, send and receive
// on non-blocking IPv4 sockets. Every wait is bounded by a Deadline so that a
// peer that never comes, or stops answering, becomes an rlx::Error instead of
// a hang; a peer that dies is seen at once (its connection closes).
#include <netinet/in.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

namespace rlx::distributed::detail {

// An owned file descriptor, closed on destruction; move-only.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& o) noexcept : fd_(o.release()) {}
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

// A point in time every wait of one operation shares, and how long it allowed, for the error messages.
class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Deadline(std::chrono::milliseconds timeout) : start_(Clock::now()), end_(start_ + timeout) {}
  bool expired() const { return Clock::now() >= end_; }
  // What is left, for poll(): 0 when expired, at most `cap` milliseconds.
  int poll_ms(int cap = 1 << 30) const;
  double elapsed_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  Clock::time_point start_, end_;
};

// "1.0 s": elapsed times in messages.
std::string seconds_text(double s);
// strerror for `err` (errno).
std::string errno_text(int err);

// The IPv4 address of `host` (a dotted quad or a name); throws rlx::Error prefixed with `ctx` when it has none.
sockaddr_in resolve_ipv4(const std::string& host, int port, std::string_view ctx);
std::string address_text(const sockaddr_in& addr);  // "127.0.0.1:29500"

// A listening socket on host:port (port 0: any free one). Throws rlx::Error prefixed with `ctx`, naming the
// address and the system's reason (e.g. the port in use).
Socket listen_on(const std::string& host, int port, std::string_view ctx);
// The local address and port a socket is bound to.
std::string local_host(const Socket& s);
int local_port(const Socket& s);

// Connects to `addr`, retrying while nobody listens there yet (the peer may start later) until `deadline`.
// On failure: rlx::Error "<ctx>: cannot reach <what> at <addr> after <elapsed> s: <last reason>".
Socket connect_until(const sockaddr_in& addr, std::string_view what, const Deadline& deadline, std::string_view ctx);
// The next connection on `listener`, or an rlx::Error "<ctx>: waited <elapsed> s for <what>" at the deadline.
Socket accept_until(const Socket& listener, std::string_view what, const Deadline& deadline, std::string_view ctx);

// Moves exactly `bytes` bytes, waiting at most until `deadline`. `peer` names the other end in errors, e.g.
// "<ctx>: rank 1 closed the connection" or "<ctx>: waited 5.0 s for rank 1".
void send_all(const Socket& s, const void* data, std::size_t bytes, const Deadline& deadline, std::string_view peer,
              std::string_view ctx);
void recv_all(const Socket& s, void* data, std::size_t bytes, const Deadline& deadline, std::string_view peer,
              std::string_view ctx);

// Disables Nagle's algorithm: collectives send small messages and wait for the answer.
void set_no_delay(const Socket& s);

}  // namespace rlx::distributed::detail
