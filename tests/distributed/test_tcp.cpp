// The TCP store and the tcp engine with every rank a thread of this process
// (the same sockets as separate processes: CTest's distributed_tcp_* tests
// start those through run_tcp.sh). Ranks meet on a free port of 127.0.0.1.
// Besides the collectives, the failures: a master nobody serves, a rank that
// never joins, a port in use, ranks that disagree on the world, ranks that call
// different collectives, a peer that dies mid-collective and one that stops
// answering; each must be an rlx::Error that says so, within the timeout.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>
#include <numeric>
#include <thread>
#include <vector>

#include "distributed/engines.hpp"
#include "distributed/tcp_store.hpp"
#include "rlx/distributed/distributed.hpp"
#include "rlx/env.hpp"
#include "rlx/error.hpp"

namespace {

using namespace rlx;
using namespace std::chrono_literals;
using distributed::Communicator;
using distributed::ReduceOp;

// A port nobody listens on right now (the kernel's pick for port 0).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

distributed::TcpOptions options(int port, int rank, int world, std::chrono::milliseconds timeout = 20s) {
  return {.master_addr = "127.0.0.1", .master_port = port, .rank = rank, .world_size = world, .timeout = timeout};
}

// Runs fn(rank, communicator) on `world` threads joined in one tcp world; returns each rank's error ("" if none).
std::vector<std::string> run_world(int world, const std::function<void(int, Communicator&)>& fn,
                                   std::chrono::milliseconds timeout = 20s) {
  const int port = free_port();
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        Communicator c(distributed::make_tcp_engine(options(port, r, world, timeout)));
        fn(r, c);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (std::size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

void expect_contains(const std::string& text, std::initializer_list<std::string_view> needles) {
  for (auto n : needles) EXPECT_NE(text.find(n), std::string::npos) << "'" << n << "' not in: " << text;
}

// Rank r's part: a small value on rank 0, then +1e8 and -1e8 times it on odd and even ranks, so that adding in
// rank order loses rank 0's part to rounding ((s + B) - B), and another order would not ((-B + B) + s).
std::vector<float> contribution(int r, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = r == 0 ? 0.5F + static_cast<float>(i % 7)
                  : (r % 2 == 1 ? 1e8F : -1e8F) * static_cast<float>(i % 97 + 1) + 0.25F * static_cast<float>(r);
  return v;
}

TEST(TcpEngine, ThreeRanksRunEveryCollectiveWithRankOrderedSums) {
  const int world = 3;
  expect_no_errors(run_world(world, [&](int rank, Communicator& c) {
    ASSERT_EQ(c.rank(), rank);
    ASSERT_EQ(c.world_size(), world);
    ASSERT_EQ(c.engine(), "tcp");
    EXPECT_TRUE(c.rank_ordered_sums());
    // all_reduce: ((c0 + c1) + c2) in f32, what one process adding the parts in rank order gets. 30001 floats are
    // past 64 KiB: a reduce-scatter then an all-gather, 30001 % 3 = 1 element left over, and the same sums.
    for (const std::size_t n : {std::size_t(1001), std::size_t(30001)}) {
      std::vector<float> data = contribution(rank, n), want = contribution(0, n);
      for (int r = 1; r < world; ++r) {
        const auto v = contribution(r, n);
        for (std::size_t i = 0; i < n; ++i) want[i] += v[i];
      }
      c.all_reduce(data);
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(data[i], want[i]) << "element " << i << " of " << n;
    }

    std::vector<double> mx{static_cast<double>(rank)};
    c.all_reduce(std::span<double>(mx), ReduceOp::Max);
    EXPECT_EQ(mx[0], world - 1);

    // A large bf16 message (70001 % 3 = 2 left over): summed in f32 and rounded once, as a small one is.
    ir::Tensor half(ir::DType::BF16, {70001});
    for (std::int64_t i = 0; i < half.numel(); ++i) half.set(i, double((rank + 1) * (i % 5)));
    c.all_reduce(half);
    for (std::int64_t i = 0; i < half.numel(); i += 997) ASSERT_EQ(half.get(i), double(6 * (i % 5))) << i;
    ASSERT_EQ(half.get(70000), 0.0);

    std::vector<float> mine{static_cast<float>(rank), static_cast<float>(10 * rank)}, all(2 * world, -1);
    c.all_gather(mine, all);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(all[2 * r], r);
      EXPECT_EQ(all[2 * r + 1], 10 * r);
    }

    std::vector<float> in(4 * world), out(4, -1);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) + 100.0F * static_cast<float>(rank);
    c.reduce_scatter(in, out);
    for (std::size_t i = 0; i < 4; ++i)
      EXPECT_EQ(out[i], static_cast<float>(world) * static_cast<float>(4 * rank + i) + 100.0F * 3.0F);

    std::vector<float> b(5, static_cast<float>(rank));
    c.broadcast(std::span<float>(b), world - 1);
    for (float x : b) EXPECT_EQ(x, world - 1);

    // Point to point, not only between neighbours: 0 -> 2 -> 1 -> 0.
    const int to = rank == 0 ? 2 : rank == 2 ? 1 : 0, from = rank == 0 ? 1 : rank == 1 ? 2 : 0;
    std::vector<float> msg{static_cast<float>(rank), 7.0F}, got(2, -1);
    if (rank == 0) {
      c.send(msg, to);
      c.recv(got, from);
    } else {
      c.recv(got, from);
      c.send(msg, to);
    }
    EXPECT_EQ(got[0], from);
    c.barrier();
  }));
}

TEST(TcpEngine, LargeBuffersCrossBothWaysAtOnce) {
  // 8 MiB per rank, far above the socket buffers: both ranks send while they receive, which must not deadlock.
  expect_no_errors(run_world(2, [](int rank, Communicator& c) {
    const std::size_t n = std::size_t{1} << 21;
    std::vector<float> v(n);
    std::iota(v.begin(), v.end(), static_cast<float>(rank));
    std::vector<float> all(2 * n);
    c.all_gather(v, all);
    for (std::size_t i = 0; i < n; i += 4099) {
      ASSERT_EQ(all[i], static_cast<float>(i));
      ASSERT_EQ(all[n + i], static_cast<float>(i) + 1.0F);
    }
    c.all_reduce(v);
    EXPECT_EQ(v[12345], 2.0F * 12345.0F + 1.0F);
  }));
}

TEST(TcpEngine, RanksThatCallDifferentCollectivesAreTold) {
  const auto errors = run_world(
      2,
      [](int rank, Communicator& c) {
        std::vector<float> v(3, 1.0F), all(6);
        if (rank == 0)
          c.broadcast(std::span<float>(v), 0);
        else
          c.all_gather(v, all);
      },
      3s);
  // Rank 1 reads rank 0's broadcast header while it is in all_gather; rank 0 finishes its send.
  expect_contains(errors[1],
                  {"distributed.all_gather", "rank 0 is in broadcast", "same collectives in the same order"});
}

TEST(TcpEngine, ARecvOfTheWrongSizeIsTold) {
  const auto errors = run_world(
      2,
      [](int rank, Communicator& c) {
        std::vector<float> v(rank == 0 ? 3 : 4, 1.0F);
        if (rank == 0)
          c.send(v, 1);
        else
          c.recv(v, 0);
      },
      3s);
  EXPECT_EQ(errors[0], "");
  expect_contains(errors[1], {"distributed.recv", "expected 16 bytes from rank 0 but it sent 12"});
}

TEST(TcpEngine, APeerThatDiesMidCollectiveIsReportedAtOnce) {
  // Rank 1 leaves (its engine, and so its sockets, go away) while rank 0 waits in an all_reduce: rank 0 must
  // hear of it long before the 60 s timeout, and refuse further calls on connections now out of step.
  const auto t0 = std::chrono::steady_clock::now();
  const auto errors = run_world(
      2,
      [&](int rank, Communicator& c) {
        if (rank == 1) {
          c.barrier();
          return;  // "dies": the engine is released on return
        }
        c.barrier();
        std::vector<float> v(16, 1.0F);
        try {
          c.all_reduce(v);
          ADD_FAILURE() << "all_reduce with a dead peer returned";
        } catch (const Error& e) {
          expect_contains(e.what(), {"distributed.all_reduce", "rank 0 of 2", "rank 1 closed its connection"});
        }
        try {
          c.barrier();
          ADD_FAILURE() << "barrier after a failure returned";
        } catch (const Error& e) {
          expect_contains(e.what(), {"out of step"});
        }
      },
      60s);
  expect_no_errors(errors);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
}

TEST(TcpEngine, APeerThatStopsAnsweringTimesOut) {
  std::promise<void> done;
  auto finished = done.get_future().share();
  const auto errors = run_world(
      2,
      [&](int rank, Communicator& c) {
        if (rank == 1) {
          finished.wait();  // alive, connected, but never enters the all_reduce
          return;
        }
        std::vector<float> v(4, 1.0F);
        const auto t0 = std::chrono::steady_clock::now();
        try {
          c.all_reduce(v);
          ADD_FAILURE() << "all_reduce returned without its peer";
        } catch (const Error& e) {
          expect_contains(e.what(), {"rank 0 of 2", "waited 1.", "for rank 1", "RLX_DISTRIBUTED_TIMEOUT"});
        }
        EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
        done.set_value();
      },
      1s);
  expect_no_errors(errors);
}

TEST(TcpEngine, AMasterNobodyServesIsAnErrorNamingItsAddressTheRankAndTheTime) {
  const int port = free_port();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    distributed::make_tcp_engine(options(port, 1, 2, 1s));
    ADD_FAILURE() << "joined a world whose rank 0 does not exist";
  } catch (const Error& e) {
    expect_contains(e.what(), {"rank 1 of 2", "127.0.0.1:" + std::to_string(port), "after 1.", "MASTER_ADDR"});
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

TEST(TcpEngine, ARankThatNeverJoinsIsNamed) {
  try {
    distributed::make_tcp_engine(options(free_port(), 0, 2, 1s));
    ADD_FAILURE() << "rank 0 finished meeting a rank that never came";
  } catch (const Error& e) {
    expect_contains(e.what(), {"rank 0 of 2", "rank 1's address", "waited 1."});
  }
}

TEST(TcpEngine, APortInUseIsAnError) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  try {
    distributed::make_tcp_engine(options(port, 0, 2, 1s));
    ADD_FAILURE() << "rank 0 served on a port another socket listens on";
  } catch (const Error& e) {
    expect_contains(e.what(), {"cannot listen on 127.0.0.1:" + std::to_string(port), "in use", "RLX_DISTRIBUTED_PORT"});
  }
  ::close(fd);
}

TEST(TcpEngine, RanksThatDisagreeOnTheWorldAreAllTold) {
  const int port = free_port();
  std::string errors[2];
  std::thread r0([&] {
    try {
      distributed::make_tcp_engine(options(port, 0, 2, 5s));
    } catch (const Error& e) {
      errors[0] = e.what();
    }
  });
  std::thread r1([&] {
    try {
      distributed::make_tcp_engine(options(port, 1, 3, 5s));
    } catch (const Error& e) {
      errors[1] = e.what();
    }
  });
  r0.join();
  r1.join();
  // Both learn the reason, rank 0 too (it was waiting for rank 1's address), without waiting for the timeout.
  for (const auto& e : errors) expect_contains(e, {"rank 1 says WORLD_SIZE is 3, rank 0 says 2"});
}

TEST(TcpEngine, OptionsOutOfRangeAreRefused) {
  EXPECT_THROW(distributed::make_tcp_engine(options(free_port(), 2, 2)), Error);
  EXPECT_THROW(distributed::make_tcp_engine(options(free_port(), 0, 0)), Error);
  EXPECT_THROW(distributed::make_tcp_engine(options(0, 1, 2)), Error);
  auto one = distributed::make_tcp_engine(options(free_port(), 0, 1));  // world size 1 opens no socket
  EXPECT_EQ(one->world_size(), 1);
  std::vector<float> v{1.5F};
  Communicator(one).all_reduce(v);
  EXPECT_EQ(v[0], 1.5F);
}

TEST(TcpStore, GetWaitsForALaterSet) {
  const int port = free_port();
  std::vector<std::byte> got;
  std::thread r0([&] {
    distributed::detail::TcpStore s({"127.0.0.1", port, 0, 2, 10s});
    got = s.get("k", "rank 1's value");
    s.get("done", "rank 1 to finish");
  });
  std::thread r1([&] {
    distributed::detail::TcpStore s({"127.0.0.1", port, 1, 2, 10s});
    std::this_thread::sleep_for(200ms);
    const std::string v = "hello";
    s.set("k", std::as_bytes(std::span(v.data(), v.size())));
    s.set("done", {});
  });
  r0.join();
  r1.join();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(got.data()), got.size()), "hello");
}

