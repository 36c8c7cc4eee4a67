// runtime::shard_placement: pricing a node's shardings from the devices' calibrations, and ShardedNode, which
// runs the emitted graphs (narrows on the CPU, a piece per device, the concat or sum on the CPU).
#include <gtest/gtest.h>

#include <random>

#include "rlx/error.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/shard_placement.hpp"
#include "support/testing.hpp"

namespace rlx::runtime {
namespace {

namespace shard = compile::shard;

Calibration calib(double gflops) {
  Calibration c;
  c.sgemm_gflops = gflops;
  c.memory_bw_gbps = 10;
  c.roundtrip_overhead_ns = 1000;
  return c;
}

ir::Graph matmul_graph(std::int64_t m, std::int64_t k, std::int64_t n) {
  ir::Graph g("mm");
  g.add_output(g.matmul(g.input("a", {m, k}), g.input("b", {k, n})), "y");
  return g;
}

std::vector<Device> devices_here() {
  std::vector<Device> d{Device::Cpu};
  d.push_back(is_available(Device::Vulkan) ? Device::Vulkan : Device::Cpu);
  return d;
}

TEST(ShardPlacement, WorkerCostsComeFromCalibrations) {
  const auto cpu = worker_cost(Device::Cpu, calib(100));
  EXPECT_TRUE(cpu.rankable && cpu.local);
  EXPECT_DOUBLE_EQ(cpu.flops_per_s, 100e9);
  const auto broken = worker_cost(Device::Vulkan, calib(0));
  EXPECT_FALSE(broken.rankable);
  EXPECT_FALSE(broken.local);
  EXPECT_EQ(broken.name, "vulkan");
}

TEST(ShardPlacement, AFastPairSplitsAndASlowLinkRunsWhole) {
  const ir::Graph g = matmul_graph(1024, 1024, 1024);
  const ir::NodeId mm = g.output_ids()[0];
  const std::vector<Device> devices{Device::Cpu, Device::Vulkan};
  ShardPlacementOptions o;
  o.calibrations = {{Device::Cpu, calib(100)}, {Device::Vulkan, calib(100)}};
  auto plan = shard_placement(g, mm, devices, o);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->choice.option.pieces(), 2u);
  EXPECT_EQ(plan->devices.size(), 2u);
  o.link = {1e-3, 1e6};  // 1 MB/s: moving the operands costs far more than the GEMM
  shard::ChoiceReport report;
  EXPECT_FALSE(shard_placement(g, mm, devices, o, &report));
  EXPECT_NE(report.why.find("run whole"), std::string::npos) << report.why;
  o.calibrations[Device::Vulkan] = calib(0);  // not rankable: excluded, and said
  o.link = {10e-6, 10e9};
  shard_placement(g, mm, devices, o, &report);
  ASSERT_FALSE(report.excluded.empty());
  EXPECT_EQ(report.excluded[0].worker, "vulkan");
  EXPECT_THROW(shard_placement(g, mm, std::vector<Device>{}, o), Error);
}

// Every cut of a matmul (rows, columns, K), run as emitted on this machine's devices, against the reference.
TEST(ShardPlacement, EveryMatmulCutRunsAcrossDevicesAndMatchesTheReference) {
  const ir::Graph g = matmul_graph(48, 40, 36);
  const ir::NodeId mm = g.output_ids()[0];
  std::mt19937_64 rng(testing::test_seed());
  const ir::Tensor a = testing::random_tensor(ir::DType::F32, {48, 40}, rng),
                   b = testing::random_tensor(ir::DType::F32, {40, 36}, rng);
  const auto want = reference::run(g, {{"a", a}, {"b", b}}).at(0);
  const auto devices = devices_here();
  const auto options = shard::shardings(g, mm, 2);
  ASSERT_EQ(options.size(), 3u);
  for (const auto& option : options) {
    SCOPED_TRACE(option.describe());
    ShardPlan plan{shard::Choice{.option = option}, devices};
    ShardedNode sharded(g, mm, plan);
    const std::vector<ir::Tensor> operands{a, b};
    EXPECT_TRUE(testing::tensors_close(sharded.run(operands), want));
    // The emitted graphs: narrows of the sliced operands, and the concat or the sum.
    std::size_t narrows = 0;
    for (const auto& n : sharded.split_graph().nodes()) narrows += n.op == ir::OpKind::Slice;
    EXPECT_GT(narrows, 0u);
    const bool sum = option.recombine == shard::Recombine::Sum;
    bool has_concat = false;
    for (const auto& n : sharded.combine_graph().nodes()) has_concat |= n.op == ir::OpKind::Concat;
    EXPECT_EQ(has_concat, !sum);
  }
  EXPECT_THROW(
      ShardedNode(g, mm, ShardPlan{shard::Choice{.option = options[0]}, devices}).run(std::vector<ir::Tensor>{a}),
      Error);
}

// The placement's own choice, forced to split, end to end.
TEST(ShardPlacement, ThePlacedSplitRuns) {
  const ir::Graph g = matmul_graph(64, 32, 16);
  const ir::NodeId mm = g.output_ids()[0];
  ShardPlacementOptions o;
  o.calibrations = {{Device::Cpu, calib(100)}, {Device::Vulkan, calib(100)}};
  o.force_split = true;
  const auto devices = devices_here();
  auto plan = shard_placement(g, mm, devices, o);
  ASSERT_TRUE(plan);
  std::mt19937_64 rng(testing::test_seed() + 1);
  const std::vector<ir::Tensor> operands{testing::random_tensor(ir::DType::F32, {64, 32}, rng),
                                         testing::random_tensor(ir::DType::F32, {32, 16}, rng)};
  ShardedNode sharded(g, mm, *plan);
  EXPECT_TRUE(
      testing::tensors_close(sharded.run(operands), reference::run(g, {{"a", operands[0]}, {"b", operands[1]}}).at(0)));
}

}  // namespace
}  // namespace rlx::runtime
