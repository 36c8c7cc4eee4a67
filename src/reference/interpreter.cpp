#include "rlx/reference/interpreter.hpp"

#include <algorithm>

#include "reference/value.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/ir/dim_expr.hpp"
#include "rlx/ir/op_def.hpp"

namespace rlx::reference {
namespace detail {

void Ctx::fail(const std::string& msg) const { throw Error(ir::describe_node(g, n) + ": " + msg); }

namespace {

Value from_tensor(const ir::Tensor& t) {
  Value r(t.dtype(), t.shape());
  r.v = t.to_f64();
  return r;
}

}  // namespace

Value evaluate(const Ctx& c) {
  if (c.in.size() != c.n.inputs.size())
    c.fail("got " + std::to_string(c.in.size()) + " input values for " + std::to_string(c.n.inputs.size()) + " inputs");
  Value r;
  const ir::OpDef& def = ir::op_def(c.n.op);
  if (def.reference) {
    try {
      r = def.reference(c);
    } catch (const Error& e) {
      c.fail(e.what());  // a rule's errors are about this node
    }
    if (r.v.size() != std::size_t(numel(r.ext))) c.fail("the op table's reference returned a wrong element count");
  } else if (def.formula) {
    r = eval_formula(c);
  } else if (c.n.op == ir::OpKind::Custom) {
    r = eval_custom(c);
  } else if (ir::is_control_flow(c.n.op)) {
    r = eval_control_flow(c);
  } else if (c.n.op == ir::OpKind::Input || c.n.op == ir::OpKind::Param) {
    c.fail("inputs and params have no value outside run()");
  } else {
    c.fail("has no reference rule in the op table");
  }
  // A mismatch here means shape inference and the op's semantics disagree:
  // the oracle refuses rather than hiding it.
  if (c.n.shape.is_static() && c.n.shape.extents() != r.ext)
    c.fail("reference computed shape " + extents_str(r.ext) + " but the node declares " + c.n.shape.str());
  r.dtype = c.n.dtype;
  for (auto& x : r.v) x = ir::round_to_dtype(x, r.dtype);
  return r;
}

}  // namespace detail

using detail::Ctx;
using detail::Value;

namespace {

// Checks a provided tensor against the Input/Param node that names it,
// binding the node's symbolic dims to the tensor's extents.
void check_feed(const ir::Graph& g, const ir::Node& n, const ir::Tensor& t,
                std::vector<std::pair<std::string, std::int64_t>>& binds) {
  const std::string& name = n.attrs.get_str("name");
  std::string what = std::string(ir::op_name(n.op)) + " '" + name + "'";
  if (t.dtype() != n.dtype)
    throw Error(ir::describe_node(g, n) + ": " + what + " expects " + std::string(ir::dtype_name(n.dtype)) + ", got " +
                std::string(ir::dtype_name(t.dtype())));
  bool ok = t.shape().size() == n.shape.rank();
  for (std::size_t i = 0; ok && i < t.shape().size(); ++i) {
    const ir::Dim& d = n.shape[i];
    if (d.is_static()) {
      ok = d.size == t.shape()[i];
      continue;
    }
    // A plain symbol is bound by the feed; an expression (B*S) is checked once the graph is bound (run()).
    if (!ir::DimExpr::of(d).is_symbol()) continue;
    auto it = std::find_if(binds.begin(), binds.end(), [&](auto& b) { return b.first == d.sym; });
    if (it == binds.end())
      binds.emplace_back(d.sym, t.shape()[i]);
    else
      ok = it->second == t.shape()[i];
  }
  if (!ok)
    throw Error(ir::describe_node(g, n) + ": " + what + " expects shape " + n.shape.str() + ", got " +
                ir::extents_str(t.shape()));
}

// Only nodes that reach an output are fed and evaluated; each value is freed
// after its last use (outputs are used at g.size()).
struct Liveness {
  std::vector<bool> needed;
  std::vector<std::size_t> last_use;
};
Liveness liveness(const ir::Graph& g) {
  std::size_t n = g.size();
  Liveness l{std::vector<bool>(n, false), std::vector<std::size_t>(n, 0)};
  for (auto id : g.output_ids()) {
    l.needed[id] = true;
    l.last_use[id] = n;
  }
  for (std::size_t i = n; i-- > 0;) {
    if (!l.needed[i]) continue;
    for (auto in : g.nodes()[i].inputs) {
      l.needed[in] = true;
      l.last_use[in] = std::max(l.last_use[in], i);
    }
  }
  return l;
}

std::vector<ir::Tensor> run_bound(const ir::Graph& g, const Liveness& live,
                                  const std::vector<const ir::Tensor*>& feeds) {
  const auto& [needed, last_use] = live;
  std::size_t n = g.size();
  std::vector<Value> vals(n);
  std::vector<const Value*> args;
  for (std::size_t i = 0; i < n; ++i) {
    if (!needed[i]) continue;
    const ir::Node& node = g.nodes()[i];
    if (feeds[i]) {
      vals[i] = detail::from_tensor(*feeds[i]);
      continue;
    }
    args.clear();
    for (auto in : node.inputs) args.push_back(&vals[in]);
    vals[i] = detail::evaluate(Ctx{g, node, args});
    for (auto in : node.inputs)
      if (last_use[in] == i) vals[in] = Value{};
  }
  std::vector<ir::Tensor> out;
  for (auto id : g.output_ids()) out.push_back(ir::Tensor::from_f64(g.nodes()[id].dtype, vals[id].ext, vals[id].v));
  return out;
}

}  // namespace

std::vector<ir::Tensor> run(const ir::Graph& g, const TensorMap& inputs, const TensorMap& params) {
  Liveness live = liveness(g);
  std::vector<const ir::Tensor*> feeds(g.size(), nullptr);
  std::vector<std::pair<std::string, std::int64_t>> binds;
  bool symbolic = false;
  for (const ir::Node& n : g.nodes()) {
    symbolic = symbolic || !n.shape.is_static();
    if ((n.op != ir::OpKind::Input && n.op != ir::OpKind::Param) || !live.needed[n.id]) continue;
    const TensorMap& map = n.op == ir::OpKind::Input ? inputs : params;
    const std::string& name = n.attrs.get_str("name");
    auto it = map.find(name);
    if (it == map.end())
      throw Error(ir::describe_node(g, n) + ": no value given for " + std::string(ir::op_name(n.op)) + " '" + name +
                  "'");
    check_feed(g, n, it->second, binds);
    feeds[n.id] = &it->second;
  }
  if (!symbolic) return run_bound(g, live, feeds);
  const ir::Graph bound = ir::bind_symbols(g, binds);
  for (const ir::Node& n : bound.nodes())
    if (feeds[n.id] && (!n.shape.is_static() || n.shape.extents() != feeds[n.id]->shape()))
      throw Error(ir::describe_node(bound, n) + ": " + std::string(ir::op_name(n.op)) + " '" + n.attrs.get_str("name") +
                  "' expects shape " + g.node(n.id).shape.str() + " (" + n.shape.str() + " here), got " +
                  ir::extents_str(feeds[n.id]->shape()));
  return run_bound(bound, live, feeds);
}

ir::Tensor eval_node(const ir::Graph& g, const ir::Node& n, const std::vector<const ir::Tensor*>& inputs) {
  std::vector<Value> vals;
  vals.reserve(inputs.size());
  for (auto* t : inputs) vals.push_back(detail::from_tensor(*t));
  std::vector<const Value*> args;
  args.reserve(vals.size());
  for (auto& v : vals) args.push_back(&v);
  Value r = detail::evaluate(Ctx{g, n, args});
  return ir::Tensor::from_f64(r.dtype, r.ext, r.v);
}

}  // namespace rlx::reference
