// Activity analysis, the reverse and forward sweeps, and the decomposition
// route that composites without a dedicated rule take.
#include "autodiff/engine.hpp"

#include <algorithm>

#include "rlx/compile/pipeline.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/op_def.hpp"

namespace rlx::autodiff::detail {

using ir::DType;
using ir::Graph;
using ir::Node;
using ir::OpKind;

namespace {

// Piecewise constant: derivative zero almost everywhere, as PyTorch and JAX
// define it, so their results are constants rather than errors.
bool zero_derivative(const Node& n) {
  switch (n.op) {
    case OpKind::Floor:
    case OpKind::Ceil:
    case OpKind::Round:
    case OpKind::Sign: return ir::is_float(n.dtype);
    default: return false;
  }
}

std::string type_str(const Node& n) { return std::string(ir::dtype_name(n.dtype)) + n.shape.str(); }

// Rules must hand back values of exactly the operand's (or result's) type;
// anything else is a bug in the rule, reported before it turns into a
// confusing shape error further down.
void check_rule(const Graph& g, NodeId v, const Graph& src, const Node& n, const Node& want, const char* what) {
  const Node& got = g.node(v);
  if (got.dtype != want.dtype || got.shape != want.shape)
    throw Error("autodiff internal error: the " + std::string(what) + " rule of " + ir::describe_node(src, n) +
                " gave " + type_str(got) + " for " + ir::describe_node(src, want) + " of type " + type_str(want));
}

// Operands that choose elements rather than compute with them (the op table's selector_operands, when not of
// a float dtype): no derivative flows into them, whatever they depend on.
bool is_selector(const Graph& g, const Node& n, std::size_t input) {
  if (ir::is_float(g.node(n.inputs[input]).dtype)) return false;
  const auto& sel = ir::op_def(n.op).selector_operands;
  return std::ranges::find(sel, input) != sel.end() || std::ranges::find(sel, ir::kAnyOperand) != sel.end();
}

[[noreturn]] void not_differentiable(const Graph& g, const Analysis& a, const Node& at) {
  const Node& o = g.node(a.origin[at.id]);
  throw Error(ir::describe_node(g, o) + ": not differentiable (its result is " + type_str(o) +
              "), yet a differentiated input reaches the value of " + ir::describe_node(g, at) +
              " through it. Put node %" + std::to_string(o.id) +
              " in Options::stop_gradient if its zero derivative is what is meant");
}

}  // namespace

Analysis analyze(const Graph& g, std::vector<Flow> flow, const std::set<NodeId>& stop) {
  Analysis a{std::move(flow), std::vector<NodeId>(g.size(), 0)};
  for (const Node& n : g.nodes()) {
    auto& f = a.flow[n.id];
    if (stop.contains(n.id) || (!n.inputs.empty() && zero_derivative(n))) {
      f = Flow::Inactive;
      continue;
    }
    if (n.inputs.empty()) continue;
    bool active = false;
    Maybe poison;
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      if (is_selector(g, n, i)) continue;
      NodeId in = n.inputs[i];
      active = active || a.flow[in] == Flow::Active;
      if (a.flow[in] == Flow::Poisoned && !poison) poison = a.origin[in];
    }
    if (!active && !poison) {
      f = Flow::Inactive;
    } else if (!ir::is_float(n.dtype)) {
      // Float dependence turns into an integer or bool here: this node is
      // where the derivative is lost.
      f = Flow::Poisoned;
      a.origin[n.id] = active ? n.id : *poison;
    } else if (active) {
      f = Flow::Active;
    } else {
      f = Flow::Poisoned;
      a.origin[n.id] = *poison;
    }
  }
  return a;
}

std::vector<bool> needed_for(const Graph& g, std::span<const NodeId> roots) {
  std::vector<bool> need(g.size(), false);
  for (auto r : roots) need[r] = true;
  for (std::size_t i = g.size(); i-- > 0;) {
    if (!need[i]) continue;
    const Node& n = g.nodes()[i];
    for (std::size_t k = 0; k < n.inputs.size(); ++k)
      if (!is_selector(g, n, k)) need[n.inputs[k]] = true;
  }
  return need;
}

void reverse(Graph& g, const Graph& src, std::span<const NodeId> map, const Analysis& a, std::vector<Maybe>& ct,
             std::size_t begin, std::size_t end) {
  for (std::size_t i = std::min(end, src.size()); i-- > begin;) {
    const Node& n = src.nodes()[i];
    if (!ct[i] || n.inputs.empty() || a.flow[i] == Flow::Inactive) continue;
    if (a.flow[i] == Flow::Poisoned) not_differentiable(src, a, n);
    std::vector<bool> want(n.inputs.size());
    std::vector<NodeId> x;
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      want[k] = !is_selector(src, n, k) && a.flow[n.inputs[k]] != Flow::Inactive;
      x.push_back(map[n.inputs[k]]);
    }
    Site s{g, src, n, std::move(x), map[i]};
    auto d = vjp_rule(s, *ct[i], want);
    ct[i].reset();
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      if (!want[k] || !d[k]) continue;
      NodeId in = n.inputs[k];
      check_rule(g, *d[k], src, n, src.node(in), "VJP");
      ct[in] = ct[in] ? g.add(*ct[in], *d[k]) : *d[k];  // several uses: cotangents add up
    }
  }
}

