// vmap: a graph batched over a new leading axis. Every value of the result
// either carries the batch axis in front ([B] + its shape in the source) or
// is shared by all examples; a node whose operands are all shared is copied,
// the others go through their op's batching rule. Composites and custom ops
// without a rule of their own are batched through their decomposition
// (lowering), so every op with a decomposition is covered. Control flow
// batches its bodies: scan and an if on a shared condition keep their op; an
// if on a batched condition runs both branches and selects, and a while runs
// until no example's condition holds, each example keeping its carries once
// its own condition fails (as jax.vmap does).
#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>

#include "rlx/autodiff/autodiff.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/ir/custom_op.hpp"
#include "rlx/ir/op_def.hpp"

namespace rlx::autodiff {
namespace {

using ir::Attrs;
using ir::Dim;
using ir::DType;
using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::OpClass;
using ir::OpKind;
using ir::Shape;
using i64 = std::int64_t;
using Ints = std::vector<i64>;

// A value of the batched graph: batched values carry the batch axis first.
using Val = ir::BatchedValue;
using ir::prepend;

Attrs with(const Node& n, const std::string& key, ir::AttrValue v) { return ir::with_attr(n, key, std::move(v)); }

class Batcher {
 public:
  Batcher(Graph& g, Dim size) : g_(g), size_(std::move(size)) {}

  // Batches the nodes of `src` into g_. `leaf` gives each leaf's value, or
  // nullopt to copy the leaf as a shared value. Returns the value of every node.
  std::vector<Val> run(const Graph& src, const std::function<std::optional<Val>(const Node&)>& leaf) {
    std::vector<Val> val(src.size(), Val{0, false});
    for (const Node& n : src.nodes()) {
      if (n.inputs.empty()) {
        auto v = leaf(n);
        val[n.id] = v ? *v : copy(n, {});
        continue;
      }
      std::vector<Val> x;
      for (auto in : n.inputs) x.push_back(val[in]);
      if (std::none_of(x.begin(), x.end(), [](const Val& v) { return v.batched; })) {
        std::vector<NodeId> ids;
        for (const Val& v : x) ids.push_back(v.id);
        val[n.id] = copy(n, std::move(ids));
        continue;
      }
      val[n.id] = batch_node(src, n, x);
      const Node& got = g_.node(val[n.id].id);
      Shape want = val[n.id].batched ? prepend(size_, n.shape) : n.shape;
      if (got.dtype != n.dtype || got.shape != want)
        throw Error("vmap internal error: the batching rule of " + ir::describe_node(src, n) + " gave " +
                    std::string(ir::dtype_name(got.dtype)) + got.shape.str() + ", expected " +
                    std::string(ir::dtype_name(n.dtype)) + want.str());
    }
    return val;
  }

  // The value with the batch axis in front, broadcast if it is shared.
  NodeId lift(const Val& v, const Shape& s) { return ir::lift(g_, v, s, size_); }

 private:
  Val copy(const Node& n, std::vector<NodeId> inputs) {
    Node c = n;
    c.inputs = std::move(inputs);
    return {g_.add_raw(std::move(c)), false};
  }

  Val batch_node(const Graph& src, const Node& n, const std::vector<Val>& x) {
    try {
      return rule(src, n, x);
    } catch (const Error& e) {
      std::string what = e.what();
      if (what.rfind("vmap", 0) == 0) throw;
      throw Error("vmap: " + ir::describe_node(src, n) + ": " + what);
    }
  }

