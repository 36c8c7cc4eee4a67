// The tcp engine: CPU processes started by a launcher that sets RANK and
// WORLD_SIZE (torchrun style) rather than mpirun. Ranks meet through the TCP
// store (tcp_store.hpp) on MASTER_ADDR:MASTER_PORT, publish a listening
// address each, and connect a full mesh: one TCP connection per pair of
// ranks, rank r connecting to every lower rank. After that the store is
// closed and every collective moves bytes straight between the ranks:
//   all_gather      each rank sends its part to every other rank;
//   all_reduce      the Engine default: all_gather, then every rank adds the
//                   parts in rank order (reduce_in_order), as the MPI engine
//                   does, so sums are bit-identical to it and to one process;
//   reduce_scatter  each rank sends chunk p to rank p, then adds in rank order;
//   broadcast       the root sends to every other rank.
// Each message carries a small header (the collective and its byte count), so
// ranks that call different collectives, or pass different sizes, get an
// rlx::Error instead of each other's bytes. Every wait is bounded by the
// timeout; a peer that exits closes its connections and is reported at once.
// After such an error the connections are out of step and the engine refuses
// further calls.
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "distributed/engines.hpp"
#include "distributed/tcp_socket.hpp"
#include "distributed/tcp_store.hpp"
#include "rlx/error.hpp"

namespace rlx::distributed {

namespace {

using detail::Deadline;
using detail::Socket;

constexpr std::uint32_t kMagic = 0x524C5854;  // "RLXT"
enum class Kind : std::uint32_t { Hello = 1, AllGather, ReduceScatter, Broadcast, PointToPoint, Barrier };

std::string_view kind_name(std::uint32_t kind) {
  switch (static_cast<Kind>(kind)) {
    case Kind::Hello: return "a connection";
    case Kind::AllGather: return "all_gather (or all_reduce)";
    case Kind::ReduceScatter: return "reduce_scatter";
    case Kind::Broadcast: return "broadcast";
    case Kind::PointToPoint: return "send";
    case Kind::Barrier: return "barrier";
  }
  return "something unknown";
}

struct Head {
  std::uint32_t magic = kMagic;
  std::uint32_t kind = 0;
  std::uint64_t bytes = 0;  // the payload that follows; Hello: the connecting rank
};
static_assert(sizeof(Head) == 16);

// What one collective moves between this rank and one peer: an optional send and an optional receive, each a
// header then the payload, pumped by poll() as the socket allows so that large sends in both directions at
// once cannot deadlock on full socket buffers.
struct Io {
  int peer = -1;
  const std::byte* out = nullptr;
  std::size_t out_bytes = 0;
  bool sends = false;
  std::byte* in = nullptr;
  std::size_t in_bytes = 0;
  bool receives = false;
  Head out_head{}, in_head{};
  std::size_t out_done = 0, in_done = 0;  // bytes moved, header included

  bool send_pending() const { return sends && out_done < sizeof(Head) + out_bytes; }
  bool recv_pending() const { return receives && in_done < sizeof(Head) + in_bytes; }
};

class TcpEngine final : public Engine {
 public:
  explicit TcpEngine(const TcpOptions& o) : rank_(o.rank), world_(o.world_size), timeout_(o.timeout) {
    if (world_ < 1) throw Error("distributed.tcp: world size " + std::to_string(world_) + " is not 1 or more");
    if (rank_ < 0 || rank_ >= world_)
      throw Error("distributed.tcp: rank " + std::to_string(rank_) + " is outside the world of " +
                  std::to_string(world_) + " (0 to " + std::to_string(world_ - 1) + ")");
    if (world_ == 1) return;  // no peers: nothing to listen on
    connect_mesh(o);
  }

