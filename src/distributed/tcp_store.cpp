// The TCP store (tcp_store.hpp). Wire format, in host byte order (the ranks
// of one job run the same build on the same architecture): a request is a
// Head then the key then the value; a reply is a Head (kind = status, key_len
// 0) then the value or an error text. Rank 0's server thread polls its
// listener, a wake-up pipe and every client; a get() of a key not set yet is
// answered when some rank sets it.
#include "distributed/tcp_store.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <thread>

#include "rlx/error.hpp"

namespace rlx::distributed::detail {

namespace {

constexpr std::uint32_t kMagic = 0x524C5853;  // "RLXS": anything else on the port is not a rank
constexpr std::uint32_t kHello = 1, kSet = 2, kGet = 3;
constexpr std::uint32_t kOk = 0, kFailed = 1;
constexpr std::size_t kMaxKey = 4096, kMaxValue = std::size_t{1} << 30;

struct Head {
  std::uint32_t magic = kMagic;
  std::uint32_t kind = 0;  // a request kind, or a reply status
  std::uint32_t key_len = 0;
  std::uint32_t reserved = 0;
  std::uint64_t value_len = 0;
};
static_assert(sizeof(Head) == 24);

std::span<const std::byte> text_bytes(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

}  // namespace

// ---- rank 0's server ----

class TcpStore::Server {
 public:
  Server(Socket listener, int world, std::chrono::milliseconds timeout, std::string ctx)
      : listener_(std::move(listener)), world_(world), timeout_(timeout), ctx_(std::move(ctx)) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw Error(ctx_ + ": pipe() failed: " + errno_text(errno));
    wake_read_ = Socket(fds[0]);
    wake_write_ = Socket(fds[1]);
    thread_ = std::thread([this] { loop(); });
  }
  ~Server() {
    const char stop = 1;
    [[maybe_unused]] const auto n = ::write(wake_write_.fd(), &stop, 1);
    thread_.join();
  }
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

 private:
  struct Client {
    Socket socket;
    int rank = -1;  // after its hello
  };

  void loop() {
    std::vector<pollfd> fds;
    std::vector<int> ids;
    for (;;) {
      std::erase_if(clients_, [](const auto& c) { return !c.second.socket; });  // reply() gave up on them
      for (auto& [key, waiters] : waiting_) std::erase_if(waiters, [&](int id) { return !clients_.contains(id); });
      fds.assign({{wake_read_.fd(), POLLIN, 0}, {listener_.fd(), POLLIN, 0}});
      ids.clear();
      for (const auto& [id, c] : clients_) {
        fds.push_back({c.socket.fd(), POLLIN, 0});
        ids.push_back(id);
      }
      if (::poll(fds.data(), fds.size(), -1) < 0) continue;  // EINTR
      if (fds[0].revents != 0) return;
      if (fds[1].revents & POLLIN) {
        const int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
          Socket s(fd);
          set_no_delay(s);
          clients_.emplace(next_id_++, Client{std::move(s)});
        }
      }
      for (std::size_t i = 2; i < fds.size(); ++i)
        if (fds[i].revents != 0) serve(ids[i - 2]);
    }
  }

  // One request from client `id`; a client that breaks the protocol or goes away is dropped.
  void serve(int id) {
    auto it = clients_.find(id);
    if (it == clients_.end()) return;
    Client& c = it->second;
    try {
      const Deadline deadline(timeout_);
      Head h;
      recv_all(c.socket, &h, sizeof h, deadline, "a client", ctx_);
      if (h.magic != kMagic || h.key_len > kMaxKey || h.value_len > kMaxValue) throw Error("not an RLX store client");
      std::string key(h.key_len, '\0');
      std::vector<std::byte> value(h.value_len);
      recv_all(c.socket, key.data(), key.size(), deadline, "a client", ctx_);
      recv_all(c.socket, value.data(), value.size(), deadline, "a client", ctx_);
      switch (h.kind) {
        case kHello: return hello(c, value);
        case kSet: return set(std::move(key), std::move(value));
        case kGet: return get(id, key);
        default: throw Error("unknown request");
      }
    } catch (const Error&) {
      drop(id);
    }
  }

