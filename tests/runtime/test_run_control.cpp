// Ending runs that do not end by themselves: a while loop whose condition
// never turns false is legal IR, so a compiled graph offers a timeout and a
// cancel from another thread (rlx/run_control.hpp). Both must stop the run with
// rlx::Error, on every backend, and leave the graph usable.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/runtime/session.hpp"
#include "support/devices.hpp"
#include "support/testing.hpp"

namespace rlx {
namespace {

using namespace std::chrono_literals;

// while (x < limit) x = x + step: endless when step is 0 and x < limit. The cond
// and the body both take (carry x, consts limit and step).
ir::Graph counting_loop() {
  ir::Graph cond("cond"), body("body");
  {
    auto x = cond.input("x", {});
    auto lim = cond.input("limit", {});
    cond.input("step", {});
    cond.add_output(cond.binary(ir::OpKind::Lt, x, lim));
  }
  {
    auto x = body.input("x", {});
    body.input("limit", {});
    auto step = body.input("step", {});
    body.add_output(body.add(x, step));
  }
  ir::Graph g("loop");
  auto x = g.input("x", {});
  auto lim = g.input("limit", {});
  auto step = g.input("step", {});
  auto r = ir::while_loop(g, ir::body_ref(std::move(cond)), ir::body_ref(std::move(body)), {x}, {lim, step});
  g.add_output(r[0], "x");
  return g;
}

ir::Tensor scalar(float v) { return ir::Tensor::scalar(ir::DType::F32, v); }

class RunControlTest : public testing::DeviceTest {
 protected:
  CompiledGraph compile() const { return Session(GetParam()).compile(counting_loop()); }
};

TEST_P(RunControlTest, TimeoutEndsAnEndlessLoopAndTheGraphStillRuns) {
  auto c = compile();
  c.set_run_timeout(std::chrono::milliseconds(100));
  const auto t0 = std::chrono::steady_clock::now();
  testing::expect_error(
      [&] {
        c.run({{"x", scalar(0)}, {"limit", scalar(1)}, {"step", scalar(0)}});
      },
      {"passed its timeout of 0.100 s"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 60s) << "the timeout did not stop the loop";
  auto out = c.run({{"x", scalar(0)}, {"limit", scalar(5)}, {"step", scalar(1)}});
  EXPECT_EQ(out[0].get(0), 5.0);
  c.set_run_timeout(std::nullopt);
  EXPECT_EQ(c.run({{"x", scalar(1)}, {"limit", scalar(3)}, {"step", scalar(1)}})[0].get(0), 3.0);
}

TEST_P(RunControlTest, CancelFromAnotherThreadEndsTheRun) {
  auto c = compile();
  std::atomic<bool> done{false};
  std::thread canceller([&] {
    // Keep cancelling until the run has ended: a cancel before the run starts does not carry over.
    while (!done.load()) {
      std::this_thread::sleep_for(20ms);
      c.cancel();
    }
  });
  testing::expect_error(
      [&] {
        c.run({{"x", scalar(0)}, {"limit", scalar(1)}, {"step", scalar(0)}});
      },
      {"the run was cancelled"});
  done = true;
  canceller.join();
  EXPECT_EQ(c.run({{"x", scalar(0)}, {"limit", scalar(2)}, {"step", scalar(1)}})[0].get(0), 2.0);
}

TEST_P(RunControlTest, ClonesAreCancelledSeparately) {
  auto c = compile();
  auto other = c.clone();
  other.cancel();  // no run in flight: nothing carries over to the next run
  EXPECT_EQ(other.run({{"x", scalar(0)}, {"limit", scalar(2)}, {"step", scalar(1)}})[0].get(0), 2.0);
  c.set_run_timeout(std::chrono::milliseconds(50));
  testing::expect_error([&] { c.run({{"x", scalar(0)}, {"limit", scalar(1)}, {"step", scalar(0)}}); }, {"timeout"});
  EXPECT_EQ(other.run({{"x", scalar(0)}, {"limit", scalar(2)}, {"step", scalar(1)}})[0].get(0), 2.0);
}

INSTANTIATE_TEST_SUITE_P(Devices, RunControlTest, ::testing::Values(Device::Cpu, Device::Vulkan), testing::device_name);

}  // namespace
}  // namespace rlx