  // The node alone in a graph of its own, turned into other ops by `expand`
  // (its decomposition, or a custom op's lowering), and those batched.
  Val through(const Graph& src, const Node& n, const std::vector<Val>& x,
              const std::function<Graph(const Graph&)>& expand) {
    Graph one(std::string(ir::op_name(n.op)));
    std::vector<NodeId> ins;
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      const Node& in = src.node(n.inputs[k]);
      ins.push_back(one.input("operand" + std::to_string(k), in.shape, in.dtype));
    }
    one.add_output(one.add_declared(n.op, ins, n.attrs, n.dtype, n.shape));
    Graph sub = expand(one);
    auto inputs = sub.input_ids();  // the passes keep leaves in order
    auto vals = run(sub, [&](const Node& m) -> std::optional<Val> {
      if (m.op != OpKind::Input) return std::nullopt;
      return x[std::size_t(std::find(inputs.begin(), inputs.end(), m.id) - inputs.begin())];
    });
    return vals[sub.outputs()[0].node];
  }
  Val decomposed(const Graph& src, const Node& n, const std::vector<Val>& x) {
    return through(src, n, x, [](const Graph& one) { return compile::passes::decompose(one, {}); });
  }

  // An op over an axis of rank-0 operands treats them as a row of one:
  // batched as [B, 1] with the axis at 1, then back to [B].
  Val scalar_as_row(const Node& n, const std::vector<Val>& x) {
    Graph one(std::string(ir::op_name(n.op)));
    std::vector<NodeId> ins;
    std::vector<Val> rows;
    for (std::size_t k = 0; k < x.size(); ++k) {
      DType t = g_.node(x[k].id).dtype;
      ins.push_back(one.input("operand" + std::to_string(k), Shape{1}, t));
      rows.push_back(
          {g_.reshape(x[k].id, x[k].batched ? Shape(std::vector<Dim>{size_, Dim(1)}) : Shape{1}), x[k].batched});
    }
    one.add_output(one.reshape(one.add(n.op, ins, with(n, "axis", i64(0))), n.shape));
    auto vals = run(one, [&](const Node& m) -> std::optional<Val> {
      if (m.op != OpKind::Input) return std::nullopt;
      return rows[m.id];
    });
    return vals[one.outputs()[0].node];
  }

  Val custom(const Graph& src, const Node& n, const std::vector<Val>& x) {
    const auto& name = n.attrs.get_str("op");
    auto ext = ir::find_op_extension(name);
    std::vector<NodeId> ids;
    Ints axes;
    for (const Val& v : x) {
      ids.push_back(v.id);
      axes.push_back(v.batched ? 0 : -1);
    }
    if (auto r = ext->vmap(g_, ids, axes, n.attrs)) return {*r, true};
    return through(src, n, x, [&](const Graph& one) {
      try {
        return compile::passes::inline_custom(one, {});
      } catch (const Error&) {
        throw Error("vmap: " + ir::describe_node(src, n) + ": custom op '" + name +
                    "' has no vmap rule and no lowering to batch through");
      }
    });
  }

  // The op's batching rule from the op table, else the general routes.
  Val rule(const Graph& src, const Node& n, const std::vector<Val>& x) {
    if (n.op == OpKind::Custom) return custom(src, n, x);
    if (ir::is_control_flow(n.op)) return control_flow(src, n, x);
    const ir::OpDef& def = ir::op_def(n.op);
    if (def.vmap)
      return def.vmap(ir::BatchArgs{.g = g_,
                                    .src = src,
                                    .n = n,
                                    .x = x,
                                    .size = size_,
                                    .decomposed = [&] { return decomposed(src, n, x); },
                                    .scalar_as_row = [&] { return scalar_as_row(n, x); }});
    if (def.has_decomposition()) return decomposed(src, n, x);
    throw Error("vmap: " + ir::describe_node(src, n) + ": no batching rule for " + std::string(ir::op_name(n.op)));
  }

  // ---- control flow ----

  // The values of `body`'s outputs when its inputs are `args` (in g_).
  std::vector<Val> inline_body(const Graph& body, const std::vector<Val>& args) {
    auto inputs = body.input_ids();
    auto vals = run(body, [&](const Node& m) -> std::optional<Val> {
      if (m.op != OpKind::Input) return std::nullopt;
      return args[std::size_t(std::find(inputs.begin(), inputs.end(), m.id) - inputs.begin())];
    });
    std::vector<Val> out;
    for (const auto& o : body.outputs()) out.push_back(vals[o.node]);
    return out;
  }