void forward(Graph& g, const Graph& src, std::span<const NodeId> map, const Analysis& a,
             const std::vector<bool>& needed, std::vector<Maybe>& t) {
  for (const Node& n : src.nodes()) {
    if (n.inputs.empty() || !needed[n.id] || a.flow[n.id] == Flow::Inactive) continue;
    if (a.flow[n.id] == Flow::Poisoned) {
      if (ir::is_float(n.dtype)) not_differentiable(src, a, n);
      continue;  // integer and bool values have no tangent
    }
    std::vector<Maybe> ts(n.inputs.size());
    std::vector<NodeId> x;
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      if (!is_selector(src, n, k) && a.flow[n.inputs[k]] == Flow::Active) ts[k] = t[n.inputs[k]];
      x.push_back(map[n.inputs[k]]);
    }
    Site s{g, src, n, std::move(x), map[n.id]};
    t[n.id] = jvp_rule(s, ts);
    if (t[n.id]) check_rule(g, *t[n.id], src, n, n, "JVP");
  }
}

namespace {

// The node alone in a graph of its own, decomposed, and that decomposition
// replayed into s.g on top of the node's operands.
struct Inlined {
  Graph sub;
  std::vector<NodeId> map;     // sub node -> s.g node
  std::vector<NodeId> inputs;  // sub ids of the operands, in order
  NodeId result;
};

Inlined inline_decomposition(const Site& s) {
  Graph one(std::string(ir::op_name(s.n.op)));
  std::vector<NodeId> ins;
  for (std::size_t k = 0; k < s.n.inputs.size(); ++k)
    ins.push_back(one.input("operand" + std::to_string(k), s.in(k).shape, s.in(k).dtype));
  one.add_output(one.add_declared(s.n.op, ins, s.n.attrs, s.n.dtype, s.n.shape));
  Inlined r;
  try {
    // A custom op becomes its lowering first; composites in it then decompose.
    r.sub = compile::passes::decompose(s.n.op == OpKind::Custom ? compile::passes::inline_custom(one, {}) : one, {});
  } catch (const Error& e) {
    s.fail(std::string("cannot differentiate it through its decomposition: ") + e.what());
  }
  r.map.resize(r.sub.size());
  r.inputs = r.sub.input_ids();  // decompose keeps leaves in order
  for (const Node& m : r.sub.nodes()) {
    if (m.op == OpKind::Input) {
      std::size_t k = std::size_t(std::find(r.inputs.begin(), r.inputs.end(), m.id) - r.inputs.begin());
      r.map[m.id] = s.x[k];
      continue;
    }
    Node c = m;
    for (auto& in : c.inputs) in = r.map[in];
    r.map[m.id] = s.g.add_raw(std::move(c));
  }
  r.result = r.sub.outputs()[0].node;
  return r;
}

}  // namespace

std::vector<Maybe> vjp_decomposed(const Site& s, NodeId ct, const std::vector<bool>& want) {
  Inlined d = inline_decomposition(s);
  std::vector<Flow> seeds(d.sub.size(), Flow::Inactive);
  for (std::size_t k = 0; k < want.size(); ++k)
    if (want[k]) seeds[d.inputs[k]] = Flow::Active;
  Analysis a = analyze(d.sub, std::move(seeds), {});
  std::vector<Maybe> cts(d.sub.size());
  cts[d.result] = ct;
  reverse(s.g, d.sub, d.map, a, cts);
  std::vector<Maybe> out;
  for (std::size_t k = 0; k < want.size(); ++k) out.push_back(want[k] ? cts[d.inputs[k]] : std::nullopt);
  return out;
}

Maybe jvp_decomposed(const Site& s, std::span<const Maybe> t) {
  Inlined d = inline_decomposition(s);
  std::vector<Flow> seeds(d.sub.size(), Flow::Inactive);
  std::vector<Maybe> ts(d.sub.size());
  for (std::size_t k = 0; k < t.size(); ++k)
    if (t[k]) {
      seeds[d.inputs[k]] = Flow::Active;
      ts[d.inputs[k]] = t[k];
    }
  Analysis a = analyze(d.sub, std::move(seeds), {});
  NodeId roots[] = {d.result};
  forward(s.g, d.sub, d.map, a, needed_for(d.sub, roots), ts);
  return ts[d.result];
}

}  // namespace rlx::autodiff::detail