  void hello(Client& c, const std::vector<std::byte>& value) {
    std::int32_t said[2] = {-1, -1};  // rank, world
    if (value.size() == sizeof said) std::memcpy(said, value.data(), sizeof said);
    const int rank = said[0], world = said[1];
    std::string why;
    if (world != world_) {
      why = "rank " + std::to_string(rank) + " says WORLD_SIZE is " + std::to_string(world) + ", rank 0 says " +
            std::to_string(world_);
    } else if (rank < 0 || rank >= world_) {
      why = "a process says it is rank " + std::to_string(rank) + ", outside the world of " + std::to_string(world_);
    } else {
      for (const auto& [id, other] : clients_)
        if (other.rank == rank) why = "two processes say they are rank " + std::to_string(rank) + " (RANK)";
    }
    if (why.empty()) {
      c.rank = rank;
      reply(c, kOk, {});
      return;
    }
    // A misconfigured launch: every rank waiting on the store learns why instead of timing out.
    if (fatal_.empty()) fatal_ = why;
    reply(c, kFailed, text_bytes(why));
    for (auto& [key, waiters] : waiting_)
      for (int w : waiters)
        if (auto it = clients_.find(w); it != clients_.end()) reply(it->second, kFailed, text_bytes(fatal_));
    waiting_.clear();
  }

  void set(std::string key, std::vector<std::byte> value) {
    if (auto w = waiting_.find(key); w != waiting_.end()) {
      for (int id : w->second)
        if (auto it = clients_.find(id); it != clients_.end()) reply(it->second, kOk, value);
      waiting_.erase(w);
    }
    values_.insert_or_assign(std::move(key), std::move(value));
  }

  void get(int id, const std::string& key) {
    Client& c = clients_.at(id);
    if (!fatal_.empty()) return reply(c, kFailed, text_bytes(fatal_));
    if (auto v = values_.find(key); v != values_.end()) return reply(c, kOk, v->second);
    waiting_[key].push_back(id);
  }

  // Replies are small and the client is reading; a client that does not read them in time is its own problem.
  void reply(Client& c, std::uint32_t status, std::span<const std::byte> value) {
    Head h{kMagic, status, 0, 0, value.size()};
    try {
      const Deadline deadline(timeout_);
      send_all(c.socket, &h, sizeof h, deadline, "a client", ctx_);
      send_all(c.socket, value.data(), value.size(), deadline, "a client", ctx_);
    } catch (const Error&) {
      c.socket.reset();  // dropped on its next poll (POLLNVAL)
    }
  }

  void drop(int id) {
    clients_.erase(id);
    for (auto& [key, waiters] : waiting_) std::erase(waiters, id);
  }

  Socket listener_, wake_read_, wake_write_;
  int world_;
  std::chrono::milliseconds timeout_;
  std::string ctx_;
  std::map<int, Client> clients_;
  int next_id_ = 0;
  std::map<std::string, std::vector<std::byte>, std::less<>> values_;
  std::map<std::string, std::vector<int>, std::less<>> waiting_;
  std::string fatal_;
  std::thread thread_;
};

// ---- every rank's client ----

