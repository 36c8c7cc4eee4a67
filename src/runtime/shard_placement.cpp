#include "rlx/runtime/shard_placement.hpp"

#include <fmt/format.h>

#include <cmath>
#include <thread>

#include "rlx/error.hpp"

namespace rlx::runtime {

namespace shard = compile::shard;

shard::WorkerCost worker_cost(Device device, const Calibration& c) {
  const bool sane = std::isfinite(c.sgemm_gflops) && c.sgemm_gflops > 0 && std::isfinite(c.memory_bw_gbps) &&
                    c.memory_bw_gbps > 0 && std::isfinite(c.roundtrip_overhead_ns) && c.roundtrip_overhead_ns > 0;
  return {.name = std::string(device_label(device)),
          .flops_per_s = c.sgemm_gflops * 1e9,
          .rankable = sane,
          .local = device == Device::Cpu};
}

std::optional<ShardPlan> shard_placement(const ir::Graph& graph, ir::NodeId node, std::span<const Device> devices,
                                         const ShardPlacementOptions& options, shard::ChoiceReport* report) {
  if (devices.empty()) throw Error("shard_placement: no device to place pieces on");
  std::vector<shard::WorkerCost> workers;
  double local_rate = 0;
  for (Device d : devices) {
    const auto it = options.calibrations.find(d);
    const Calibration c = it != options.calibrations.end() ? it->second : calibration_for(d);
    workers.push_back(worker_cost(d, c));
    if (d == Device::Cpu || local_rate == 0) local_rate = workers.back().flops_per_s;
  }
  if (!(local_rate > 0)) throw Error("shard_placement: the local device's calibration has no GEMM rate");
  const int n = options.pieces > 0 ? options.pieces : int(devices.size());
  const auto opts = shard::shardings(graph, node, n);
  auto choice = shard::choose(opts, workers, options.link, options.residency, local_rate, report);
  if (!choice && options.force_split && !opts.empty()) {
    // The best split anyway: priced as if running whole were never faster.
    choice = shard::choose(opts, workers, options.link, options.residency, 1e-300, nullptr);
  }
  if (!choice) return std::nullopt;
  ShardPlan plan{*choice, {}};
  for (const auto& r : plan.choice.runs) plan.devices.push_back(devices[r.worker]);
  return plan;
}

ShardedNode::ShardedNode(ShardPlan plan, std::size_t operands, std::vector<CompiledGraph> graphs)
    : plan_(std::move(plan)), operands_(operands), split_(std::move(graphs[0])), combine_(std::move(graphs[1])) {
  for (std::size_t i = 2; i < graphs.size(); ++i) pieces_.push_back(std::move(graphs[i]));
}

namespace {

std::vector<CompiledGraph> emit(const ir::Graph& graph, ir::NodeId node, const ShardPlan& plan) {
  if (node >= graph.size()) throw Error(fmt::format("ShardedNode: node {} is out of range", node));
  const ir::Node& n = graph.node(node);
  const shard::ShardOption& o = plan.choice.option;
  if (o.node != node || o.operands.size() != n.inputs.size() || plan.devices.size() != o.pieces())
    throw Error(fmt::format("ShardedNode: the plan is for another node or does not match {}", ir::op_name(n.op)));
  auto operand_shape = [&](std::size_t i, std::optional<std::size_t> piece) {
    auto e = graph.node(n.inputs[i]).shape.extents();
    const auto& cut = o.operands[i];
    if (piece && !cut.shared()) e[std::size_t(*cut.axis)] = cut.ranges[*piece].length;
    return e;
  };
  std::vector<CompiledGraph> out;
  // The narrows: each sliced operand's slice for each piece.
  ir::Graph split("shard_split");
  std::vector<ir::NodeId> in;
  for (std::size_t i = 0; i < n.inputs.size(); ++i)
    in.push_back(
        split.input(fmt::format("in{}", i), ir::Shape(operand_shape(i, std::nullopt)), graph.node(n.inputs[i]).dtype));
  for (std::size_t p = 0; p < o.pieces(); ++p)
    for (std::size_t i = 0; i < n.inputs.size(); ++i)
      if (const auto& cut = o.operands[i]; !cut.shared())
        split.add_output(split.narrow(in[i], *cut.axis, cut.ranges[p].start, cut.ranges[p].length),
                         fmt::format("p{}_in{}", p, i));
  out.push_back(Session(Device::Cpu).compile(split));
  // The recombination: the pieces' results concatenated, or summed (a cut along K).
  ir::Graph combine("shard_combine");
  std::vector<ir::NodeId> parts;
  for (std::size_t p = 0; p < o.pieces(); ++p) {
    auto e = n.shape.extents();
    if (o.recombine == shard::Recombine::Concat) e[std::size_t(o.output_axis)] = o.ranges[p].length;
    parts.push_back(combine.input(fmt::format("p{}", p), ir::Shape(e), n.dtype));
  }
  ir::NodeId y = parts[0];
  if (o.recombine == shard::Recombine::Concat)
    y = parts.size() > 1 ? combine.concat(parts, o.output_axis) : parts[0];
  else
    for (std::size_t p = 1; p < parts.size(); ++p) y = combine.add(y, parts[p]);
  combine.add_output(y, "y");
  out.push_back(Session(Device::Cpu).compile(combine));
  // Each piece: the op on its operands' slices, on its device.
  for (std::size_t p = 0; p < o.pieces(); ++p) {
    ir::Graph piece(fmt::format("shard_piece{}", p));
    std::vector<ir::NodeId> args;
    for (std::size_t i = 0; i < n.inputs.size(); ++i)
      args.push_back(
          piece.input(fmt::format("in{}", i), ir::Shape(operand_shape(i, p)), graph.node(n.inputs[i]).dtype));
    piece.add_output(piece.add(n.op, args, n.attrs), "y");
    out.push_back(Session(plan.devices[p]).compile(piece));
  }
  return out;
}

}  // namespace

ShardedNode::ShardedNode(const ir::Graph& graph, ir::NodeId node, const ShardPlan& plan)
    : ShardedNode(plan, graph.node(node < graph.size() ? node : 0).inputs.size(), emit(graph, node, plan)) {}

ir::Tensor ShardedNode::run(std::span<const ir::Tensor> operands) {
  if (operands.size() != operands_)
    throw Error(fmt::format("ShardedNode::run: {} operands, the node takes {}", operands.size(), operands_));
  const auto& o = plan_.choice.option;
  std::map<std::string, ir::Tensor, std::less<>> in;
  for (std::size_t i = 0; i < operands.size(); ++i) in[fmt::format("in{}", i)] = operands[i];
  const auto slices = split_.run(in);
  std::vector<std::map<std::string, ir::Tensor, std::less<>>> piece_in(o.pieces());
  std::size_t k = 0;  // the split graph's outputs, in the order emit added them
  for (std::size_t p = 0; p < o.pieces(); ++p)
    for (std::size_t i = 0; i < operands.size(); ++i)
      piece_in[p][fmt::format("in{}", i)] = o.operands[i].shared() ? operands[i] : slices.at(k++);
  std::vector<ir::Tensor> results(o.pieces());
  std::vector<std::string> errors(o.pieces());
  {
    std::vector<std::jthread> threads;
    for (std::size_t p = 0; p < o.pieces(); ++p)
      threads.emplace_back([&, p] {
        try {
          results[p] = pieces_[p].run(piece_in[p]).at(0);
        } catch (const std::exception& e) {
          errors[p] = e.what();
        }
      });
  }
  for (std::size_t p = 0; p < o.pieces(); ++p)
    if (!errors[p].empty())
      throw Error(fmt::format("ShardedNode: piece {} on {}: {}", p, device_label(plan_.devices[p]), errors[p]));
  std::map<std::string, ir::Tensor, std::less<>> parts;
  for (std::size_t p = 0; p < o.pieces(); ++p) parts[fmt::format("p{}", p)] = std::move(results[p]);
  return combine_.run(parts).at(0);
}

}  // namespace rlx::runtime