  std::string_view name() const override { return "tcp"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  void all_gather(ConstBuffer in, Buffer out) override { gather(in, out, "all_gather"); }

  void all_reduce(Buffer data, ReduceOp op) override {
    // Beyond 2 ranks a large message takes Engine's split (this engine's reduce_scatter, then all_gather: each
    // rank moves 2 (W - 1) / W of it); otherwise everything is gathered into the scratch and added in rank order.
    if (splits_all_reduce(world_, data.bytes())) return Engine::all_reduce(data, op);
    gather_reduce(data, op);
  }

  // Chunk p of this rank's `in` goes to rank p; chunk `rank` of every rank's comes here and is reduced into `out`
  // in rank order. `out` may be chunk `rank` of `in` itself (Engine's all_reduce): it is written after every chunk
  // has been sent.
  void reduce_scatter(ConstBuffer in, Buffer out, ReduceOp op) override {
    const std::size_t n = out.bytes(), world = static_cast<std::size_t>(world_);
    const auto* src = static_cast<const std::byte*>(in.data);
    std::byte* mine = scratch(n * world);
    std::memcpy(mine + static_cast<std::size_t>(rank_) * n, src + static_cast<std::size_t>(rank_) * n, n);
    std::vector<Io> ios;
    for (int p = 0; p < world_; ++p)
      if (p != rank_)
        ios.push_back(both(p, src + static_cast<std::size_t>(p) * n, n, mine + static_cast<std::size_t>(p) * n, n));
    exchange(ios, Kind::ReduceScatter, "reduce_scatter");
    reduce_in_order({mine, out.count * world, out.dtype}, world_, out, op);
  }

  void broadcast(Buffer data, int root) override {
    std::vector<Io> ios;
    if (rank_ == root) {
      for (int p = 0; p < world_; ++p)
        if (p != rank_) ios.push_back(sending(p, data.data, data.bytes()));
    } else {
      ios.push_back(receiving(root, data.data, data.bytes()));
    }
    exchange(ios, Kind::Broadcast, "broadcast");
  }

  void send(ConstBuffer data, int dst) override {
    std::vector<Io> ios{sending(dst, data.data, data.bytes())};
    exchange(ios, Kind::PointToPoint, "send");
  }

  void recv(Buffer data, int src) override {
    std::vector<Io> ios{receiving(src, data.data, data.bytes())};
    exchange(ios, Kind::PointToPoint, "recv");
  }

  void barrier() override {
    // An empty message to and from every rank: nobody leaves before everyone has entered.
    std::vector<Io> ios;
    for (int p = 0; p < world_; ++p)
      if (p != rank_) ios.push_back(both(p, nullptr, 0, nullptr, 0));
    exchange(ios, Kind::Barrier, "barrier");
  }

 private:
  static Io sending(int peer, const void* data, std::size_t bytes) {
    Io io;
    io.peer = peer;
    io.out = static_cast<const std::byte*>(data);
    io.out_bytes = bytes;
    io.sends = true;
    return io;
  }
  static Io receiving(int peer, void* data, std::size_t bytes) {
    Io io;
    io.peer = peer;
    io.in = static_cast<std::byte*>(data);
    io.in_bytes = bytes;
    io.receives = true;
    return io;
  }
  static Io both(int peer, const void* out, std::size_t out_bytes, void* in, std::size_t in_bytes) {
    Io io = sending(peer, out, out_bytes);
    io.in = static_cast<std::byte*>(in);
    io.in_bytes = in_bytes;
    io.receives = true;
    return io;
  }

  // The Engine default all_reduce (gather every rank's data, add it in rank order), with errors that say
  // all_reduce.
  void gather_reduce(Buffer data, ReduceOp op) {
    const auto world = static_cast<std::size_t>(world_);
    std::byte* gathered = scratch(data.bytes() * world);
    gather({data.data, data.count, data.dtype}, {gathered, data.count * world, data.dtype}, "all_reduce");
    reduce_in_order({gathered, data.count * world, data.dtype}, world_, data, op);
  }

  void gather(ConstBuffer in, Buffer out, std::string_view op) {
    const std::size_t n = in.bytes();
    auto* dst = static_cast<std::byte*>(out.data);
    std::memmove(dst + static_cast<std::size_t>(rank_) * n, in.data, n);
    std::vector<Io> ios;
    for (int p = 0; p < world_; ++p)
      if (p != rank_) ios.push_back(both(p, in.data, n, dst + static_cast<std::size_t>(p) * n, n));
    exchange(ios, Kind::AllGather, op);
  }

  std::string where() const {
    return "rank " + std::to_string(rank_) + " of " + std::to_string(world_) + " (engine tcp)";
  }

  void connect_mesh(const TcpOptions& o) {
    // The store lives only while the ranks meet: after the barrier below every rank is done with it.
    detail::TcpStore store({o.master_addr, o.master_port, rank_, world_, timeout_});
    const std::string& ctx = store.context();
    const Deadline deadline(timeout_);
    Socket listener = detail::listen_on(store.local_host(), 0, ctx + ": the engine's listener");
    const std::string mine = store.local_host() + ":" + std::to_string(detail::local_port(listener));
    store.set(address_key(rank_), std::as_bytes(std::span(mine.data(), mine.size())));
    peers_.resize(static_cast<std::size_t>(world_));
    // Every rank reads every address, so each one waits in the store until all have joined, and learns there
    // why the launch is refused (rank 0's server answers every waiting get with the reason).
    std::vector<std::string> addresses(static_cast<std::size_t>(world_));
    for (int p = 0; p < world_; ++p) {
      if (p == rank_) continue;
      const auto text = store.get(address_key(p), "rank " + std::to_string(p) + "'s address (it has not joined)");
      addresses[static_cast<std::size_t>(p)].assign(reinterpret_cast<const char*>(text.data()), text.size());
    }
    // Rank r connects to every lower rank, then accepts every higher one: one connection per pair, and no
    // rank waits on one that waits on it (a connect completes in the listener's backlog before its accept).
    for (int p = 0; p < rank_; ++p) {
      const std::string who = "rank " + std::to_string(p);
      const std::string& addr = addresses[static_cast<std::size_t>(p)];
      const auto colon = addr.rfind(':');
      Socket s = detail::connect_until(
          detail::resolve_ipv4(addr.substr(0, colon), std::stoi(addr.substr(colon + 1)), ctx), who, deadline, ctx);
      detail::set_no_delay(s);
      const Head hello{kMagic, static_cast<std::uint32_t>(Kind::Hello), static_cast<std::uint64_t>(rank_)};
      detail::send_all(s, &hello, sizeof hello, deadline, who, ctx);
      peers_[static_cast<std::size_t>(p)] = std::move(s);
    }
    for (int higher = rank_ + 1; higher < world_; ++higher) {
      std::string missing;
      for (int p = rank_ + 1; p < world_; ++p)
        if (!peers_[static_cast<std::size_t>(p)]) missing += (missing.empty() ? "rank " : ", ") + std::to_string(p);
      Socket s = detail::accept_until(listener, missing + " to connect", deadline, ctx);
      Head hello;
      detail::recv_all(s, &hello, sizeof hello, deadline, "a connecting rank", ctx);
      const auto p = static_cast<std::size_t>(hello.bytes);
      if (hello.magic != kMagic || hello.kind != static_cast<std::uint32_t>(Kind::Hello) ||
          hello.bytes <= static_cast<std::uint64_t>(rank_) || hello.bytes >= static_cast<std::uint64_t>(world_) ||
          peers_[p])
        throw Error(ctx + ": a connection to this rank's port is not a higher rank of this job");
      detail::set_no_delay(s);
      peers_[p] = std::move(s);
    }
    barrier();  // init() returns once every rank is connected
  }

  static std::string address_key(int rank) { return "rlx/tcp/address/" + std::to_string(rank); }

  void exchange(std::vector<Io>& ios, Kind kind, std::string_view op) {
    std::lock_guard lock(mutex_);  // one collective at a time: the streams carry them in order
    if (!broken_.empty())
      throw Error("distributed." + std::string(op) + ": " + where() +
                  ": an earlier collective failed, so the ranks' connections are out of step: " + broken_);
    try {
      run(ios, kind, op);
    } catch (const Error& e) {
      broken_ = e.what();
      throw;
    }
  }

  void run(std::vector<Io>& ios, Kind kind, std::string_view op) {
    const Deadline deadline(timeout_);
    for (Io& io : ios) io.out_head = {kMagic, static_cast<std::uint32_t>(kind), io.out_bytes};
    std::vector<pollfd> fds(ios.size());
    for (;;) {
      std::string waiting;
      for (std::size_t i = 0; i < ios.size(); ++i) {
        const Io& io = ios[i];
        const short events = static_cast<short>((io.send_pending() ? POLLOUT : 0) | (io.recv_pending() ? POLLIN : 0));
        fds[i] = {events ? peers_[static_cast<std::size_t>(io.peer)].fd() : -1, events, 0};
        if (events) waiting += (waiting.empty() ? "rank " : ", ") + std::to_string(io.peer);
      }
      if (waiting.empty()) return;
      const int ready = wait(fds, deadline);
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0)
        throw Error("distributed." + std::string(op) + ": " + where() + " waited " +
                    detail::seconds_text(deadline.elapsed_s()) + " for " + waiting +
                    " (the timeout, RLX_DISTRIBUTED_TIMEOUT, is " +
                    detail::seconds_text(std::chrono::duration<double>(timeout_).count()) + ")");
      for (std::size_t i = 0; i < ios.size(); ++i) {
        const short r = fds[i].revents;
        if (r == 0) continue;
        if ((r & (POLLOUT | POLLERR | POLLHUP)) && ios[i].send_pending()) pump_send(ios[i], op);
        if ((r & (POLLIN | POLLERR | POLLHUP)) && ios[i].recv_pending()) pump_recv(ios[i], kind, op);
      }
    }
  }

