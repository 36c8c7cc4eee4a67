// The collectives on whatever world this process is in: world size 1 under
// plain ctest (the local engine), 2 under mpirun (CTest's distributed_mpirun_*
// runs this binary as 2 ranks). Every value a rank contributes depends on its
// rank, so each result is checked against what the contributions must give.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "rlx/distributed/distributed.hpp"
#include "rlx/env.hpp"
#include "rlx/error.hpp"

namespace {

using namespace rlx;
using distributed::ReduceOp;

distributed::Communicator comm() { return distributed::init(); }

// Rank r's contribution: values whose f32 sum depends on the order they are added in.
std::vector<float> contribution(int r, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = (r % 2 == 0 ? 1e8F : 1.0F) * static_cast<float>(i + 1) + 0.37F * static_cast<float>(r) -
           (r % 3 == 2 ? 1e8F * static_cast<float>(i + 1) : 0.0F);
  return v;
}

TEST(Collectives, WorldMatchesTheLauncher) {
  auto c = comm();
  EXPECT_GE(c.world_size(), 1);
  EXPECT_GE(c.rank(), 0);
  EXPECT_LT(c.rank(), c.world_size());
  if (c.world_size() == 1 && !std::getenv("OMPI_COMM_WORLD_SIZE")) {
    EXPECT_EQ(c.engine(), "local");
  }
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) {
    EXPECT_EQ(c.engine(), "mpi");
    EXPECT_EQ(c.world_size(), std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE")));
    EXPECT_EQ(c.rank(), std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")));
  }
  if (!std::getenv("OMPI_COMM_WORLD_SIZE") && std::getenv("WORLD_SIZE") && std::atoi(std::getenv("WORLD_SIZE")) > 1) {
    // started by run_tcp.sh (a torchrun-style launcher): tcp, or the engine RLX_DISTRIBUTED asks for (nccl)
    const char* asked = std::getenv("RLX_DISTRIBUTED");
    EXPECT_EQ(c.engine(), asked && std::string(asked) != "auto" ? std::string(asked) : std::string("tcp"));
    EXPECT_EQ(c.world_size(), std::atoi(std::getenv("WORLD_SIZE")));
    EXPECT_EQ(c.rank(), std::atoi(std::getenv("RANK")));
  }
  EXPECT_TRUE(distributed::is_initialized());
  EXPECT_EQ(distributed::init().rank(), c.rank());  // the same world on every call
}

TEST(Collectives, AllReduceSumIsTakenInRankOrder) {
  auto c = comm();
  if (!c.rank_ordered_sums() && c.world_size() > 2)  // 2 ranks: a + b == b + a, whatever the engine's order
    GTEST_SKIP() << "engine " << c.engine() << " sums in its own order (NCCL's ring or tree), not rank order";
  const std::size_t n = 37;
  std::vector<float> data = contribution(c.rank(), n);
  c.all_reduce(data);
  // The expected value: ((c0 + c1) + c2) ... in f32, exactly as a single process would add them.
  std::vector<float> want = contribution(0, n);
  for (int r = 1; r < c.world_size(); ++r) {
    auto v = contribution(r, n);
    for (std::size_t i = 0; i < n; ++i) want[i] += v[i];
  }
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(data[i], want[i]) << "element " << i;
}

// Past kSplitAllReduceBytes, beyond 2 ranks, all_reduce runs as a reduce-scatter then an all-gather (the
// engines' default and tcp's): the sums stay rank-ordered bit for bit, the leftover count % W elements too.
TEST(Collectives, ALargeAllReduceIsStillTakenInRankOrder) {
  auto c = comm();
  if (!c.rank_ordered_sums() && c.world_size() > 2)
    GTEST_SKIP() << "engine " << c.engine() << " sums in its own order (NCCL's ring or tree), not rank order";
  const std::size_t n = distributed::kSplitAllReduceBytes / sizeof(float) + 1;  // past the size; n % 3 == 2
  std::vector<float> data = contribution(c.rank(), n), want = contribution(0, n);
  for (int r = 1; r < c.world_size(); ++r) {
    const auto v = contribution(r, n);
    for (std::size_t i = 0; i < n; ++i) want[i] += v[i];
  }
  c.all_reduce(data);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(data[i], want[i]) << "element " << i << " of " << n;
}

TEST(Collectives, AllReduceOutOfPlaceLeavesItsInputAlone) {
  auto c = comm();
  const std::size_t n = 37;
  const std::vector<float> mine = contribution(c.rank(), n);
  std::vector<float> in = mine, out(n, -1.0F), inplace = mine;
  c.all_reduce(distributed::ConstBuffer{in.data(), n}, distributed::Buffer{out.data(), n});
  c.all_reduce(inplace);
  EXPECT_EQ(in, mine);
  EXPECT_EQ(out, inplace);  // the same sums as in place
  // The same buffer as both is the in-place reduction; a partial overlap or another count is refused.
  c.all_reduce(distributed::ConstBuffer{in.data(), n}, distributed::Buffer{in.data(), n});
  EXPECT_EQ(in, inplace);
  EXPECT_THROW(c.all_reduce(distributed::ConstBuffer{in.data(), n - 1}, distributed::Buffer{in.data() + 1, n - 1}),
               Error);
  EXPECT_THROW(c.all_reduce(distributed::ConstBuffer{in.data(), n}, distributed::Buffer{out.data(), n - 1}), Error);
}

TEST(Collectives, AllReduceMaxMinAndF64) {
  auto c = comm();
  std::vector<double> mx{static_cast<double>(c.rank()), -static_cast<double>(c.rank())};
  std::vector<double> mn = mx;
  c.all_reduce(std::span<double>(mx), ReduceOp::Max);
  c.all_reduce(std::span<double>(mn), ReduceOp::Min);
  EXPECT_EQ(mx[0], c.world_size() - 1);
  EXPECT_EQ(mx[1], 0);
  EXPECT_EQ(mn[0], 0);
  EXPECT_EQ(mn[1], -(c.world_size() - 1));
}

TEST(Collectives, AllReduceBf16SumsInF32AndRoundsOnce) {
  auto c = comm();
  ir::Tensor t = ir::Tensor::from_f32({3}, std::vector<float>{1.0F, 2.0F, 0.5F});
  ir::Tensor b(ir::DType::BF16, {3});
  for (std::int64_t i = 0; i < 3; ++i) b.set(i, t.get(i) * (c.rank() + 1));
  c.all_reduce(b);
  const double scale = c.world_size() * (c.world_size() + 1) / 2.0;
  EXPECT_EQ(b.get(0), 1.0 * scale);
  EXPECT_EQ(b.get(1), 2.0 * scale);
  EXPECT_EQ(b.get(2), 0.5 * scale);
}

TEST(Collectives, AllGatherIsInRankOrder) {
  auto c = comm();
  std::vector<float> mine{static_cast<float>(c.rank()), static_cast<float>(10 * c.rank())};
  std::vector<float> all(2 * static_cast<std::size_t>(c.world_size()), -1);
  c.all_gather(mine, all);
  for (int r = 0; r < c.world_size(); ++r) {
    EXPECT_EQ(all[2 * r], r);
    EXPECT_EQ(all[2 * r + 1], 10 * r);
  }
}

TEST(Collectives, ReduceScatterGivesEachRankItsChunk) {
  auto c = comm();
  const auto w = static_cast<std::size_t>(c.world_size());
  std::vector<float> in(3 * w);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) + 100.0F * static_cast<float>(c.rank());
  std::vector<float> out(3, -1);
  c.reduce_scatter(in, out);
  const float rank_sum = 100.0F * static_cast<float>(w * (w - 1) / 2);
  for (std::size_t i = 0; i < 3; ++i)
    EXPECT_EQ(out[i], static_cast<float>(w) * static_cast<float>(3 * c.rank() + i) + rank_sum);
}

TEST(Collectives, BroadcastFromTheLastRank) {
  auto c = comm();
  const int root = c.world_size() - 1;
  std::vector<float> v(5, static_cast<float>(c.rank()));
  c.broadcast(std::span<float>(v), root);
  for (float x : v) EXPECT_EQ(x, root);
  ir::Tensor t = ir::Tensor::scalar(ir::DType::F64, c.rank() == 0 ? 2.5 : 0.0);
  c.broadcast(t, 0);
  EXPECT_EQ(t.get(0), 2.5);
}

TEST(Collectives, SendRecvAroundTheRing) {
  auto c = comm();
  if (c.world_size() < 2)
    GTEST_SKIP() << "world size 1: send/recv need a peer (ctest runs this binary under mpirun and run_tcp.sh too)";
  const int next = (c.rank() + 1) % c.world_size(), prev = (c.rank() + c.world_size() - 1) % c.world_size();
  std::vector<float> out{static_cast<float>(c.rank()), 7.0F}, in(2, -1);
  if (c.rank() % 2 == 0) {
    c.send(out, next);
    c.recv(in, prev);
  } else {
    c.recv(in, prev);
    c.send(out, next);
  }
  EXPECT_EQ(in[0], prev);
  EXPECT_EQ(in[1], 7.0F);
  c.barrier();
}

// Collectives on buffers in the GPU's memory, on an engine that takes them (nccl: bench/gpu.sh nccl runs this
// binary as 2 ranks on 2 GPUs). Small integers, so that every sum is exact whatever order NCCL adds in.
TEST(Collectives, DeviceMemoryCollectivesOnTheRanksGpu) {
  auto c = comm();
  if (!c.takes_device_memory())
    GTEST_SKIP() << "engine " << c.engine() << " takes host memory only (the nccl engine runs this on GPUs)";
  const int w = c.world_size(), r = c.rank();
  EXPECT_GE(c.device(), 0);
  const std::size_t n = 1000;
  for (ir::DType dt : {ir::DType::F32, ir::DType::BF16}) {
    SCOPED_TRACE(std::string(ir::dtype_name(dt)));
    ir::Tensor mine(dt, {static_cast<std::int64_t>(n)});
    for (std::size_t i = 0; i < n; ++i) mine.set(static_cast<std::int64_t>(i), double((r + 1) * int(i % 7 + 1)));
    auto m = c.allocate_device(mine.nbytes());
    m->upload(std::span<const std::byte>(mine.data(), mine.nbytes()));
    c.all_reduce(m->buffer(dt, n));
    ir::Tensor got(dt, {static_cast<std::int64_t>(n)});
    m->download(std::span<std::byte>(got.data(), got.nbytes()));
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(got.get(static_cast<std::int64_t>(i)), double(w * (w + 1) / 2 * int(i % 7 + 1))) << i;

    // Out of place, device to device: `in` stays as it was.
    auto sum = c.allocate_device(mine.nbytes());
    m->upload(std::span<const std::byte>(mine.data(), mine.nbytes()));
    c.all_reduce(m->const_buffer(dt, n), sum->buffer(dt, n));
    sum->download(std::span<std::byte>(got.data(), got.nbytes()));
    ASSERT_EQ(got.get(6), double(w * (w + 1) / 2 * 7));
    m->download(std::span<std::byte>(got.data(), got.nbytes()));
    ASSERT_EQ(got.get(6), double((r + 1) * 7));

    // all_gather into device memory, then reduce_scatter of it: each rank gets its chunk of world x the sum.
    auto all = c.allocate_device(mine.nbytes() * static_cast<std::size_t>(w));
    m->upload(std::span<const std::byte>(mine.data(), mine.nbytes()));
    c.all_gather(m->const_buffer(dt, n), all->buffer(dt, n * static_cast<std::size_t>(w)));
    ir::Tensor gathered(dt, {static_cast<std::int64_t>(n) * w});
    all->download(std::span<std::byte>(gathered.data(), gathered.nbytes()));
    for (int q = 0; q < w; ++q)
      ASSERT_EQ(gathered.get(static_cast<std::int64_t>(q * n + 5)), double((q + 1) * 6)) << "rank " << q;
    c.reduce_scatter(all->const_buffer(dt, n * static_cast<std::size_t>(w)), m->buffer(dt, n));
    m->download(std::span<std::byte>(got.data(), got.nbytes()));
    // Chunk r of the gathered buffer is rank r's contribution; every rank holds the same gathered buffer.
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(got.get(static_cast<std::int64_t>(i)), double(w * (r + 1) * int(i % 7 + 1))) << i;
    // broadcast from the last rank, in place.
    m->upload(std::span<const std::byte>(mine.data(), mine.nbytes()));
    c.broadcast(m->buffer(dt, n), w - 1);
    m->download(std::span<std::byte>(got.data(), got.nbytes()));
    ASSERT_EQ(got.get(3), double(w * 4));
  }
}

// A test double that says it takes device memory, so that Communicator's checks of it run on any machine.
class DeviceMemoryEngine final : public distributed::Engine {
 public:
  std::string_view name() const override { return "device-double"; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int device() const override { return 0; }
  bool takes_device_memory() const override { return true; }
  void all_gather(distributed::ConstBuffer, distributed::Buffer) override { ++calls; }
  void broadcast(distributed::Buffer, int) override { ++calls; }
  void send(distributed::ConstBuffer, int) override {}
  void recv(distributed::Buffer, int) override {}
  void barrier() override {}
  int calls = 0;
};

// Memory behind the DeviceMemory interface that is host memory underneath: its range checks run anywhere.
class HostBackedMemory final : public distributed::DeviceMemory {
 public:
  explicit HostBackedMemory(std::size_t n) : bytes_(n) {}
  void* data() const override { return const_cast<std::byte*>(bytes_.data()); }  // NOLINT: a test double
  std::size_t bytes() const override { return bytes_.size(); }

