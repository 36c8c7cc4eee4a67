// Derivatives of scan, if and while. A body's derivative is built by
// replaying the body into a new graph and running the engine's own sweeps on
// it, so any body the engine can differentiate works, nested control flow
// included, and the results can be differentiated again.
//  - scan, reverse mode (ScanBackward): the forward scan runs again with the
//    carries each step reads as extra ys (the residuals); then a scan in the
//    opposite direction, whose body is the body's VJP, carries the carries'
//    cotangents, sums the consts' cotangents as more carries, and stacks the
//    xs' cotangents as its ys.
//  - scan, forward mode: one scan over primals and tangents.
//  - if: an if of the branches' derivatives.
//  - while, forward mode: a while over primals and tangents. Reverse mode needs
//    max_trip_count: the loop is then a scan of that length whose steps after
//    the exit keep the carries (a where), differentiated as above. Without it
//    the rule is an error: the steps to replay are unknown.
#include "autodiff/control_flow.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"

namespace rlx::autodiff::detail {

namespace {

using ir::Graph;
using ir::GraphRef;
using ir::Node;
using ir::OpKind;
using Ids = std::vector<NodeId>;
using Idx = std::vector<std::size_t>;

struct Type {
  ir::DType dtype;
  ir::Shape shape;
};
Type type_of(const Node& n) { return {n.dtype, n.shape}; }

// A body under construction: inputs get fresh names in order.
struct Body {
  Graph g;
  NodeId input(const Type& t) { return g.input("a" + std::to_string(g.input_ids().size()), t.shape, t.dtype); }
  Ids inputs(std::span<const Type> ts) {
    Ids ids;
    for (const auto& t : ts) ids.push_back(input(t));
    return ids;
  }
  NodeId or_zeros(const Maybe& v, const Type& t) { return v ? *v : zeros(g, t.dtype, t.shape); }
  GraphRef done(const Ids& outputs) {
    g.set_outputs(outputs);
    return ir::body_ref(std::move(g));
  }
};

std::vector<Type> input_types(const Graph& f) {
  std::vector<Type> ts;
  for (auto id : f.input_ids()) ts.push_back(type_of(f.node(id)));
  return ts;
}
Type output_type(const Graph& f, std::size_t k) { return type_of(f.node(f.outputs()[k].node)); }
NodeId out_node(const Graph& f, std::size_t k) { return f.outputs()[k].node; }

template <class T>
std::vector<T> pick(std::span<const T> v, const Idx& at) {
  std::vector<T> out;
  for (auto i : at) out.push_back(v[i]);
  return out;
}
Ids cat(std::initializer_list<std::span<const NodeId>> parts) {
  Ids out;
  for (auto p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}
std::size_t position(const Idx& v, std::size_t x) { return std::size_t(std::find(v.begin(), v.end(), x) - v.begin()); }

// f's nodes copied into b with its inputs bound to `args`; f id -> b id.
Ids replay(Graph& b, const Graph& f, std::span<const NodeId> args) {
  Ids map(f.size());
  auto ins = f.input_ids();
  for (std::size_t i = 0; i < ins.size(); ++i) map[ins[i]] = args[i];
  for (const Node& n : f.nodes()) {
    if (n.op == OpKind::Input) continue;
    Node c = n;
    for (auto& in : c.inputs) in = map[in];
    map[n.id] = b.add_raw(std::move(c));
  }
  return map;
}

// Cotangents of f's inputs `want`, given cotangents of some of its outputs.
std::vector<Maybe> body_vjp(Graph& b, const Graph& f, const Ids& map,
                            std::span<const std::pair<std::size_t, NodeId>> seeds, const Idx& want) {
  auto ins = f.input_ids();
  std::vector<Flow> flow(f.size(), Flow::Inactive);
  for (auto i : want) flow[ins[i]] = Flow::Active;
  Analysis a = analyze(f, std::move(flow), {});
  std::vector<Maybe> ct(f.size());
  for (auto [k, c] : seeds) {
    NodeId o = out_node(f, k);
    ct[o] = ct[o] ? b.add(*ct[o], c) : c;
  }
  reverse(b, f, map, a, ct);
  std::vector<Maybe> d;
  for (auto i : want) d.push_back(ct[ins[i]]);
  return d;
}

// Tangents of f's outputs `outs`, given tangents of some of its inputs (one entry per input).
std::vector<Maybe> body_jvp(Graph& b, const Graph& f, const Ids& map, std::span<const Maybe> t_in, const Idx& outs) {
  auto ins = f.input_ids();
  std::vector<Flow> flow(f.size(), Flow::Inactive);
  std::vector<Maybe> t(f.size());
  for (std::size_t i = 0; i < ins.size(); ++i)
    if (t_in[i]) {
      flow[ins[i]] = Flow::Active;
      t[ins[i]] = t_in[i];
    }
  Analysis a = analyze(f, std::move(flow), {});
  Ids roots;
  for (auto k : outs) roots.push_back(out_node(f, k));
  forward(b, f, map, a, needed_for(f, roots), t);
  std::vector<Maybe> r;
  for (auto o : roots) r.push_back(a.flow[o] == Flow::Active ? t[o] : std::nullopt);
  return r;
}

// Errors from inside a body name the node whose body it is.
template <class F>
auto in_body(const Site& s, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    s.fail(std::string("differentiating its body: ") + e.what());
  }
}

// ---- scan ----------------------------------------------------------------------

struct Scan {
  GraphRef body;
  std::size_t nc, nx, nk, ny;
  std::int64_t length;
  bool reverse;
  Scan(const ir::Attrs& a, std::size_t n_in)
      : body(a.get_graph("body")),
        nc(std::size_t(a.get_int("num_carries"))),
        nx(n_in - nc - std::size_t(a.int_or("num_consts", 0))),
        nk(std::size_t(a.int_or("num_consts", 0))),
        ny(body->outputs().size() - nc),
        length(a.get_int("length")),
        reverse(a.bool_or("reverse", false)) {}
  Idx float_carries() const {
    Idx out;
    auto ts = input_types(*body);
    for (std::size_t i = 0; i < nc; ++i)
      if (ir::is_float(ts[i].dtype)) out.push_back(i);
    return out;
  }
};

// d(result r) given its cotangent `ct`, for the scan with attributes `attrs` on
// operands `x`; `want` per operand.
std::vector<Maybe> scan_vjp(Graph& g, const ir::Attrs& attrs, std::span<const NodeId> x, std::size_t r, NodeId ct,
                            const std::vector<bool>& want) {
  const Scan s(attrs, x.size());
  const Graph& f = *s.body;
  const auto ts = input_types(f);
  const Idx fc = s.float_carries();
  Idx wx, wk;
  for (std::size_t j = 0; j < s.nx; ++j)
    if (want[s.nc + j]) wx.push_back(j);
  for (std::size_t k = 0; k < s.nk; ++k)
    if (want[s.nc + s.nx + k]) wk.push_back(k);
  const auto carries = x.subspan(0, s.nc), xs = x.subspan(s.nc, s.nx), consts = x.subspan(s.nc + s.nx);

  // The residuals: every step's input carries, stacked.
  Ids stacked;
  if (s.nc) {
    Graph fr = f;
    for (std::size_t i = 0; i < s.nc; ++i) fr.add_output(f.input_ids()[i]);
    auto res = ir::scan(g, ir::body_ref(std::move(fr)), {carries.begin(), carries.end()}, {xs.begin(), xs.end()},
                        s.length, s.reverse, {consts.begin(), consts.end()});
    stacked.assign(res.begin() + std::ptrdiff_t(s.nc + s.ny), res.end());
  }

  // The backward body: (carry cts..., const ct sums..., carries..., x..., y ct?, consts...).
  Body b{Graph(f.name() + "_vjp")};
  const std::span<const Type> tspan(ts);
  const Ids ct_c = b.inputs(pick(tspan, fc));
  std::vector<Type> kt;
  for (auto k : wk) kt.push_back(ts[s.nc + s.nx + k]);
  const Ids acc = b.inputs(kt);
  const Ids args_c = b.inputs(tspan.subspan(0, s.nc)), args_x = b.inputs(tspan.subspan(s.nc, s.nx));
  std::optional<NodeId> ct_y;
  if (r >= s.nc) ct_y = b.input(output_type(f, r));
  const Ids args_k = b.inputs(tspan.subspan(s.nc + s.nx));
  const Ids map = replay(b.g, f, cat({args_c, args_x, args_k}));
  std::vector<std::pair<std::size_t, NodeId>> seeds;
  for (std::size_t i = 0; i < fc.size(); ++i) seeds.emplace_back(fc[i], ct_c[i]);
  if (ct_y) seeds.emplace_back(r, *ct_y);
  Idx wanted = fc;
  for (auto j : wx) wanted.push_back(s.nc + j);
  for (auto k : wk) wanted.push_back(s.nc + s.nx + k);
  const auto d = body_vjp(b.g, f, map, seeds, wanted);
  Ids outs;
  for (std::size_t i = 0; i < fc.size(); ++i) outs.push_back(b.or_zeros(d[i], ts[fc[i]]));
  for (std::size_t k = 0; k < wk.size(); ++k) {
    const Maybe& dk = d[fc.size() + wx.size() + k];
    outs.push_back(dk ? b.g.add(acc[k], *dk) : acc[k]);
  }
  for (std::size_t j = 0; j < wx.size(); ++j) outs.push_back(b.or_zeros(d[fc.size() + j], ts[s.nc + wx[j]]));

  // The backward scan, in the other direction.
  Ids init;
  for (auto i : fc) init.push_back(i == r ? ct : zeros(g, ts[i].dtype, ts[i].shape));
  for (const auto& t : kt) init.push_back(zeros(g, t.dtype, t.shape));
  Ids bxs = cat({stacked, Ids(xs.begin(), xs.end())});
  if (ct_y) bxs.push_back(ct);
  auto res =
      ir::scan(g, b.done(outs), std::move(init), std::move(bxs), s.length, !s.reverse, {consts.begin(), consts.end()});
  std::vector<Maybe> grads(x.size());
  for (std::size_t i = 0; i < fc.size(); ++i)
    if (want[fc[i]]) grads[fc[i]] = res[i];
  for (std::size_t k = 0; k < wk.size(); ++k) grads[s.nc + s.nx + wk[k]] = res[fc.size() + k];
  for (std::size_t j = 0; j < wx.size(); ++j) grads[s.nc + wx[j]] = res[fc.size() + wk.size() + j];
  return grads;
}

Maybe scan_jvp(Graph& g, const ir::Attrs& attrs, std::span<const NodeId> x, std::size_t r, std::span<const Maybe> t) {
  const Scan s(attrs, x.size());
  const Graph& f = *s.body;
  const auto ts = input_types(f);
  const std::span<const Type> tspan(ts);
  const Idx fc = s.float_carries();
  Idx tx, tk;  // xs and consts with a tangent
  for (std::size_t j = 0; j < s.nx; ++j)
    if (t[s.nc + j]) tx.push_back(j);
  for (std::size_t k = 0; k < s.nk; ++k)
    if (t[s.nc + s.nx + k]) tk.push_back(k);

  // The body over (carries, carry tangents, x, x tangents, consts, const tangents).
  Body b{Graph(f.name() + "_jvp")};
  const Ids c = b.inputs(tspan.subspan(0, s.nc)), tc = b.inputs(pick(tspan, fc));
  const Ids xv = b.inputs(tspan.subspan(s.nc, s.nx));
  std::vector<Type> txt, tkt;
  for (auto j : tx) txt.push_back(ts[s.nc + j]);
  for (auto k : tk) tkt.push_back(ts[s.nc + s.nx + k]);
  const Ids txv = b.inputs(txt);
  const Ids kv = b.inputs(tspan.subspan(s.nc + s.nx)), tkv = b.inputs(tkt);
  const Ids map = replay(b.g, f, cat({c, xv, kv}));
  std::vector<Maybe> t_in(ts.size());
  for (std::size_t i = 0; i < fc.size(); ++i) t_in[fc[i]] = tc[i];
  for (std::size_t j = 0; j < tx.size(); ++j) t_in[s.nc + tx[j]] = txv[j];
  for (std::size_t k = 0; k < tk.size(); ++k) t_in[s.nc + s.nx + tk[k]] = tkv[k];
  Idx outs = fc;
  if (r >= s.nc) outs.push_back(r);
  const auto tt = body_jvp(b.g, f, map, t_in, outs);
  Ids body_outs;
  for (std::size_t i = 0; i < s.nc; ++i) body_outs.push_back(map[out_node(f, i)]);
  for (std::size_t i = 0; i < outs.size(); ++i) body_outs.push_back(b.or_zeros(tt[i], output_type(f, outs[i])));

  Ids init(x.begin(), x.begin() + std::ptrdiff_t(s.nc)),
      xs(x.begin() + std::ptrdiff_t(s.nc), x.begin() + std::ptrdiff_t(s.nc + s.nx)),
      consts(x.begin() + std::ptrdiff_t(s.nc + s.nx), x.end());
  for (auto i : fc) init.push_back(t[i] ? *t[i] : zeros(g, ts[i].dtype, ts[i].shape));
  for (auto j : tx) xs.push_back(*t[s.nc + j]);
  for (auto k : tk) consts.push_back(*t[s.nc + s.nx + k]);
  auto res = ir::scan(g, b.done(body_outs), std::move(init), std::move(xs), s.length, s.reverse, std::move(consts));
  return res[s.nc + (r < s.nc ? position(fc, r) : fc.size())];
}

// ---- if ----------------------------------------------------------------------------

std::vector<Maybe> if_vjp(const Site& s, NodeId ct, const std::vector<bool>& want, std::size_t r) {
  const Graph& then_f = *s.n.attrs.get_graph("then");
  const auto ts = input_types(then_f);
  const std::span<const NodeId> ops = std::span(s.x).subspan(1);
  Idx w;
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (want[i + 1]) w.push_back(i);
  auto branch = [&](const char* key) {
    const Graph& f = *s.n.attrs.get_graph(key);
    Body b{Graph(f.name() + "_vjp")};
    const Ids args = b.inputs(ts);
    const NodeId c = b.input(output_type(f, r));
    const auto map = replay(b.g, f, args);
    const std::pair<std::size_t, NodeId> seed{r, c};
    const auto d = body_vjp(b.g, f, map, std::span(&seed, 1), w);
    Ids outs;
    for (std::size_t i = 0; i < w.size(); ++i) outs.push_back(b.or_zeros(d[i], ts[w[i]]));
    return b.done(outs);
  };
  std::vector<Maybe> grads(s.x.size());
  if (w.empty()) return grads;
  Ids operands(ops.begin(), ops.end());
  operands.push_back(ct);
  auto res = ir::if_else(s.g, s.x[0], branch("then"), branch("else"), std::move(operands));
  for (std::size_t i = 0; i < w.size(); ++i) grads[w[i] + 1] = res[i];
  return grads;
}

Maybe if_jvp(const Site& s, std::span<const Maybe> t, std::size_t r) {
  const auto ts = input_types(*s.n.attrs.get_graph("then"));
  Idx w;
  for (std::size_t i = 1; i < t.size(); ++i)
    if (t[i]) w.push_back(i - 1);
  auto branch = [&](const char* key) {
    const Graph& f = *s.n.attrs.get_graph(key);
    Body b{Graph(f.name() + "_jvp")};
    const Ids args = b.inputs(ts), targs = b.inputs(pick(std::span<const Type>(ts), w));
    const auto map = replay(b.g, f, args);
    std::vector<Maybe> t_in(ts.size());
    for (std::size_t i = 0; i < w.size(); ++i) t_in[w[i]] = targs[i];
    const auto tt = body_jvp(b.g, f, map, t_in, {r});
    return b.done({b.or_zeros(tt[0], output_type(f, r))});
  };
  Ids operands(s.x.begin() + 1, s.x.end());
  for (auto i : w) operands.push_back(*t[i + 1]);
  return ir::if_else(s.g, s.x[0], branch("then"), branch("else"), std::move(operands))[0];
}

// ---- while -------------------------------------------------------------------------

Maybe while_jvp(const Site& s, std::span<const Maybe> t, std::size_t r) {
  const ir::Attrs& a = s.n.attrs;
  const Graph &cond = *a.get_graph("cond"), &body = *a.get_graph("body");
  const auto nc = std::size_t(a.get_int("num_carries"));
  const auto ts = input_types(body);
  const std::span<const Type> tspan(ts);
  Idx fc, tk;
  for (std::size_t i = 0; i < nc; ++i)
    if (ir::is_float(ts[i].dtype)) fc.push_back(i);
  for (std::size_t k = nc; k < ts.size(); ++k)
    if (t[k]) tk.push_back(k);
  // Both bodies take (carries, carry tangents, consts, const tangents).
  auto start = [&](const Graph& f, Ids& args, Ids& tc, Ids& tkv) {
    Body b{Graph(f.name() + "_jvp")};
    args = b.inputs(tspan.subspan(0, nc));
    tc = b.inputs(pick(tspan, fc));
    const Ids kv = b.inputs(tspan.subspan(nc));
    tkv = b.inputs(pick(tspan, tk));
    args.insert(args.end(), kv.begin(), kv.end());
    return b;
  };
  Ids args, tc, tkv;
  Body cb = start(cond, args, tc, tkv);
  const NodeId p = replay(cb.g, cond, args)[out_node(cond, 0)];
  Body bb = start(body, args, tc, tkv);
  const auto map = replay(bb.g, body, args);
  std::vector<Maybe> t_in(ts.size());
  for (std::size_t i = 0; i < fc.size(); ++i) t_in[fc[i]] = tc[i];
  for (std::size_t k = 0; k < tk.size(); ++k) t_in[tk[k]] = tkv[k];
  const auto tt = body_jvp(bb.g, body, map, t_in, fc);
  Ids outs;
  for (std::size_t i = 0; i < nc; ++i) outs.push_back(map[out_node(body, i)]);
  for (std::size_t i = 0; i < fc.size(); ++i) outs.push_back(bb.or_zeros(tt[i], ts[fc[i]]));

  Ids init(s.x.begin(), s.x.begin() + std::ptrdiff_t(nc)), consts(s.x.begin() + std::ptrdiff_t(nc), s.x.end());
  for (auto i : fc) init.push_back(t[i] ? *t[i] : zeros(s.g, ts[i].dtype, ts[i].shape));
  for (auto k : tk) consts.push_back(*t[k]);
  auto res = ir::while_loop(s.g, cb.done({p}), bb.done(outs), std::move(init), std::move(consts),
                            a.int_or("max_trip_count", -1));
  return res[nc + position(fc, r)];
}

std::vector<Maybe> while_vjp(const Site& s, NodeId ct, const std::vector<bool>& want, std::size_t r) {
  const ir::Attrs& a = s.n.attrs;
  // The same loop as a scan of max_trip_count steps: carries (c..., active),
  // consts k; a step runs the body only while active && cond, else keeps c.
  const Graph &cond = *a.get_graph("cond"), &body = *a.get_graph("body");
  const auto nc = std::size_t(a.get_int("num_carries"));
  const auto ts = input_types(body);
  const std::span<const Type> tspan(ts);
  Body b{Graph(body.name() + "_steps")};
  const Ids c = b.inputs(tspan.subspan(0, nc));
  const NodeId active = b.input({ir::DType::Bool, ir::Shape{}});
  const Ids k = b.inputs(tspan.subspan(nc));
  const Ids args = cat({c, k});
  const NodeId go = b.g.binary(OpKind::And, active, replay(b.g, cond, args)[out_node(cond, 0)]);
  const auto map = replay(b.g, body, args);
  Ids outs;
  for (std::size_t i = 0; i < nc; ++i) outs.push_back(b.g.where(go, map[out_node(body, i)], c[i]));
  outs.push_back(go);
  ir::Attrs scan{{"body", b.done(outs)},
                 {"length", a.get_int("max_trip_count")},
                 {"num_carries", std::int64_t(nc + 1)},
                 {"num_consts", std::int64_t(ts.size() - nc)},
                 {"reverse", false}};
  Ids x(s.x.begin(), s.x.begin() + std::ptrdiff_t(nc));
  x.push_back(s.g.scalar(1.0, ir::DType::Bool));
  x.insert(x.end(), s.x.begin() + std::ptrdiff_t(nc), s.x.end());
  std::vector<bool> w(want.begin(), want.begin() + std::ptrdiff_t(nc));
  w.push_back(false);
  w.insert(w.end(), want.begin() + std::ptrdiff_t(nc), want.end());
  auto d = scan_vjp(s.g, scan, x, r, ct, w);
  d.erase(d.begin() + std::ptrdiff_t(nc));
  return d;
}

}  // namespace

std::vector<Maybe> control_flow_vjp(const Site& s, NodeId ct, const std::vector<bool>& want) {
  const auto r = std::size_t(s.n.attrs.get_int("result"));
  if (s.n.op == OpKind::While && s.n.attrs.int_or("max_trip_count", -1) < 0)
    s.fail(
        "a while loop is not differentiable in reverse mode without max_trip_count: the steps to run backwards "
        "are unknown when the graph is built. Set max_trip_count (it then differentiates as a scan of that "
        "length), write the loop as a scan, or use forward mode (jvp)");
  return in_body(s, [&] {
    switch (s.n.op) {
      case OpKind::Scan: return scan_vjp(s.g, s.n.attrs, s.x, r, ct, want);
      case OpKind::If: return if_vjp(s, ct, want, r);
      default: return while_vjp(s, ct, want, r);
    }
  });
}

Maybe control_flow_jvp(const Site& s, std::span<const Maybe> t) {
  const auto r = std::size_t(s.n.attrs.get_int("result"));
  return in_body(s, [&]() -> Maybe {
    switch (s.n.op) {
      case OpKind::Scan: return scan_jvp(s.g, s.n.attrs, s.x, r, t);
      case OpKind::If: return if_jvp(s, t, r);
      default: return while_jvp(s, t, r);
    }
  });
}

}  // namespace rlx::autodiff::detail