TcpStore::TcpStore(const StoreOptions& options) : options_(options) {
  ctx_ = "distributed.tcp (rank " + std::to_string(options.rank) + " of " + std::to_string(options.world) + ")";
  if (options.port <= 0 || options.port > 65535)
    throw Error(ctx_ + ": the store's port " + std::to_string(options.port) + " is not a TCP port (1 to 65535)");
  const sockaddr_in addr = resolve_ipv4(options.host, options.port, ctx_ + ": MASTER_ADDR");
  address_ = address_text(addr);
  const Deadline deadline(options.timeout);
  if (options.rank == 0)
    server_ = std::make_unique<Server>(
        listen_on(options.host, options.port, ctx_ + ": rank 0 (MASTER_ADDR, and MASTER_PORT or RLX_DISTRIBUTED_PORT)"),
        options.world, options.timeout, ctx_ + " store server");
  conn_ = connect_until(addr, "rank 0's store (MASTER_ADDR, and MASTER_PORT or RLX_DISTRIBUTED_PORT)", deadline, ctx_);
  set_no_delay(conn_);
  local_host_ = detail::local_host(conn_);
  const std::int32_t said[2] = {options.rank, options.world};
  request(kHello, {}, std::as_bytes(std::span(said)), nullptr, "rank 0 to accept this rank");
}

TcpStore::~TcpStore() {
  conn_.reset();
  server_.reset();
}

void TcpStore::set(std::string_view key, std::span<const std::byte> value) { request(kSet, key, value, nullptr, {}); }

std::vector<std::byte> TcpStore::get(std::string_view key, std::string_view what) {
  std::vector<std::byte> value;
  request(kGet, key, {}, &value, what);
  return value;
}

void TcpStore::request(int kind, std::string_view key, std::span<const std::byte> value, std::vector<std::byte>* reply,
                       std::string_view what) {
  std::lock_guard lock(mutex_);
  if (!broken_.empty()) throw Error(ctx_ + ": the store connection failed earlier: " + broken_);
  const Deadline deadline(options_.timeout);
  const std::string peer = "rank 0's store at " + address_;
  try {
    Head h{kMagic, static_cast<std::uint32_t>(kind), static_cast<std::uint32_t>(key.size()), 0, value.size()};
    send_all(conn_, &h, sizeof h, deadline, peer, ctx_);
    send_all(conn_, key.data(), key.size(), deadline, peer, ctx_);
    send_all(conn_, value.data(), value.size(), deadline, peer, ctx_);
    if (kind == kSet) return;  // sets are not acknowledged: the stream keeps them in order before any get
    // The answer to a get comes when some rank sets the key: the wait that names what it waited for.
    pollfd ready{conn_.fd(), POLLIN, 0};
    while (::poll(&ready, 1, deadline.poll_ms()) < 0 && errno == EINTR) {
    }
    if (ready.revents == 0)
      throw Error(ctx_ + ": waited " + seconds_text(deadline.elapsed_s()) + " for " + std::string(what) +
                  " from the store at " + address_ + " (the timeout, RLX_DISTRIBUTED_TIMEOUT, is " +
                  seconds_text(std::chrono::duration<double>(options_.timeout).count()) + ")");
    Head r;
    recv_all(conn_, &r, sizeof r, deadline, peer, ctx_);
    if (r.magic != kMagic || r.value_len > kMaxValue)
      throw Error(ctx_ + ": " + address_ +
                  " does not answer as an RLX store (another service's port? RLX_DISTRIBUTED_PORT picks another)");
    std::vector<std::byte> body(r.value_len);
    recv_all(conn_, body.data(), body.size(), deadline, peer, ctx_);
    if (r.kind != kOk) {
      const std::string why(reinterpret_cast<const char*>(body.data()), body.size());
      throw Error(ctx_ + ": the launch is inconsistent: " + why);
    }
    if (reply) *reply = std::move(body);
  } catch (const Error& e) {
    broken_ = e.what();
    throw;
  }
}

void share_from_rank0(TcpStore& store, std::string_view key, std::span<std::byte> bytes) {
  if (store.rank() == 0) {
    store.set(key, bytes);
    return;
  }
  const auto got = store.get(key, "rank 0's '" + std::string(key) + "'");
  if (got.size() != bytes.size())
    throw Error(store.context() + ": rank 0 shared " + std::to_string(got.size()) + " bytes as '" + std::string(key) +
                "', this rank expects " + std::to_string(bytes.size()));
  std::memcpy(bytes.data(), got.data(), bytes.size());
}

}  // namespace rlx::distributed::detail