// NCCL with RANK/WORLD_SIZE launchers: rank 0's unique id reaches every rank through the store, by the same
// function init() hands the NCCL engine (no GPU needed to check it).
TEST(TcpStore, NcclUniqueIdReachesEveryRank) {
  const int port = free_port(), world = 3;
  std::vector<std::array<std::byte, distributed::detail::kNcclUniqueIdBytes>> ids(world);
  for (std::size_t i = 0; i < ids[0].size(); ++i) ids[0][i] = static_cast<std::byte>(i * 7 + 3);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(world);
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        auto store = std::make_shared<distributed::detail::TcpStore>(
            distributed::detail::StoreOptions{"127.0.0.1", port, r, world, 10s});
        const auto share = distributed::detail::nccl_id_through_store(store);
        share(ids[static_cast<std::size_t>(r)]);
        // Rank 0 keeps serving until every rank has read the id (NCCL's communicator set-up is collective).
        if (r == 0)
          for (int p = 1; p < world; ++p) store->get("read/" + std::to_string(p), "the others");
        else
          store->set("read/" + std::to_string(r), {});
        std::array<std::byte, 12> wrong{};
        if (r == 1) {
          EXPECT_THROW(share(wrong), Error);
        }
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  expect_no_errors(errors);
  for (int r = 1; r < world; ++r) EXPECT_EQ(ids[static_cast<std::size_t>(r)], ids[0]) << "rank " << r;
}

TEST(TcpStore, AStoreThatGoesAwayIsAnErrorNotAHang) {
  const int port = free_port();
  std::promise<void> joined;
  auto ready = joined.get_future();
  std::thread r0([&] {
    distributed::detail::TcpStore s({"127.0.0.1", port, 0, 2, 30s});
    ready.wait();  // then rank 0 exits before sharing anything
  });
  const auto t0 = std::chrono::steady_clock::now();
  try {
    distributed::detail::TcpStore s({"127.0.0.1", port, 1, 2, 30s});
    joined.set_value();
    std::array<std::byte, distributed::detail::kNcclUniqueIdBytes> id{};
    distributed::detail::nccl_id_through_store(
        std::shared_ptr<distributed::detail::TcpStore>(&s, [](distributed::detail::TcpStore*) {}))(id);
    ADD_FAILURE() << "got an id from a store that closed";
  } catch (const Error& e) {
    expect_contains(e.what(), {"rank 1 of 2", "closed the connection"});
  }
  r0.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

}  // namespace
