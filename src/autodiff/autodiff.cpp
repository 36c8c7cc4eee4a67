// The public transforms: resolve names, seed the sweeps, and lay out the
// result. The derivative nodes are appended to a copy of the source graph, so
// node ids, inputs and params stay as they were; nodes the outputs no longer
// need are left to the pipeline's dce.
#include "rlx/autodiff/autodiff.hpp"

#include <algorithm>
#include <numeric>

#include "autodiff/engine.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/error.hpp"

namespace rlx::autodiff {

using detail::Flow;
using detail::Maybe;
using ir::Graph;
using ir::Node;
using ir::NodeId;

namespace {

std::vector<NodeId> resolve(const Graph& g, std::span<const std::string> wrt, const Options& options) {
  for (auto id : options.stop_gradient) g.node(id);  // throws on an id the graph lacks
  std::vector<NodeId> ids;
  for (const auto& name : wrt) {
    auto it = std::find_if(g.nodes().begin(), g.nodes().end(), [&](const Node& n) {
      return (n.op == ir::OpKind::Input || n.op == ir::OpKind::Param) && n.attrs.get_str("name") == name;
    });
    if (it == g.nodes().end()) {
      std::string known;
      for (const Node& n : g.nodes())
        if (n.op == ir::OpKind::Input || n.op == ir::OpKind::Param)
          known += (known.empty() ? "" : ", ") + n.attrs.get_str("name");
      throw Error("autodiff: '" + name + "' is not an input or param of graph '" + g.name() + "' (it has " +
                  (known.empty() ? std::string("none") : known) + ")");
    }
    if (!ir::is_float(it->dtype))
      throw Error("autodiff: cannot differentiate with respect to " + ir::describe_node(g, *it) + ": it is " +
                  std::string(ir::dtype_name(it->dtype)) + ", and only float values have derivatives");
    ids.push_back(it->id);
  }
  return ids;
}

std::vector<Flow> seeds(const Graph& g, const std::vector<NodeId>& ids) {
  std::vector<Flow> flow(g.size(), Flow::Inactive);
  for (auto id : ids) flow[id] = Flow::Active;
  return flow;
}

std::vector<NodeId> identity(std::size_t n) {
  std::vector<NodeId> map(n);
  std::iota(map.begin(), map.end(), NodeId{0});
  return map;
}

Graph reverse_mode(const Graph& g, std::span<const std::string> wrt, const Options& options, bool with_value) {
  if (g.outputs().empty())
    throw Error("autodiff: graph '" + g.name() + "' has no outputs; its first output must be the scalar loss");
  const ir::GraphOutput loss = g.outputs()[0];
  const Node& ln = g.node(loss.node);
  if (ln.shape.rank() != 0 || !ir::is_float(ln.dtype))
    throw Error("autodiff: the first output of graph '" + g.name() + "' must be a float scalar (rank 0) loss, but " +
                ir::describe_node(g, ln) + " gives " + std::string(ir::dtype_name(ln.dtype)) + ln.shape.str());
  std::vector<NodeId> ids = resolve(g, wrt, options);
  detail::Analysis a = detail::analyze(g, seeds(g, ids), options.stop_gradient);

  Graph out = g;
  out.set_name(g.name() + (with_value ? "_value_and_grad" : "_grad"));
  out.clear_outputs();
  std::vector<Maybe> ct(g.size());
  if (a.flow[loss.node] != Flow::Inactive) ct[loss.node] = out.scalar(1.0, ln.dtype);
  if (options.checkpoint.enabled())
    detail::checkpointed_reverse(out, g, a, ct, options.checkpoint, loss.node);
  else
    detail::reverse(out, g, identity(g.size()), a, ct);
  if (with_value) out.add_output(loss.node, loss.name);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const Node& w = g.node(ids[i]);
    out.add_output(ct[w.id] ? *ct[w.id] : detail::zeros(out, w.dtype, w.shape), "grad_" + wrt[i]);
  }
  return out;
}

}  // namespace

Graph vjp(const Graph& g, std::span<const std::string> wrt, const Options& options) {
  return reverse_mode(g, wrt, options, false);
}

Graph grad(const Graph& g, std::span<const std::string> wrt, const Options& options) {
  return reverse_mode(g, wrt, options, false);
}

Graph value_and_grad(const Graph& g, std::span<const std::string> wrt, const Options& options) {
  return reverse_mode(g, wrt, options, true);
}

Graph jvp(const Graph& g, std::span<const std::string> wrt, const Options& options) {
  std::vector<NodeId> ids = resolve(g, wrt, options);
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (std::find(ids.begin(), ids.begin() + std::ptrdiff_t(i), ids[i]) != ids.begin() + std::ptrdiff_t(i))
      throw Error("autodiff: jvp lists '" + wrt[i] + "' twice; it takes one tangent per input");
  detail::Analysis a = detail::analyze(g, seeds(g, ids), options.stop_gradient);

  Graph out = g;
  out.set_name(g.name() + "_jvp");
  out.clear_outputs();
  std::vector<Maybe> t(g.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const Node& w = g.node(ids[i]);
    NodeId tangent = out.input("tangent_" + wrt[i], w.shape, w.dtype);
    if (a.flow[w.id] == Flow::Active) t[w.id] = tangent;
  }
  std::vector<NodeId> roots = g.output_ids();
  detail::forward(out, g, identity(g.size()), a, detail::needed_for(g, roots), t);
  for (const auto& o : g.outputs()) out.add_output(o.node, o.name);
  for (std::size_t i = 0; i < g.outputs().size(); ++i) {
    const auto& o = g.outputs()[i];
    const Node& on = g.node(o.node);
    NodeId tangent = t[o.node] && a.flow[o.node] == Flow::Active ? *t[o.node] : detail::zeros(out, on.dtype, on.shape);
    out.add_output(tangent, "tangent_" + (o.name.empty() ? std::to_string(i) : o.name));
  }
  return out;
}

const std::set<ir::OpKind>& backward_ops() {
  static const std::set<ir::OpKind> ops{ir::OpKind::SoftmaxBackward, ir::OpKind::LogSoftmaxBackward,
                                        ir::OpKind::LayerNormBackward, ir::OpKind::RmsNormBackward};
  return ops;
}

Graph decompose_backward_ops_except(const Graph& g, const std::set<ir::OpKind>& supported) {
  std::set<ir::OpKind> keep;
  for (ir::OpKind op : ir::kAllOps)
    if (!backward_ops().contains(op) || supported.contains(op)) keep.insert(op);
  return compile::passes::decompose(g, keep);
}

}  // namespace rlx::autodiff