  // A body graph batched as a body again: input i carries the batch axis
  // when in[i]; outputs are batched as they come out, and at least where
  // `lift` says. The second member says which outputs are batched.
  std::pair<Graph, std::vector<bool>> batch_body(const Graph& body, const std::vector<bool>& in,
                                                 const std::vector<bool>& lift) {
    Graph out(body.name());
    Batcher b(out, size_);
    std::vector<Val> args;
    for (std::size_t k = 0; auto id : body.input_ids()) {
      Node decl = body.node(id);
      if (in[k]) decl.shape = prepend(size_, decl.shape);
      args.push_back({out.add_raw(std::move(decl)), in[k++]});
    }
    auto vals = b.inline_body(body, args);
    std::vector<bool> batched;
    for (std::size_t k = 0; k < vals.size(); ++k) {
      const Shape& s = body.node(body.outputs()[k].node).shape;
      out.add_output(lift[k] ? b.lift(vals[k], s) : vals[k].id, body.outputs()[k].name);
      batched.push_back(lift[k] || vals[k].batched);
    }
    return {std::move(out), std::move(batched)};
  }

  // Moves axis 0 and 1 past each other: [T, B, ..] <-> [B, T, ..].
  NodeId swap01(NodeId id) {
    Ints perm(g_.node(id).shape.rank());
    std::iota(perm.begin(), perm.end(), 0);
    std::swap(perm[0], perm[1]);
    return g_.permute(id, perm);
  }

  // A control-flow op is several sibling nodes; it is batched once, for the first one met.
  Val control_flow(const Graph& src, const Node& n, const std::vector<Val>& x) {
    for (const auto& [graph, id, results] : done_)
      if (graph == &src && ir::are_siblings(src.node(id), n)) return results[std::size_t(n.attrs.get_int("result"))];
    std::vector<Val> results = n.op == OpKind::Scan ? scan(src, n, x)
                               : n.op == OpKind::If ? if_else(src, n, x)
                                                    : while_loop(src, n, x);
    done_.push_back({&src, n.id, results});
    return results[std::size_t(n.attrs.get_int("result"))];
  }

  // The body batched with batched carries where a carry can become batched
  // (found by iterating: a carry fed by a batched value is batched).
  std::vector<Val> scan(const Graph& src, const Node& n, const std::vector<Val>& x) {
    const auto& body = *n.attrs.get_graph("body");
    const std::size_t nc = std::size_t(n.attrs.get_int("num_carries")),
                      nk = std::size_t(n.attrs.int_or("num_consts", 0)), nx = x.size() - nc - nk;
    std::vector<bool> in;
    for (const Val& v : x) in.push_back(v.batched);
    std::vector<bool> out_batched(body.outputs().size(), false);
    std::pair<Graph, std::vector<bool>> vb;
    for (bool changed = true; changed;) {
      std::copy(in.begin(), in.begin() + std::ptrdiff_t(nc), out_batched.begin());
      vb = batch_body(body, in, out_batched);
      changed = false;
      for (std::size_t i = 0; i < nc; ++i)
        if (vb.second[i] && !in[i]) in[i] = changed = true;
    }
    std::vector<NodeId> init, xs, consts;
    for (std::size_t i = 0; i < nc; ++i) init.push_back(in[i] ? lift(x[i], src.node(n.inputs[i]).shape) : x[i].id);
    for (std::size_t i = nc; i < nc + nx; ++i) xs.push_back(x[i].batched ? swap01(x[i].id) : x[i].id);
    for (std::size_t i = nc + nx; i < x.size(); ++i) consts.push_back(x[i].id);
    auto r = ir::scan(g_, ir::body_ref(std::move(vb.first)), init, xs, n.attrs.get_int("length"),
                      n.attrs.bool_or("reverse", false), consts);
    std::vector<Val> out;
    for (std::size_t k = 0; k < r.size(); ++k)
      out.push_back(!vb.second[k] ? Val{r[k], false} : k < nc ? Val{r[k], true} : Val{swap01(r[k]), true});
    return out;
  }

