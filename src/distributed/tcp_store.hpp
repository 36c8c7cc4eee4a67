#pragma once
// RLX's rendezvous for launchers that set RANK/WORLD_SIZE (torchrun style)
// rather than mpirun: a key-value store that rank 0 serves on
// MASTER_ADDR:MASTER_PORT from a thread of its own, and every rank (rank 0
// too) reaches over one TCP connection. Ranks publish what the others need
// (the tcp engine's listening addresses, NCCL's unique id) with set() and wait
// for it with get(). On joining, each rank says its rank and world size; rank
// 0 refuses a world size that differs from its own or a rank that joins twice,
// and every rank waiting on the store then fails with that reason.
#include <chrono>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "distributed/tcp_socket.hpp"

namespace rlx::distributed::detail {

struct StoreOptions {
  std::string host = "127.0.0.1";  // MASTER_ADDR: rank 0 listens on it, the others connect to it
  int port = 29500;                // MASTER_PORT
  int rank = 0;
  int world = 1;
  std::chrono::milliseconds timeout{600'000};  // for joining and for each get()
};

class TcpStore {
 public:
  // Rank 0 starts serving, then every rank connects (retrying until the timeout: rank 0 may start last) and
  // joins. Throws rlx::Error naming the address, the rank and the time waited when that fails.
  explicit TcpStore(const StoreOptions& options);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(std::string_view key, std::span<const std::byte> value);
  // Waits until some rank has set `key` (at most the timeout). `what` says in errors what was waited for, e.g.
  // "rank 2's address".
  std::vector<std::byte> get(std::string_view key, std::string_view what);

  int rank() const { return options_.rank; }
  int world() const { return options_.world; }
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  // This rank's address on the interface that reaches the master: where the other ranks can reach it.
  const std::string& local_host() const { return local_host_; }
  // "distributed.tcp (rank 1 of 2)": the prefix of this rank's errors.
  const std::string& context() const { return ctx_; }

 private:
  class Server;
  void request(int kind, std::string_view key, std::span<const std::byte> value, std::vector<std::byte>* reply,
               std::string_view what);

  StoreOptions options_;
  std::string ctx_, address_, local_host_;
  std::unique_ptr<Server> server_;  // rank 0 only
  Socket conn_;
  std::mutex mutex_;
  std::string broken_;  // set when a reply may still be in flight: the connection is out of step
};

// Carries rank 0's `bytes` to every rank through the store under `key` (NCCL's unique id): rank 0 sets, the
// others wait for it and check its size.
void share_from_rank0(TcpStore& store, std::string_view key, std::span<std::byte> bytes);

}  // namespace rlx::distributed::detail
