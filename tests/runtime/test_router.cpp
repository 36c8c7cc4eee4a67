// DeviceRouter: compiles every viable device up front, routes runs, falls
// back through the chain, and re-benchmarks when an (injected) hardware
// snapshot starts or stops showing throttling.
#include <gtest/gtest.h>

#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/router.hpp"
#include "runtime/test_backends.hpp"
#include "support/testing.hpp"

using namespace rlx;
using runtime::Device;
using runtime::DevicePolicy;
using runtime::DeviceRouter;
using runtime::HwSnapshot;

namespace {

ir::Graph model() {
  ir::Graph g("routed");
  auto x = g.input("x", {2, 6});
  g.add_output(g.unary(ir::OpKind::Tanh, g.matmul(x, g.param("w", {6, 3}))), "y");
  return g;
}

class Router : public rlx::testing::MultiBackendTest {
 protected:
  void SetUp() override {
    MultiBackendTest::SetUp();
    std::mt19937_64 rng(rlx::testing::test_seed());
    in_["x"] = rlx::testing::random_tensor(ir::DType::F32, {2, 6}, rng);
    w_ = rlx::testing::random_tensor(ir::DType::F32, {6, 3}, rng);
    named_.push_back({"x", ir::view(in_.at("x"))});
    want_ = reference::run(g_, in_, {{"w", w_}})[0];
  }
  ir::Graph g_ = model();
  reference::TensorMap in_;
  ir::Tensor w_, want_;
  std::vector<runtime::NamedTensor> named_;
};

TEST_F(Router, WarmsEveryDeviceAndRoutes) {
  auto gpu = twin(Device::Gpu);
  twin(Device::Cuda, {.name = "broken-run", .fail_run = true});
  calibrate(Device::Cpu, 10);
  calibrate(Device::Gpu, 1000, 100, 100);
  calibrate(Device::Cuda, 1e6, 1, 1000);  // the cost model's favourite, but it fails at run time
  DeviceRouter router(g_, DevicePolicy::only({Device::Cpu, Device::Gpu, Device::Cuda}));
  EXPECT_EQ(router.warmed(), (std::vector<Device>{Device::Cuda, Device::Gpu, Device::Cpu}));
  EXPECT_EQ(router.devices().cached_devices().size(), 3u);  // compiled at construction
  router.set_param("w", w_);

  EXPECT_THROW(router.run(named_), Error);  // the pick (cuda) fails; run does not fall back
  EXPECT_EQ(router.current(), Device::Cuda);
  auto [device, out] = router.run_chain(named_);  // run_chain does
  EXPECT_EQ(device, Device::Gpu);
  EXPECT_TRUE(rlx::testing::tensors_close(out[0], want_));
  auto [hinted, out2] = router.run(named_, Device::Cpu);
  EXPECT_EQ(hinted, Device::Cpu);
  EXPECT_TRUE(rlx::testing::tensors_close(out2[0], want_));
  EXPECT_TRUE(rlx::testing::tensors_close(router.run_on(Device::Gpu, named_)[0], want_));
  EXPECT_EQ(*gpu.runs, 2);
  EXPECT_EQ(router.rebenchmarks(), 0);
}

TEST_F(Router, RebenchmarksWhenTheSnapshotShowsThrottling) {
  twin(Device::Gpu, {.name = "twin-gpu", .delay = std::chrono::milliseconds(25)});
  twin(Device::Metal);
  calibrate(Device::Gpu, 1000, 100, 100);  // the cost model picks the slow one
  calibrate(Device::Metal, 1);
  DeviceRouter router(g_, DevicePolicy::only({Device::Gpu, Device::Metal}));
  router.set_param("w", w_);
  HwSnapshot cool{3000, 3000, "injected"}, hot{1500, 3000, "injected"};
  HwSnapshot now = cool;
  router.set_snapshot_source([&] { return now; });
  router.set_rebench_on_throttle(true, std::chrono::milliseconds(0));

  EXPECT_EQ(router.run(named_).first, Device::Gpu);
  EXPECT_EQ(router.rebenchmarks(), 0);
  now = hot;
  auto [device, out] = router.run(named_);
  EXPECT_EQ(router.rebenchmarks(), 1);
  EXPECT_EQ(device, Device::Metal);  // measured faster
  EXPECT_TRUE(rlx::testing::tensors_close(out[0], want_));
  EXPECT_NE(router.last_rebench_reason().find("throttled"), std::string::npos) << router.last_rebench_reason();
  EXPECT_NE(router.last_rebench_reason().find("picked metal"), std::string::npos) << router.last_rebench_reason();
  router.run(named_);
  EXPECT_EQ(router.rebenchmarks(), 1);  // still throttled: nothing new
  now = cool;
  router.run(named_);
  EXPECT_EQ(router.rebenchmarks(), 2);  // the throttling ended: conditions changed again
  router.set_rebench_on_throttle(false);
  now = hot;
  router.run(named_);
  EXPECT_EQ(router.rebenchmarks(), 2);
}

TEST_F(Router, FromEnvAndNothingToRoute) {
  env::ScopedOverride only_cpu("RLX_DEVICES", "cpu");
  auto router = DeviceRouter::from_env(g_);
  EXPECT_EQ(router.warmed(), std::vector<Device>{Device::Cpu});
  router.set_param("w", w_);
  EXPECT_EQ(router.run(named_).first, Device::Cpu);
  try {
    DeviceRouter none(g_, DevicePolicy::only({Device::Metal}));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no device compiled graph 'routed'"), std::string::npos) << e.what();
  }
}

TEST(HwSnapshot, ThrottledOnlyWhenTheMaximumIsKnown) {
  EXPECT_TRUE((HwSnapshot{1000, 3000, "t"}).is_throttled());
  EXPECT_FALSE((HwSnapshot{2900, 3000, "t"}).is_throttled());
  EXPECT_FALSE((HwSnapshot{1000, 0, "t"}).is_throttled());
  EXPECT_NE((HwSnapshot{1000, 3000, "t"}).describe().find("throttled"), std::string::npos);
  auto now = HwSnapshot::current();  // whatever this machine exposes; it must say where it looked
  EXPECT_FALSE(now.source.empty());
  EXPECT_FALSE(now.describe().empty());
}

}  // namespace
