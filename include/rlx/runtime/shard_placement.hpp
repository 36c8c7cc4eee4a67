#pragma once
// runtime::shard_placement (docs/compile.md, "Sharding"): the adapter between compile::shard and the
// backends. It prices one node's shardings on the devices at hand from their calibrations (the cost model's
// figures), and, when a split beats running the node whole, emits the graphs that run it: a split graph of
// narrows on the CPU, one graph per piece on its device, and a combine graph (the concat or the sum) on the
// CPU. ShardedNode runs them, the pieces concurrently, one thread per piece.
//
//   auto plan = runtime::shard_placement(graph, node, {Device::Cpu, Device::Vulkan});
//   if (plan) { runtime::ShardedNode sharded(graph, node, *plan); auto y = sharded.run(operands); }
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "rlx/compile/shard.hpp"
#include "rlx/runtime/calibration.hpp"
#include "rlx/runtime/session.hpp"

namespace rlx::runtime {

// A device as compile::shard::choose sees it: its GEMM rate from its calibration, rankable when every
// figure of the calibration is a positive finite number (otherwise it is excluded, with the reason). The CPU
// is local (it shares the caller's memory).
compile::shard::WorkerCost worker_cost(Device device, const Calibration& calibration);

struct ShardPlacementOptions {
  int pieces = 0;  // how many pieces to cut; 0: one per device
  // The link to a device that is not local (host memory to a GPU): 10 us latency, 10 GB/s by default.
  compile::shard::LinkCost link{10e-6, 10e9};
  compile::shard::Residency residency{};
  // Each device's figures; a device missing here is calibrated (runtime::calibration_for).
  std::map<Device, Calibration> calibrations;
  bool force_split = false;  // take the best split even when running whole is predicted faster (tests)
};

struct ShardPlan {
  compile::shard::Choice choice;
  std::vector<Device> devices;  // the worker of each piece, in piece order
};

// The best way to run node `node` of `graph` on `devices`, or nullopt when running it whole is predicted
// faster (or nothing can be split); *report says what was priced. rlx::Error when `devices` is empty or a
// device is unavailable.
std::optional<ShardPlan> shard_placement(const ir::Graph& graph, ir::NodeId node, std::span<const Device> devices,
                                         const ShardPlacementOptions& options = {},
                                         compile::shard::ChoiceReport* report = nullptr);

// A node run as the plan says. Its operands are given by the node's operand order.
class ShardedNode {
 public:
  ShardedNode(const ir::Graph& graph, ir::NodeId node, const ShardPlan& plan);
  // Each operand in the node's input order; the node's value.
  ir::Tensor run(std::span<const ir::Tensor> operands);
  const ShardPlan& plan() const { return plan_; }
  // The emitted graphs: the narrows (on the CPU), each piece (on its device), the concat or the sum (CPU).
  const ir::Graph& split_graph() const { return split_.compile_result().hir; }
  const ir::Graph& piece_graph(std::size_t p) const { return pieces_.at(p).compile_result().hir; }
  const ir::Graph& combine_graph() const { return combine_.compile_result().hir; }

 private:
  ShardedNode(ShardPlan plan, std::size_t operands, std::vector<CompiledGraph> graphs);
  ShardPlan plan_;
  std::size_t operands_ = 0;
  CompiledGraph split_, combine_;
  std::vector<CompiledGraph> pieces_;
};

}  // namespace rlx::runtime