  std::vector<Val> if_else(const Graph& src, const Node& n, const std::vector<Val>& x) {
    const auto &then_body = *n.attrs.get_graph("then"), &else_body = *n.attrs.get_graph("else");
    std::vector<Val> args(x.begin() + 1, x.end());
    if (x[0].batched) {  // each example takes its own branch: both run, then a select
      auto t = inline_body(then_body, args), e = inline_body(else_body, args);
      std::vector<Val> out;
      for (std::size_t k = 0; k < t.size(); ++k) {
        const Shape& s = then_body.node(then_body.outputs()[k].node).shape;
        out.push_back({g_.where(ir::align(g_, x[0].id, 0, s.rank()), lift(t[k], s), lift(e[k], s)), true});
      }
      return out;
    }
    std::vector<bool> in;
    for (const Val& v : args) in.push_back(v.batched);
    std::vector<bool> out_batched(then_body.outputs().size(), false);
    auto t = batch_body(then_body, in, out_batched), e = batch_body(else_body, in, out_batched);
    for (std::size_t k = 0; k < out_batched.size(); ++k) out_batched[k] = t.second[k] || e.second[k];
    t = batch_body(then_body, in, out_batched), e = batch_body(else_body, in, out_batched);
    auto r = ir::if_else(g_, x[0].id, ir::body_ref(std::move(t.first)), ir::body_ref(std::move(e.first)), ids(args));
    std::vector<Val> out;
    for (std::size_t k = 0; k < r.size(); ++k) out.push_back({r[k], out_batched[k]});
    return out;
  }

  // Every carry batched; the loop runs while any example's condition holds,
  // and an example whose condition fails keeps its carries.
  std::vector<Val> while_loop(const Graph& src, const Node& n, const std::vector<Val>& x) {
    const auto &cond = *n.attrs.get_graph("cond"), &body = *n.attrs.get_graph("body");
    const std::size_t nc = std::size_t(n.attrs.get_int("num_carries"));
    // A body over the batched carries and the consts, built by `fill` from their values.
    auto make = [&](const std::string& name, const std::function<void(Batcher&, Graph&, std::vector<Val>&)>& fill) {
      Graph h(name);
      Batcher b(h, size_);
      std::vector<Val> args;
      for (std::size_t k = 0; k < x.size(); ++k) {
        const Node& m = src.node(n.inputs[k]);
        bool batched = k < nc || x[k].batched;
        Shape s = batched ? prepend(size_, m.shape) : m.shape;
        args.push_back({h.input("in" + std::to_string(k), std::move(s), m.dtype), batched});
      }
      fill(b, h, args);
      return ir::body_ref(std::move(h));
    };
    auto holds = [&](Batcher& b, const std::vector<Val>& args) {  // bool [B]
      return b.lift(b.inline_body(cond, args)[0], Shape{});
    };
    auto any = make(cond.name(), [&](Batcher& b, Graph& h, std::vector<Val>& args) {
      NodeId flags = h.cast(holds(b, args), DType::I32);
      h.add_output(h.cast(h.reduce(OpKind::ReduceMax, flags, {0}), DType::Bool));
    });
    auto step = make(body.name(), [&](Batcher& b, Graph& h, std::vector<Val>& args) {
      NodeId live = holds(b, args);
      auto next = b.inline_body(body, args);
      for (std::size_t k = 0; k < nc; ++k) {
        const Shape& s = src.node(n.inputs[k]).shape;
        h.add_output(h.where(ir::align(h, live, 0, s.rank()), b.lift(next[k], s), args[k].id));
      }
    });
    std::vector<NodeId> init, consts;
    for (std::size_t k = 0; k < nc; ++k) init.push_back(lift(x[k], src.node(n.inputs[k]).shape));
    for (std::size_t k = nc; k < x.size(); ++k) consts.push_back(x[k].id);
    auto r = ir::while_loop(g_, any, step, init, consts, n.attrs.int_or("max_trip_count", -1));
    std::vector<Val> out;
    for (NodeId id : r) out.push_back({id, true});
    return out;
  }

