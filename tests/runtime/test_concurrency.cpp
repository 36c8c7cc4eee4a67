// Calls on one CompiledGraph from several threads. A run is a whole-graph job
// on the executable's one arena, so CompiledGraph serialises them
// (session.hpp): 8 threads running one compiled graph must get, bit for bit,
// what serial runs get, and a call that throws must not leave the graph locked.
// Without the lock these runs raced on the bound input pointers and the arena
// (heap corruption from Python threads; TSan reported races from bind_inputs on).
// Clones running side by side are covered here too, since the TSan build runs
// this binary (make test-tsan).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "rlx/error.hpp"
#include "rlx/models/demo_models.hpp"
#include "rlx/runtime/session.hpp"
#include "support/devices.hpp"
#include "support/testing.hpp"

namespace rlx {
namespace {

using runtime::NamedTensor;
using testing::Feeds;
using testing::named;
using testing::same_bits;

constexpr int kThreads = 8;

class Concurrency : public testing::DeviceTest {
 protected:
  // A two-layer MLP: matmuls with bias and relu epilogues, small enough for
  // thousands of runs under a sanitizer.
  ir::Graph graph() const { return models::mlp({.batch = 4, .width = 32, .layers = 2}); }
};

// 8 threads share one CompiledGraph, each with its own inputs, through every
// run entry point (run, run_into, run_raw); one more thread keeps calling it
// with a missing input, and must get rlx::Error every time without blocking
// the others (an exception releases the lock).
TEST_P(Concurrency, EightThreadsOnOneCompiledGraphGetTheSerialResults) {
  const auto g = graph();
  const auto params = models::random_params(g, testing::test_seed());
  auto compiled = Session(GetParam()).compile(g);
  for (const auto& [k, v] : params) compiled.set_param(k, v);
  std::vector<Feeds> inputs;
  std::vector<std::vector<ir::Tensor>> want;
  for (int t = 0; t < kThreads; ++t) {
    inputs.push_back(models::random_inputs(g, testing::test_seed() + 1 + std::uint64_t(t)));
    want.push_back(compiled.run(named(inputs.back())));
  }
  std::atomic<int> mismatches{0}, wrong_errors{0}, bad_calls{0};
  std::vector<std::string> errors(kThreads);
  std::atomic<bool> done{false};
  auto work = [&](int t) {
    try {
      const auto in = named(inputs[std::size_t(t)]);
      std::vector<ir::Tensor> into;
      for (const auto& s : compiled.output_specs()) into.emplace_back(s.dtype, s.shape);
      std::vector<void*> raw;
      for (auto& o : into) raw.push_back(o.data());
      // Start only once the failing caller has made a call, so its calls interleave with these runs
      // on a loaded machine too (otherwise the workers could finish before it is scheduled).
      while (bad_calls.load() == 0) std::this_thread::yield();
      for (int r = 0; r < 60; ++r) {
        std::vector<ir::Tensor> got;
        if (r % 3 == 0) {
          got = compiled.run(in);
        } else {
          if (r % 3 == 1)
            compiled.run_into(in, into);
          else
            compiled.run_raw(in, raw);
          got = into;
        }
        if (!same_bits(got, want[std::size_t(t)])) mismatches.fetch_add(1);
      }
    } catch (const std::exception& e) {
      errors[std::size_t(t)] = e.what();
    }
  };
  std::thread misuser([&] {
    while (!done.load()) {
      try {
        compiled.run(std::vector<NamedTensor>{});
        wrong_errors.fetch_add(1);
      } catch (const Error& e) {
        if (std::string(e.what()).find("is missing") == std::string::npos) wrong_errors.fetch_add(1);
      }
      bad_calls.fetch_add(1);
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(work, t);
  for (auto& th : threads) th.join();
  done = true;
  misuser.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[std::size_t(t)], "") << "thread " << t;
  EXPECT_EQ(mismatches.load(), 0) << "runs whose outputs differ from the serial run's";
  EXPECT_EQ(wrong_errors.load(), 0) << "calls without inputs that did not fail with 'is missing'";
  EXPECT_GT(bad_calls.load(), 0);
  // The graph is still usable, and still right.
  EXPECT_TRUE(same_bits(compiled.run(named(inputs[0])), want[0]));
}

// Params set from one thread while others run the same graph: every run sees
// either the old weights or the new, never a torn mix.
TEST_P(Concurrency, SetParamWhileRunningOnOneGraphIsSerialised) {
  const auto g = graph();
  const auto old_params = models::random_params(g, testing::test_seed());
  const auto new_params = models::random_params(g, testing::test_seed() + 99);
  auto compiled = Session(GetParam()).compile(g);
  const auto in = models::random_inputs(g, testing::test_seed() + 1);
  for (const auto& [k, v] : new_params) compiled.set_param(k, v);
  const auto want_new = compiled.run(named(in));
  for (const auto& [k, v] : old_params) compiled.set_param(k, v);
  const auto want_old = compiled.run(named(in));
  ASSERT_FALSE(same_bits(want_old, want_new));
  // Each set_param is one call, so a run may see w0 new and w1 old in between;
  // only one param (w0) changes, back and forth, so each run matches one of two results.
  auto mixed = old_params;
  mixed["w0"] = new_params.at("w0");
  for (const auto& [k, v] : mixed) compiled.set_param(k, v);
  const auto want_mixed = compiled.run(named(in));
  for (const auto& [k, v] : old_params) compiled.set_param(k, v);
  std::atomic<int> torn{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> runners;
  for (int t = 0; t < 4; ++t)
    runners.emplace_back([&] {
      for (int r = 0; r < 40; ++r) {
        const auto got = compiled.run(named(in));
        if (!same_bits(got, want_old) && !same_bits(got, want_mixed)) torn.fetch_add(1);
      }
    });
  std::thread setter([&] {
    for (int r = 0; !done.load(); ++r) compiled.set_param("w0", (r % 2 ? old_params : new_params).at("w0"));
  });
  for (auto& th : runners) th.join();
  done = true;
  setter.join();
  EXPECT_EQ(torn.load(), 0);
}

// Clones (each its own arena, weights shared) run side by side, 8 at once,
// and match the serial runs bit for bit.
TEST_P(Concurrency, EightClonesRunSideBySide) {
  const auto g = graph();
  const auto params = models::random_params(g, testing::test_seed());
  auto compiled = Session(GetParam()).compile(g);
  for (const auto& [k, v] : params) compiled.set_param(k, v);
  std::vector<Feeds> inputs;
  std::vector<std::vector<ir::Tensor>> want;
  std::vector<CompiledGraph> clones;
  for (int t = 0; t < kThreads; ++t) {
    inputs.push_back(models::random_inputs(g, testing::test_seed() + 1 + std::uint64_t(t)));
    want.push_back(compiled.run(named(inputs.back())));
    clones.push_back(compiled.clone());
  }
  std::atomic<int> mismatches{0};
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      try {
        for (int r = 0; r < 60; ++r)
          if (!same_bits(clones[std::size_t(t)].run(named(inputs[std::size_t(t)])), want[std::size_t(t)]))
            mismatches.fetch_add(1);
      } catch (const std::exception& e) {
        errors[std::size_t(t)] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[std::size_t(t)], "") << "thread " << t;
  EXPECT_EQ(mismatches.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Devices, Concurrency, ::testing::Values(Device::Cpu, Device::Vulkan), testing::device_name);

}  // namespace
}  // namespace rlx