 protected:
  void copy_in(const std::byte* src, std::size_t offset, std::size_t n) override {
    std::memcpy(bytes_.data() + offset, src, n);
  }
  void copy_out(std::byte* dst, std::size_t offset, std::size_t n) const override {
    std::memcpy(dst, bytes_.data() + offset, n);
  }

 private:
  std::vector<std::byte> bytes_;
};

TEST(Collectives, DeviceBuffersAreCheckedBeforeAnyEngineSeesThem) {
  auto c = comm();
  const auto expect_error = [](auto&& f, std::initializer_list<std::string> needles) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      for (const auto& needle : needles) EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  std::vector<float> host(4);
  const distributed::Buffer on_device{host.data(), 4, ir::DType::F32, distributed::Memory::Device};
  if (!c.takes_device_memory()) {
    EXPECT_EQ(c.device(), -1);
    expect_error([&] { c.all_reduce(on_device); },
                 {"distributed.all_reduce: data is in device memory", "takes host memory only"});
    expect_error([&] { c.allocate_device(16); }, {"allocate_device", "needs the nccl engine"});
  }
  // An engine that takes device memory still needs in and out in the same memory.
  auto engine = std::make_shared<DeviceMemoryEngine>();
  distributed::Communicator d(engine);
  expect_error(
      [&] {
        d.all_gather(distributed::ConstBuffer{host.data(), 4, ir::DType::F32}, on_device);
      },
      {"all_gather: in is in host memory but out is in device memory", "engine device-double"});
  expect_error([&] { d.allocate_device(16); }, {"engine device-double has no device memory"});
  d.all_gather(distributed::ConstBuffer{host.data(), 4, ir::DType::F32, distributed::Memory::Device}, on_device);
  EXPECT_EQ(engine->calls, 1);

  HostBackedMemory m(16);
  std::vector<std::byte> five(5), sixteen(16, std::byte{7});
  m.upload(sixteen);
  expect_error([&] { m.upload(five, 12); }, {"DeviceMemory.upload: bytes [12, 12 + 5)", "16 bytes allocated"});
  expect_error([&] { m.download(five, 17); }, {"DeviceMemory.download: bytes [17"});
  expect_error([&] { m.buffer(ir::DType::F32, 2, 3); }, {"DeviceMemory.buffer: f32 elements [3, 3 + 2)"});
  // Counts whose byte sizes wrap around are refused, not reduced modulo 2^64.
  expect_error([&] { m.buffer(ir::DType::F32, std::size_t(1) << 62); }, {"do not fit the 16 bytes"});
  expect_error([&] { m.const_buffer(ir::DType::F32, 1, ~std::size_t(0) / 2); }, {"do not fit"});
  const auto b = m.buffer(ir::DType::BF16, 2, 6);
  EXPECT_EQ(b.data, static_cast<std::byte*>(m.data()) + 12);
  EXPECT_EQ(b.memory, distributed::Memory::Device);
  m.download(five, 11);
  EXPECT_EQ(five[4], std::byte{7});
}

TEST(Collectives, UserErrorsNameTheCollectiveTheFieldAndTheRank) {
  auto c = comm();
  std::vector<float> a(2), wrong(2 * static_cast<std::size_t>(c.world_size()) + 1);
  const auto expect_error = [](auto&& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error, expected one mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank "), std::string::npos) << e.what();
    }
  };
  expect_error([&] { c.all_gather(a, wrong); }, "all_gather: out has");
  expect_error([&] { c.reduce_scatter(wrong, a); }, "reduce_scatter: in has");
  expect_error([&] { c.broadcast(std::span<float>(a), c.world_size()); }, "broadcast: root");
  expect_error([&] { c.send(a, c.rank()); }, "send: dst is this rank");
  expect_error([&] { c.recv(a, -1); }, "recv: src -1");
  ir::Tensor ints(ir::DType::I32, {2});
  expect_error([&] { c.all_reduce(ints); }, "all_reduce: data has dtype i32");
  EXPECT_THROW(distributed::parse_engine("gloo"), Error);
}

// init() before any other: ctest runs each case in a process of its own; the whole binary initialises first.
TEST(Collectives, InitChecksTheLaunchersVariables) {
  if (distributed::is_initialized() || std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("WORLD_SIZE"))
    GTEST_SKIP() << "the world is already initialised in this process (ctest runs this case alone)";
  const auto expect_error = [](std::initializer_list<std::pair<const char*, const char*>> vars,
                               const std::string& needle) {
    std::vector<std::unique_ptr<env::ScopedOverride>> set;
    for (const auto& [name, value] : vars) set.push_back(std::make_unique<env::ScopedOverride>(name, value));
    try {
      distributed::init();
      ADD_FAILURE() << "accepted; expected an error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({{"WORLD_SIZE", "2"}}, "WORLD_SIZE is 2 but RANK is unset");
  expect_error({{"RANK", "1"}}, "RANK is 1 but WORLD_SIZE is unset");
  expect_error({{"WORLD_SIZE", "2"}, {"RANK", "2"}}, "RANK is 2 but WORLD_SIZE is 2 (ranks are 0 to 1)");
  expect_error({{"WORLD_SIZE", "2"}, {"RANK", "-1"}}, "RANK is -1");
  expect_error({{"WORLD_SIZE", "0"}, {"RANK", "0"}}, "WORLD_SIZE is 0");
  expect_error({{"WORLD_SIZE", "two"}, {"RANK", "0"}}, "WORLD_SIZE='two' is not an integer");
  expect_error({{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"MASTER_PORT", "70000"}}, "MASTER_PORT is 70000");
  expect_error({{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"RLX_DISTRIBUTED_PORT", "0"}}, "RLX_DISTRIBUTED_PORT is 0");
  expect_error({{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"RLX_DISTRIBUTED_TIMEOUT", "0"}}, "RLX_DISTRIBUTED_TIMEOUT is 0");
  expect_error({{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"MASTER_ADDR", "no-such-host.invalid"}}, "no-such-host.invalid");
  expect_error({{"RLX_DISTRIBUTED", "gloo"}}, "RLX_DISTRIBUTED 'gloo'");
  {
    // A second rank that finds no rank 0 on MASTER_ADDR:MASTER_PORT: the tcp engine, an error within the timeout.
    env::ScopedOverride size("WORLD_SIZE", "2"), rank("RANK", "1"), port("MASTER_PORT", "9"),
        timeout("RLX_DISTRIBUTED_TIMEOUT", "1");
    try {
      distributed::init();
      ADD_FAILURE() << "WORLD_SIZE=2 without a rank 0 was accepted";
    } catch (const Error& e) {
      for (const char* needle : {"rank 1 of 2", "127.0.0.1:9", "after 1."})
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    // The store's port: RLX_DISTRIBUTED_PORT over MASTER_PORT; MASTER_PORT + 1 when torchrun's agent holds it.
    {
      env::ScopedOverride agent("TORCHELASTIC_USE_AGENT_STORE", "True");
      try {
        distributed::init();
        ADD_FAILURE() << "no error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("127.0.0.1:10 after"), std::string::npos) << e.what();
      }
      env::ScopedOverride own("RLX_DISTRIBUTED_PORT", "7");
      try {
        distributed::init();
        ADD_FAILURE() << "no error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("127.0.0.1:7 after"), std::string::npos) << e.what();
      }
    }
    // Asking for the local engine explicitly does not make a second rank appear either.
    EXPECT_THROW(distributed::init({.engine = distributed::EngineKind::Local}), Error);
  }
  EXPECT_FALSE(distributed::is_initialized());
  EXPECT_EQ(distributed::init().engine(), "local");  // and the defaults still work afterwards
}

TEST(Collectives, ReduceInOrderIsTheSingleProcessSum) {
  std::vector<float> parts{1e8F, 1.0F, -1e8F, 1.0F};  // 2 parts of 2
  std::vector<float> out(2);
  distributed::reduce_in_order({parts.data(), 4, ir::DType::F32}, 2, {out.data(), 2, ir::DType::F32}, ReduceOp::Sum);
  EXPECT_EQ(out[0], 1e8F + -1e8F);
  EXPECT_EQ(out[1], 2.0F);
  EXPECT_THROW(distributed::reduce_in_order({parts.data(), 4, ir::DType::F32}, 3, {out.data(), 2, ir::DType::F32},
                                            ReduceOp::Sum),
               Error);
}

TEST(Collectives, EnginesSayWhyTheyAreUnavailable) {
  EXPECT_EQ(distributed::engine_unavailable_reason(distributed::EngineKind::Local), "");
  EXPECT_EQ(distributed::engine_unavailable_reason(distributed::EngineKind::Tcp), "");  // sockets only
  EXPECT_EQ(distributed::parse_engine("tcp"), distributed::EngineKind::Tcp);
  // MPI is built in wherever libopenmpi-dev is (scripts/bootstrap.sh installs it).
  const std::string nccl = distributed::engine_unavailable_reason(distributed::EngineKind::Nccl);
  if (!nccl.empty()) {
    EXPECT_TRUE(nccl.find("nccl") != std::string::npos || nccl.find("NCCL") != std::string::npos) << nccl;
  }
}

}  // namespace