  // poll() for the sockets, but first briefly without sleeping: a peer's answer usually comes within
  // microseconds, and a process woken from sleep waits for the scheduler far longer than that on a busy machine
  // (the yield leaves the core to other work meanwhile, as MPI's mpi_yield_when_idle does).
  static int wait(std::vector<pollfd>& fds, const Deadline& deadline) {
    const auto spin_until = std::chrono::steady_clock::now() + kSpin;
    while (std::chrono::steady_clock::now() < spin_until) {
      const int ready = ::poll(fds.data(), fds.size(), 0);
      if (ready != 0) return ready;
      sched_yield();
    }
    return ::poll(fds.data(), fds.size(), deadline.poll_ms());
  }
  // 100 us: on this 2-core machine under load, a 1-float all_reduce between 2 ranks took 150 us sleeping in
  // poll() at once and 21 to 29 us with 50 to 200 us of this; longer only burns the core.
  static constexpr auto kSpin = std::chrono::microseconds(100);

  [[noreturn]] void closed(const Io& io, std::string_view op, int err) const {
    throw Error("distributed." + std::string(op) + ": " + where() + ": rank " + std::to_string(io.peer) +
                " closed its connection (it exited or failed" + (err ? ": " + detail::errno_text(err) : "") + ")");
  }

