#include "rlx/reference/interpreter.hpp"

#include <algorithm>

#include "reference/value.hpp"
#include "rlx/ir/op_def.hpp"
#include "rlx/ir/random.hpp"

namespace rlx::reference {
namespace detail {

std::int64_t numel(const Ext& e) { return ir::checked_numel(e, "a reference value"); }

std::string ext_str(const Ext& e) {
  std::string s = "[";
  for (std::size_t i = 0; i < e.size(); ++i) s += (i ? "," : "") + std::to_string(e[i]);
  return s + "]";
}

void Ctx::fail(const std::string& msg) const { throw Error(ir::describe_node(g, n) + ": " + msg); }

std::int64_t Ctx::axis(std::int64_t a, std::size_t rank) const {
  std::int64_t r = std::int64_t(rank);
  if (a < -r || a >= r) fail("axis " + std::to_string(a) + " out of range for rank " + std::to_string(rank));
  return a < 0 ? a + r : a;
}

Ext Ctx::declared() const {
  if (!n.shape.is_static()) fail("declared shape " + n.shape.str() + " is not static");
  return n.shape.extents();
}

Ext Ctx::ints_n(std::string_view key, const Ext& dflt) const {
  std::size_t count = dflt.size();
  auto it = attrs().items().find(key);
  if (it == attrs().items().end()) return dflt;
  if (auto* i = std::get_if<std::int64_t>(&it->second)) return Ext(count, *i);
  const auto& v = attrs().get_ints(key);
  if (v.empty()) return dflt;
  if (v.size() == 1) return Ext(count, v[0]);
  if (v.size() != count) fail("attribute '" + std::string(key) + "' needs 1 or " + std::to_string(count) + " entries");
  return v;
}

std::int64_t Ctx::index(double raw, std::int64_t extent) const {
  auto i = std::int64_t(raw);
  if (i < 0) i += extent;
  if (i < 0 || i >= extent)
    fail("index " + std::to_string(std::int64_t(raw)) + " out of range for extent " + std::to_string(extent));
  return i;
}

Ext broadcast_ext(const Ctx& c, const Ext& a, const Ext& b) {
  std::size_t r = std::max(a.size(), b.size());
  Ext out(r);
  for (std::size_t i = 0; i < r; ++i) {
    std::int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    std::int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1) c.fail("cannot broadcast " + ext_str(a) + " with " + ext_str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::vector<std::int64_t> strided_map(const Ext& out, const Ext& strides, std::int64_t base) {
  std::vector<std::int64_t> m(std::size_t(numel(out)));
  Ext idx(out.size(), 0);
  std::int64_t off = base;
  for (auto& slot : m) {
    slot = off;
    for (std::size_t d = out.size(); d-- > 0;) {
      off += strides[d];
      if (++idx[d] < out[d]) break;
      off -= strides[d] * out[d];
      idx[d] = 0;
    }
  }
  return m;
}

std::vector<std::int64_t> broadcast_map(const Ctx& c, const Ext& in, const Ext& out) {
  if (in.size() > out.size()) c.fail("cannot broadcast " + ext_str(in) + " to " + ext_str(out));
  auto cs = ir::contiguous_strides(in);
  Ext s(out.size(), 0);
  std::size_t lead = out.size() - in.size();
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] == out[lead + i])
      s[lead + i] = cs[i];
    else if (in[i] != 1)
      c.fail("cannot broadcast " + ext_str(in) + " to " + ext_str(out));
  }
  return strided_map(out, s);
}

namespace {

Value eval_leaf(const Ctx& c) {
  const ir::Node& n = c.n;
  switch (n.op) {
    case ir::OpKind::Constant: {
      if (!n.value) c.fail("constant has no value");
      Value r(n.dtype, n.value->shape());
      r.v = n.value->to_f64();
      return r;
    }
    case ir::OpKind::Iota: {
      Value r(n.dtype, c.declared());
      if (r.rank() == 0) return r;  // a scalar sits at index 0
      auto axis = std::size_t(c.axis(c.attrs().get_int("axis"), r.rank()));
      for_each_index(r.ext, [&](const Ext& idx, std::int64_t flat) { r.v[std::size_t(flat)] = double(idx[axis]); });
      return r;
    }
    case ir::OpKind::RandomUniform: {
      Value r(n.dtype, c.declared());
      auto seed = std::uint64_t(c.attrs().get_int("seed"));
      double lo = c.attrs().float_or("low", 0.0), hi = c.attrs().float_or("high", 1.0);
      for (std::size_t i = 0; i < r.v.size(); ++i) r.v[i] = lo + (hi - lo) * double(ir::rng_uniform01(seed, i));
      return r;
    }
    case ir::OpKind::RandomNormal: {
      Value r(n.dtype, c.declared());
      auto seed = std::uint64_t(c.attrs().get_int("seed"));
      double mean = c.attrs().float_or("mean", 0.0), sd = c.attrs().float_or("std", 1.0);
      for (std::size_t i = 0; i < r.v.size(); ++i) r.v[i] = mean + sd * ir::rng_normal(seed, i);
      return r;
    }
    default: c.fail("inputs and params have no value outside run()");
  }
}

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
  if (def.reference || def.formula) {
    r = def.reference ? eval_table_reference(c) : eval_formula(c);
  } else {
    switch (ir::op_info(c.n.op).cls) {
      case ir::OpClass::Leaf: r = eval_leaf(c); break;
      case ir::OpClass::Unary:
      case ir::OpClass::Binary:
      case ir::OpClass::Elementwise: r = eval_elementwise(c); break;
      case ir::OpClass::Reduce: r = eval_reduce(c); break;
      case ir::OpClass::Movement: r = eval_movement(c); break;
      case ir::OpClass::MatMul:
      case ir::OpClass::Composite: r = eval_nn(c); break;
      case ir::OpClass::Custom: r = eval_custom(c); break;
      case ir::OpClass::ControlFlow: r = eval_control_flow(c); break;
    }
  }
  // A mismatch here means shape inference and the op's semantics disagree:
  // the oracle refuses rather than hiding it.
  if (c.n.shape.is_static() && c.n.shape.extents() != r.ext)
    c.fail("reference computed shape " + ext_str(r.ext) + " but the node declares " + c.n.shape.str());
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
    auto it = std::find_if(binds.begin(), binds.end(), [&](auto& b) { return b.first == d.sym; });
    if (it == binds.end())
      binds.emplace_back(d.sym, t.shape()[i]);
    else
      ok = it->second == t.shape()[i];
  }
  if (!ok)
    throw Error(ir::describe_node(g, n) + ": " + what + " expects shape " + n.shape.str() + ", got " +
                detail::ext_str(t.shape()));
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
  return run_bound(ir::bind_symbols(g, binds), live, feeds);
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
