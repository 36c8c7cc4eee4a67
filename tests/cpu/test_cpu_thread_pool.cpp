// The CPU backend's thread pool: coverage of every index, concurrent and
// nested submissions, exception propagation and parking of idle workers.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "backends/cpu/thread_pool.hpp"

namespace rlx::backends::cpu {
namespace {

using namespace std::chrono_literals;

// Waits (bounded) until `pred` holds; returns whether it did.
template <class P>
bool eventually(P pred, std::chrono::milliseconds limit = 5000ms) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return pred();
}

TEST(CpuThreadPool, RunsEveryTaskExactlyOnce) {
  ThreadPool pool(4);
  for (std::int64_t n : {1, 3, 4, 17, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
    pool.run(n, [&](std::int64_t i) { hits[std::size_t(i)].fetch_add(1); });
    for (std::int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[std::size_t(i)].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(CpuThreadPool, ParallelForCoversTheRangeInDisjointChunks) {
  for (std::int64_t n : {0, 1, 7, 100, 100000}) {
    for (std::int64_t grain : {1, 16, 4096}) {
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
      parallel_for(n, grain, [&](std::int64_t b, std::int64_t e) {
        ASSERT_LE(0, b);
        ASSERT_LT(b, e);
        ASSERT_LE(e, n);
        for (std::int64_t i = b; i < e; ++i) hits[std::size_t(i)].fetch_add(1);
      });
      for (std::int64_t i = 0; i < n; ++i)
        ASSERT_EQ(hits[std::size_t(i)].load(), 1) << n << "/" << grain << " at " << i;
    }
  }
}

TEST(CpuThreadPool, UsesSeveralThreadsWithDistinctSlots) {
  ThreadPool pool(4);
  std::mutex mu;
  std::set<std::thread::id> threads;
  // Tasks wait for each other so that one thread cannot run them all.
  std::atomic<int> arrived{0};
  pool.run(4, [&](std::int64_t) {
    arrived.fetch_add(1);
    eventually([&] { return arrived.load() == 4; }, 500ms);
    std::lock_guard lock(mu);
    threads.insert(std::this_thread::get_id());
  });
  EXPECT_GT(threads.size(), 1u);
  // Slots of the process-wide pool are below its size and distinct per concurrent thread.
  ThreadPool& global = ThreadPool::instance();
  std::vector<std::atomic<int>> in_use(static_cast<std::size_t>(global.size()));
  std::atomic<bool> clash{false};
  parallel_for(global.size() * 64, 1, [&](std::int64_t b, std::int64_t e) {
    int s = ThreadPool::slot();
    ASSERT_GE(s, 0);
    ASSERT_LT(s, global.size());
    if (in_use[std::size_t(s)].fetch_add(1) != 0) clash = true;
    std::this_thread::sleep_for(std::chrono::microseconds(e - b));
    in_use[std::size_t(s)].fetch_sub(1);
  });
  EXPECT_FALSE(clash.load()) << "two threads ran with the same scratch slot at once";
}

TEST(CpuThreadPool, ConcurrentSubmittersAllComplete) {
  ThreadPool pool(3);
  constexpr int kSubmitters = 6, kRounds = 200;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kSubmitters; ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        const std::int64_t n = 1 + (t * 7 + r) % 37;
        std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
        pool.run(n, [&](std::int64_t i) { hits[std::size_t(i)].fetch_add(1); });
        for (auto& h : hits)
          if (h.load() != 1) failures.fetch_add(1);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(CpuThreadPool, NestedCallsRunInline) {
  ThreadPool pool(4);
  std::atomic<std::int64_t> total{0};
  pool.run(8, [&](std::int64_t i) {
    auto outer = std::this_thread::get_id();
    pool.run(10, [&](std::int64_t j) {
      EXPECT_EQ(std::this_thread::get_id(), outer);  // inline: the same thread
      total.fetch_add(i * 10 + j);
    });
  });
  EXPECT_EQ(total.load(), 79 * 80 / 2);
  // The process-wide helper nests too.
  std::atomic<std::int64_t> count{0};
  parallel_for(64, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i)
      parallel_for(100, 1, [&](std::int64_t b2, std::int64_t e2) { count.fetch_add(e2 - b2); });
  });
  EXPECT_EQ(count.load(), 6400);
}

TEST(CpuThreadPool, RethrowsTheFirstTaskException) {
  ThreadPool pool(4);
  EXPECT_THROW(pool.run(100,
                        [&](std::int64_t i) {
                          if (i == 37) throw std::runtime_error("task 37 failed");
                        }),
               std::runtime_error);
  // The pool keeps working afterwards.
  std::atomic<int> n{0};
  pool.run(50, [&](std::int64_t) { n.fetch_add(1); });
  EXPECT_EQ(n.load(), 50);
}

TEST(CpuThreadPool, IdleWorkersPark) {
  ThreadPool pool(4);
  std::atomic<int> n{0};
  pool.run(100, [&](std::int64_t) { n.fetch_add(1); });
  EXPECT_TRUE(eventually([&] { return pool.parked() == 3; })) << "parked: " << pool.parked();
  // Parked workers wake up for new work.
  std::mutex mu;
  std::set<std::thread::id> ids;
  std::atomic<int> arrived{0};
  pool.run(4, [&](std::int64_t) {
    arrived.fetch_add(1);
    eventually([&] { return arrived.load() == 4; }, 500ms);
    std::lock_guard lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_GT(ids.size(), 1u);
  EXPECT_TRUE(eventually([&] { return pool.parked() == 3; }));
}

TEST(CpuThreadPool, MaxThreadsLimitsParticipants) {
  ThreadPool pool(4);
  std::mutex mu;
  std::set<std::thread::id> ids;
  pool.run(
      64,
      [&](std::int64_t) {
        std::this_thread::sleep_for(100us);
        std::lock_guard lock(mu);
        ids.insert(std::this_thread::get_id());
      },
      2);
  EXPECT_LE(ids.size(), 2u);
}

}  // namespace
}  // namespace rlx::backends::cpu