  void pump_send(Io& io, std::string_view op) {
    const int fd = peers_[static_cast<std::size_t>(io.peer)].fd();
    while (io.send_pending()) {
      iovec iov[2];
      std::size_t count = 0;
      if (io.out_done < sizeof(Head))
        iov[count++] = {reinterpret_cast<std::byte*>(&io.out_head) + io.out_done, sizeof(Head) - io.out_done};
      const std::size_t sent = io.out_done > sizeof(Head) ? io.out_done - sizeof(Head) : 0;
      if (io.out_bytes > sent) iov[count++] = {const_cast<std::byte*>(io.out) + sent, io.out_bytes - sent};
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = count;
      const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);  // a closed peer is an error here, not SIGPIPE
      if (n > 0) {
        io.out_done += static_cast<std::size_t>(n);
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return;
      } else if (errno != EINTR) {
        closed(io, op, errno);
      }
    }
  }

  void pump_recv(Io& io, Kind kind, std::string_view op) {
    const int fd = peers_[static_cast<std::size_t>(io.peer)].fd();
    while (io.recv_pending()) {
      const bool head = io.in_done < sizeof(Head);
      std::byte* at =
          head ? reinterpret_cast<std::byte*>(&io.in_head) + io.in_done : io.in + (io.in_done - sizeof(Head));
      const std::size_t want = head ? sizeof(Head) - io.in_done : io.in_bytes - (io.in_done - sizeof(Head));
      const ssize_t n = ::recv(fd, at, want, 0);
      if (n == 0) closed(io, op, 0);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        closed(io, op, errno);
      }
      io.in_done += static_cast<std::size_t>(n);
      if (head && io.in_done == sizeof(Head)) check_head(io, kind, op);
    }
  }

  // The header of what `io.peer` sent must be the collective this rank is in, with the size it expects.
  void check_head(const Io& io, Kind kind, std::string_view op) const {
    const Head& h = io.in_head;
    const std::string peer = "rank " + std::to_string(io.peer);
    if (h.magic != kMagic)
      throw Error("distributed." + std::string(op) + ": " + where() + ": " + peer + " sent bytes out of step");
    if (h.kind != static_cast<std::uint32_t>(kind))
      throw Error("distributed." + std::string(op) + ": " + where() + ": " + peer + " is in " +
                  std::string(kind_name(h.kind)) + " while this rank is in " +
                  std::string(kind_name(static_cast<std::uint32_t>(kind))) +
                  " (every rank must call the same collectives in the same order)");
    if (h.bytes != io.in_bytes)
      throw Error("distributed." + std::string(op) + ": " + where() + ": expected " + std::to_string(io.in_bytes) +
                  " bytes from " + peer + " but it sent " + std::to_string(h.bytes) +
                  (kind == Kind::PointToPoint ? "" : " (every rank must pass the same count)"));
  }

  // Every rank's contribution to an all_reduce or reduce_scatter: kept between collectives (grown, never
  // shrunk, not cleared), so that a training loop's all_reduce of the same gradients allocates and faults in
  // its pages once.
  std::byte* scratch(std::size_t bytes) {
    if (bytes > scratch_bytes_) {
      scratch_.reset(new std::byte[bytes]);  // NOLINT(cppcoreguidelines-owning-memory): default-initialised on purpose
      scratch_bytes_ = bytes;
    }
    return scratch_.get();
  }
  std::unique_ptr<std::byte[]> scratch_;
  std::size_t scratch_bytes_ = 0;
  int rank_, world_;
  std::chrono::milliseconds timeout_;
  std::vector<Socket> peers_;  // by rank; this rank's own is empty
  std::mutex mutex_;
  std::string broken_;
};

}  // namespace

std::shared_ptr<Engine> make_tcp_engine(const TcpOptions& options) { return std::make_shared<TcpEngine>(options); }

}  // namespace rlx::distributed