  static std::vector<NodeId> ids(const std::vector<Val>& x) {
    std::vector<NodeId> r;
    for (const Val& v : x) r.push_back(v.id);
    return r;
  }

  // index_select{axis}(x, idx) = x[:axis] + idx.shape + x[axis+1:].

  // q, k, v [N, H, S, D]: the batch merges into N; the mask follows.

  Graph& g_;
  Dim size_;
  std::vector<std::tuple<const Graph*, NodeId, std::vector<Val>>> done_;  // batched control-flow ops
};

}  // namespace

ir::Graph vmap(const ir::Graph& g, const VmapOptions& options) {
  if (options.size.is_static() && options.size.size < 0)
    throw Error("vmap: the batch size must be >= 0, got " + std::to_string(options.size.size));
  std::set<std::string, std::less<>> batched(options.batched.begin(), options.batched.end());
  for (const auto& name : batched) {
    bool found = std::any_of(g.nodes().begin(), g.nodes().end(), [&](const Node& n) {
      return (n.op == OpKind::Input || n.op == OpKind::Param) && n.attrs.get_str("name") == name;
    });
    if (!found) {
      std::string known;
      for (const Node& n : g.nodes())
        if (n.op == OpKind::Input || n.op == OpKind::Param)
          known += (known.empty() ? "" : ", ") + n.attrs.get_str("name");
      throw Error("vmap: '" + name + "' is not an input or param of graph '" + g.name() + "' (it has " +
                  (known.empty() ? std::string("none") : known) + ")");
    }
  }
  auto is_batched = [&](const Node& n) {
    if (n.op != OpKind::Input && n.op != OpKind::Param) return false;
    return batched.empty() ? n.op == OpKind::Input : batched.contains(n.attrs.get_str("name"));
  };

  Graph out(g.name() + "_vmap");
  Batcher b(out, options.size);
  // The batch axis at `axis` of a value of rank `rank` + 1, from or to the front.
  auto axis_of = [&](i64 axis, std::size_t rank, const char* what) {
    try {
      return std::size_t(ir::normalize_axis(axis, rank + 1));
    } catch (const Error& e) {
      throw Error("vmap: " + std::string(what) + " " + e.what());
    }
  };
  auto vals = b.run(g, [&](const Node& n) -> std::optional<Val> {
    if (!is_batched(n)) return std::nullopt;
    std::size_t at = axis_of(options.in_axis, n.shape.rank(), "in_axis");
    std::vector<Dim> dims = n.shape.dims();
    dims.insert(dims.begin() + std::ptrdiff_t(at), options.size);
    Node decl = n;
    decl.inputs.clear();
    decl.shape = Shape(std::move(dims));
    NodeId id = out.add_raw(std::move(decl));
    if (at == 0) return Val{id, true};
    Ints perm{i64(at)};
    for (std::size_t d = 0; d <= n.shape.rank(); ++d)
      if (d != at) perm.push_back(i64(d));
    return Val{out.permute(id, perm), true};
  });
  for (const auto& o : g.outputs()) {
    const Shape& s = g.node(o.node).shape;
    NodeId v = b.lift(vals[o.node], s);
    std::size_t at = axis_of(options.out_axis, s.rank(), "out_axis");
    if (at != 0) {
      Ints perm;
      for (std::size_t d = 1; d <= s.rank(); ++d) {
        if (perm.size() == at) perm.push_back(0);
        perm.push_back(i64(d));
      }
      if (perm.size() == at) perm.push_back(0);
      v = out.permute(v, perm);
    }
    out.add_output(v, o.name);
  }
  return out;
}

}  // namespace rlx::autodiff
