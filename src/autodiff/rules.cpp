// The derivative rules, one case per op. Elementwise, reduction and softmax
// rules are linear maps shared by both modes: the JVP applies the map to a
// tangent, the VJP applies its transpose to a cotangent (the same map for
// elementwise ops, plus un-broadcasting). Rules only emit ops that have rules
// themselves, and comparisons only as where() conditions, so a derivative
// graph can be differentiated again.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>

#include "autodiff/control_flow.hpp"
#include "autodiff/engine.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/custom_op.hpp"
#include "rlx/ir/op_def.hpp"

namespace rlx::autodiff::detail {
namespace {

using ir::Dim;
using ir::DType;
using ir::Graph;
using ir::Node;
using ir::OpKind;
using ir::Shape;
using i64 = std::int64_t;
using Ints = std::vector<i64>;

// A constant of the node's dtype (every op that reaches a rule computes in
// its operands' float dtype, except cast, which needs none).
NodeId cst(const Site& s, double v) { return s.g.scalar(v, s.n.dtype); }
NodeId neg(Graph& g, NodeId v) { return g.unary(OpKind::Neg, v); }

Ints normalized(const Ints& axes, std::size_t rank) {
  Ints out;
  for (auto a : axes) out.push_back(ir::normalize_axis(a, rank));
  std::sort(out.begin(), out.end());
  return out;
}

i64 static_extent(const Site& s, const Dim& d, const char* what) {
  if (!d.is_static()) s.fail(std::string("its derivative needs a static ") + what + ", got " + d.str());
  return d.size;
}

Ints inverse_permutation(const Ints& perm) {
  Ints inv(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) inv[std::size_t(perm[i])] = i64(i);
  return inv;
}

// ---- elementwise -----------------------------------------------------------

// v * f'(x) for y = f(x); nullopt for an op without a rule here (one with a
// formula is then differentiated through it).
std::optional<NodeId> unary_map(const Site& s, NodeId v) {
  Graph& g = s.g;
  NodeId x = s.x[0], y = s.y;
  auto c = [&](double val) { return cst(s, val); };
  auto un = [&](OpKind op, NodeId a) { return g.unary(op, a); };
  switch (s.n.op) {
    case OpKind::Neg: return neg(g, v);
    case OpKind::Abs: return g.mul(v, un(OpKind::Sign, x));  // 0 at 0, like torch
    case OpKind::Exp: return g.mul(v, y);
    case OpKind::Log: return g.div(v, x);
    case OpKind::Sqrt: return g.div(g.mul(v, c(0.5)), y);
    case OpKind::Rsqrt: return g.mul(v, g.mul(c(-0.5), g.mul(y, g.mul(y, y))));
    case OpKind::Reciprocal: return neg(g, g.mul(v, g.mul(y, y)));
    case OpKind::Tanh: return g.mul(v, g.sub(c(1), g.mul(y, y)));
    case OpKind::Sigmoid: return g.mul(v, g.mul(y, g.sub(c(1), y)));
    case OpKind::Relu: return g.where(g.binary(OpKind::Gt, x, c(0)), v, c(0));
    case OpKind::Gelu: {  // Phi(x) + x phi(x)
      NodeId cdf = g.mul(c(0.5), g.add(c(1), un(OpKind::Erf, g.mul(x, c(1 / std::numbers::sqrt2)))));
      NodeId pdf = g.mul(c(0.5 * std::numbers::sqrt2 * std::numbers::inv_sqrtpi), g.exp(g.mul(c(-0.5), g.mul(x, x))));
      return g.mul(v, g.add(cdf, g.mul(x, pdf)));
    }
    case OpKind::GeluTanh: {  // 0.5 (1 + th) + 0.5 x (1 - th^2) u'(x), th = tanh(u(x))
      const double a = std::sqrt(2 / std::numbers::pi), b = 0.044715;
      NodeId x2 = g.mul(x, x);
      NodeId th = un(OpKind::Tanh, g.mul(c(a), g.add(x, g.mul(c(b), g.mul(x, x2)))));
      NodeId du = g.mul(c(a), g.add(c(1), g.mul(c(3 * b), x2)));
      NodeId d = g.add(g.mul(c(0.5), g.add(c(1), th)), g.mul(g.mul(c(0.5), x), g.mul(g.sub(c(1), g.mul(th, th)), du)));
      return g.mul(v, d);
    }
    case OpKind::Silu: {
      NodeId sg = un(OpKind::Sigmoid, x);
      return g.mul(v, g.mul(sg, g.add(c(1), g.mul(x, g.sub(c(1), sg)))));
    }
    case OpKind::Softplus: return g.mul(v, un(OpKind::Sigmoid, x));
    case OpKind::Erf: return g.mul(v, g.mul(c(2 * std::numbers::inv_sqrtpi), g.exp(neg(g, g.mul(x, x)))));
    case OpKind::Sin: return g.mul(v, un(OpKind::Cos, x));
    case OpKind::Cos: return neg(g, g.mul(v, un(OpKind::Sin, x)));
    default: return std::nullopt;
  }
}

// v * d f(a, b) / d operand, in the broadcast shape.
NodeId binary_partial(const Site& s, std::size_t k, NodeId v) {
  Graph& g = s.g;
  NodeId a = s.x[0], b = s.x[1];
  auto c = [&](double val) { return cst(s, val); };
  auto cmp = [&](OpKind op, NodeId l, NodeId r) { return g.binary(op, l, r); };
  switch (s.n.op) {
    case OpKind::Add: return v;
    case OpKind::Sub: return k == 0 ? v : neg(g, v);
    case OpKind::Mul: return g.mul(v, k == 0 ? b : a);
    case OpKind::Div: return k == 0 ? g.div(v, b) : neg(g, g.div(g.mul(v, s.y), b));
    case OpKind::Pow:
      // The masks are torch's: b = 0 gives 0 rather than 0 * inf, and so
      // does a = 0 with b >= 0 rather than 0 * log(0).
      if (k == 0)
        return g.where(cmp(OpKind::Eq, b, c(0)), c(0), g.mul(v, g.mul(b, g.binary(OpKind::Pow, a, g.sub(b, c(1))))));
      return g.where(g.binary(OpKind::And, cmp(OpKind::Eq, a, c(0)), cmp(OpKind::Ge, b, c(0))), c(0),
                     g.mul(v, g.mul(s.y, g.unary(OpKind::Log, a))));
    case OpKind::Max:
    case OpKind::Min: {  // a tie splits the derivative evenly, as in torch and JAX
      NodeId mine = s.x[k], other = s.x[1 - k];
      NodeId tie = g.where(cmp(OpKind::Eq, mine, other), g.mul(v, c(0.5)), c(0));
      return g.where(cmp(s.n.op == OpKind::Max ? OpKind::Gt : OpKind::Lt, mine, other), v, tie);
    }
    case OpKind::Mod: return k == 0 ? v : neg(g, g.mul(v, g.unary(OpKind::Floor, g.div(a, b))));  // a - b floor(a/b)
    default: s.fail("no derivative rule for this op");
  }
}

// Inside [min, max] (inclusive, like torch) the derivative is 1, else 0.
NodeId clamp_map(const Site& s, NodeId v) {
  Graph& g = s.g;
  NodeId x = s.x[0];
  NodeId inside = g.binary(OpKind::And, g.binary(OpKind::Ge, x, cst(s, s.n.attrs.get_float("min"))),
                           g.binary(OpKind::Le, x, cst(s, s.n.attrs.get_float("max"))));
  return g.where(inside, v, cst(s, 0));
}

// ---- reductions ------------------------------------------------------------

struct Reduction {
  Ints axes;
  bool keep;
  Shape kept;  // the operand's shape with reduced dims 1
};

Reduction reduction(const Site& s) {
  const Shape& xs = s.in(0).shape;
  Reduction r{normalized(s.n.attrs.get_ints("axes"), xs.rank()), s.n.attrs.get_bool("keepdims"), xs};
  for (auto a : r.axes) r.kept[std::size_t(a)] = Dim(1);
  return r;
}

// A value of the result's shape, with the reduced dims back as 1 so that it
// broadcasts against the operand.
NodeId kept(const Site& s, const Reduction& r, NodeId v) { return r.keep ? v : s.g.reshape(v, r.kept); }

// d y / d x for max and min: the extreme elements share the derivative.
NodeId extreme_partials(const Site& s, const Reduction& r) {
  Graph& g = s.g;
  NodeId mask = g.binary(OpKind::Eq, s.x[0], kept(s, r, s.y));
  NodeId count = g.sum(g.where(mask, cst(s, 1), cst(s, 0)), r.axes, true);
  return g.where(mask, g.div(cst(s, 1), count), cst(s, 0));
}

// d y / d x for prod: the product of the other elements of the group,
// without dividing (zeros stay exact, to every order). The reduced dims are
// moved last and flattened; then an exclusive prefix product times an
// exclusive suffix product, each a scan of log2(n) shifted products.
NodeId prod_partials(const Site& s, const Reduction& r) {
  Graph& g = s.g;
  const Shape& xs = s.in(0).shape;
  std::size_t rank = xs.rank();
  Ints perm;
  for (std::size_t d = 0; d < rank; ++d)
    if (!std::binary_search(r.axes.begin(), r.axes.end(), i64(d))) perm.push_back(i64(d));
  perm.insert(perm.end(), r.axes.begin(), r.axes.end());
  std::vector<Dim> dims;
  i64 n = 1;
  for (std::size_t d = 0; d < rank; ++d) {
    const Dim& e = xs[std::size_t(perm[d])];
    if (d + r.axes.size() < rank)
      dims.push_back(e);
    else
      n *= static_extent(s, e, "reduced dim");
  }
  dims.push_back(Dim(n));
  NodeId moved = g.permute(s.x[0], perm);
  Shape moved_shape = g.node(moved).shape, rows(std::move(dims));
  std::size_t last = rows.rank() - 1;
  auto shift = [&](NodeId v, i64 k) {  // v[i - k] along the last axis, ones shifted in
    Ints pads(2 * rows.rank(), 0);
    pads[last] = k;
    return g.pad(g.narrow(v, i64(last), 0, n - k), pads, 1.0);
  };
  auto exclusive_scan = [&](NodeId v) {
    for (i64 k = 1; k < n; k *= 2) v = g.mul(v, shift(v, k));
    return shift(v, 1);
  };
  NodeId flat = g.reshape(moved, rows);
  NodeId before = exclusive_scan(flat), after = g.flip(exclusive_scan(g.flip(flat, {i64(last)})), {i64(last)});
  return g.permute(g.reshape(g.mul(before, after), moved_shape), inverse_permutation(perm));
}

NodeId reduce_vjp(const Site& s, NodeId ct) {
  Graph& g = s.g;
  Reduction r = reduction(s);
  const Shape& xs = s.in(0).shape;
  NodeId c = kept(s, r, ct);
  switch (s.n.op) {
    case OpKind::ReduceSum: return fit(g, c, xs);
    case OpKind::ReduceMean: {
      i64 count = 1;
      for (auto a : r.axes) count *= static_extent(s, xs[std::size_t(a)], "reduced dim");
      return fit(g, g.div(c, cst(s, double(count))), xs);
    }
    case OpKind::ReduceMax:
    case OpKind::ReduceMin: return g.mul(extreme_partials(s, r), c);
    case OpKind::ReduceProd: return g.mul(prod_partials(s, r), c);
    default: s.fail("no derivative rule for this op");
  }
}

NodeId reduce_jvp(const Site& s, NodeId t) {
  Reduction r = reduction(s);
  switch (s.n.op) {
    case OpKind::ReduceSum:
    case OpKind::ReduceMean: return same_op(s, {t});
    case OpKind::ReduceMax:
    case OpKind::ReduceMin: return s.g.sum(s.g.mul(extreme_partials(s, r), t), r.axes, r.keep);
    case OpKind::ReduceProd: return s.g.sum(s.g.mul(prod_partials(s, r), t), r.axes, r.keep);
    default: s.fail("no derivative rule for this op");
  }
}

// ---- movement --------------------------------------------------------------

// The transpose of slice: zeros between strided elements, zeros around.
NodeId slice_vjp(const Site& s, NodeId ct) {
  Graph& g = s.g;
  const Shape &xs = s.in(0).shape, &ys = s.n.shape;
  const auto &starts = s.n.attrs.get_ints("starts"), &steps = s.n.attrs.get_ints("steps");
  std::size_t rank = xs.rank();
  for (std::size_t d = 0; d < rank; ++d)
    if (ys[d].is_static() && ys[d].size == 0) return zeros(g, s.n.dtype, xs);
  Ints pads(2 * rank, 0);
  for (std::size_t d = 0; d < rank; ++d) {
    if (!xs[d].is_static()) continue;  // a symbolic dim is always taken whole
    i64 m = ys[d].size, span = m;
    if (steps[d] > 1 && m > 1) {
      // [.., m, ..] -> [.., m, step, ..] padded with zeros -> [.., m*step, ..], cut after the last element.
      Ints p(2 * (rank + 1), 0);
      p[rank + 1 + d + 1] = steps[d] - 1;
      NodeId v = g.pad(g.unsqueeze(ct, {i64(d) + 1}), p);
      Shape flat = g.node(ct).shape;
      flat[d] = Dim(m * steps[d]);
      span = (m - 1) * steps[d] + 1;
      ct = g.narrow(g.reshape(v, flat), i64(d), 0, span);
    }
    pads[d] = starts[d];
    pads[rank + d] = xs[d].size - starts[d] - span;
  }
  return std::all_of(pads.begin(), pads.end(), [](i64 p) { return p == 0; }) ? ct : g.pad(ct, pads);
}

// The transpose of pad: crop what was added; where pad cropped, zeros.
NodeId pad_vjp(const Site& s, NodeId ct) {
  Graph& g = s.g;
  Ints pads = s.n.attrs.get_ints("pads");
  const Shape& xs = s.in(0).shape;
  if (std::any_of(pads.begin(), pads.end(), [](i64 p) { return p < 0; })) {
    for (auto& p : pads) p = -p;
    return g.pad(ct, pads);
  }
  Ints axes, starts, ends;
  for (std::size_t d = 0; d < xs.rank(); ++d) {
    if (pads[d] == 0 && pads[xs.rank() + d] == 0) continue;
    axes.push_back(i64(d));
    starts.push_back(pads[d]);
    ends.push_back(pads[d] + xs[d].size);
  }
  return g.slice(ct, axes, starts, ends);
}

// The transpose of index_select along `axis`: every selected slice is added
// back at its index (scatter_add over the flattened index).
NodeId select_vjp(const Site& s, NodeId ct, std::size_t table, std::size_t index, i64 axis) {
  Graph& g = s.g;
  const Shape& xs = s.in(table).shape;
  const Node& idx = s.in(index);
  i64 count = 1;
  for (const auto& d : idx.shape.dims()) count *= static_extent(s, d, "index shape");
  Shape flat = xs, column(std::vector<Dim>(xs.rank(), Dim(1)));
  flat[std::size_t(axis)] = column[std::size_t(axis)] = Dim(count);
  NodeId where_to = g.expand(g.reshape(s.x[index], column), flat);
  return g.scatter_add(zeros(g, s.n.dtype, xs), where_to, g.reshape(ct, flat), axis);
}

// ---- composites ------------------------------------------------------------

// y * (v - sum(v * y)), as the fused backward op: the softmax Jacobian is
// symmetric, so both modes use it.
NodeId softmax_map(const Site& s, NodeId v) {
  return s.g.add(OpKind::SoftmaxBackward, {s.y, v}, {{"axis", s.n.attrs.get_int("axis")}});
}

// layer_norm and rms_norm: dx by their fused backward op; d gamma and d beta
// sum the cotangent (times the normalized x, the op without its affine part)
// over the leading dims.
std::vector<Maybe> norm_vjp(const Site& s, NodeId ct, const std::vector<bool>& want) {
  Graph& g = s.g;
  const Node& n = s.n;
  const bool rms = n.op == OpKind::RmsNorm;
  const std::size_t rank = n.shape.rank();
  const std::size_t axis = rms ? rank - 1 : std::size_t(ir::normalize_axis(n.attrs.get_int("axis"), rank));
  Ints lead(axis);
  std::iota(lead.begin(), lead.end(), 0);
  auto over_rows = [&](NodeId v) { return lead.empty() ? v : g.sum(v, lead); };
  std::vector<Maybe> d(n.inputs.size());
  if (want[0]) {
    std::vector<NodeId> ins{s.x[0], ct};
    if (n.inputs.size() > 1) ins.push_back(s.x[1]);
    d[0] = g.add(rms ? OpKind::RmsNormBackward : OpKind::LayerNormBackward, std::move(ins), n.attrs);
  }
  if (n.inputs.size() > 1 && want[1]) {
    NodeId xhat = g.add(n.op, {s.x[0]}, n.attrs);
    d[1] = over_rows(g.mul(ct, xhat));
  }
  if (n.inputs.size() > 2 && want[2]) d[2] = over_rows(ct);
  return d;
}

// Rows of x and of the output cotangent as matrices, so that dW is one matmul.
NodeId linear_dw(const Site& s, NodeId ct) {
  Graph& g = s.g;
  auto rows = [&](NodeId v, const Shape& sh) {
    std::size_t r = sh.rank();
    if (r == 1) return g.reshape(v, Shape(std::vector<Dim>{Dim(1), sh[0]}));
    if (r == 2 || !sh.is_static()) return v;  // symbolic batch dims: batched matmul, summed below
    i64 n = 1;
    for (std::size_t d = 0; d + 1 < r; ++d) n *= sh[d].size;
    return g.reshape(v, Ints{n, sh[r - 1].size});
  };
  NodeId m = g.matmul(g.transpose(rows(s.x[0], s.in(0).shape)), rows(ct, s.n.shape));
  Ints batch(g.node(m).shape.rank() - 2);
  std::iota(batch.begin(), batch.end(), 0);
  return batch.empty() ? m : g.sum(m, batch);
}

// A bias of [O] as [O, 1, ..] so that it broadcasts over N, C, spatial.
NodeId channel_column(const Site& s, NodeId b) {
  std::vector<Dim> dims(s.n.shape.rank() - 1, Dim(1));
  dims[0] = s.in(2).shape[0];
  return s.g.reshape(b, Shape(std::move(dims)));
}

Maybe sum_terms(Graph& g, const std::vector<NodeId>& terms, const Shape& to) {
  if (terms.empty()) return std::nullopt;
  NodeId acc = terms[0];
  for (std::size_t i = 1; i < terms.size(); ++i) acc = g.add(acc, terms[i]);
  return fit(g, acc, to);
}

}  // namespace

std::vector<Maybe> vjp_rule(const Site& s, NodeId ct, const std::vector<bool>& want) {
  Graph& g = s.g;
  const Node& n = s.n;
  std::vector<Maybe> d(n.inputs.size());
  auto shape = [&](std::size_t k) -> const Shape& { return s.in(k).shape; };
  auto axis = [&] { return ir::normalize_axis(n.attrs.get_int("axis"), shape(0).rank()); };
  switch (ir::op_info(n.op).cls) {
    case ir::OpClass::Unary:
      if (auto m = unary_map(s, ct)) {
        d[0] = *m;
        return d;
      }
      if (ir::op_def(n.op).formula) return vjp_decomposed(s, ct, want);
      s.fail("no derivative rule for this op");
    case ir::OpClass::Binary:
      for (std::size_t k = 0; k < 2; ++k)
        if (want[k]) d[k] = unbroadcast(g, binary_partial(s, k, ct), shape(k));
      return d;
    default: break;
  }
  switch (n.op) {
    case OpKind::Where:
      if (want[1]) d[1] = unbroadcast(g, g.where(s.x[0], ct, cst(s, 0)), shape(1));
      if (want[2]) d[2] = unbroadcast(g, g.where(s.x[0], cst(s, 0), ct), shape(2));
      break;
    case OpKind::Cast: d[0] = g.cast(ct, s.in(0).dtype); break;
    case OpKind::Clamp: d[0] = clamp_map(s, ct); break;
    case OpKind::ReduceSum:
    case OpKind::ReduceMean:
    case OpKind::ReduceMax:
    case OpKind::ReduceMin:
    case OpKind::ReduceProd: d[0] = reduce_vjp(s, ct); break;
    case OpKind::MatMul:
      if (want[0]) d[0] = unbroadcast(g, g.matmul(ct, g.transpose(s.x[1])), shape(0));
      if (want[1]) d[1] = unbroadcast(g, g.matmul(g.transpose(s.x[0]), ct), shape(1));
      break;
    case OpKind::Reshape: d[0] = g.reshape(ct, shape(0)); break;
    case OpKind::Permute: d[0] = g.permute(ct, inverse_permutation(n.attrs.get_ints("perm"))); break;
    case OpKind::Expand: d[0] = unbroadcast(g, ct, shape(0)); break;
    case OpKind::Slice: d[0] = slice_vjp(s, ct); break;
    case OpKind::Concat: {
      i64 ax = axis(), at = 0;
      for (std::size_t k = 0; k < n.inputs.size(); ++k) {
        i64 size = static_extent(s, shape(k)[std::size_t(ax)], "concat dim");
        if (want[k]) d[k] = g.slice(ct, {ax}, {at}, {at + size});
        at += size;
      }
      break;
    }
    case OpKind::Pad: d[0] = pad_vjp(s, ct); break;
    case OpKind::Gather: d[0] = g.scatter_add(zeros(g, n.dtype, shape(0)), s.x[1], ct, axis()); break;
    case OpKind::IndexSelect: d[0] = select_vjp(s, ct, 0, 1, axis()); break;
    case OpKind::Embedding: d[0] = select_vjp(s, ct, 0, 1, 0); break;
    case OpKind::ScatterAdd:
      if (want[0]) d[0] = ct;
      if (want[2]) d[2] = g.gather(ct, s.x[1], axis());
      break;
    case OpKind::Squeeze: d[0] = g.unsqueeze(ct, normalized(n.attrs.get_ints("axes"), shape(0).rank())); break;
    case OpKind::Unsqueeze: d[0] = g.squeeze(ct, normalized(n.attrs.get_ints("axes"), n.shape.rank())); break;
    case OpKind::Flip: d[0] = g.flip(ct, n.attrs.get_ints("axes")); break;
    case OpKind::Linear:
      if (want[0]) d[0] = g.linear(ct, g.transpose(s.x[1]));
      if (want[1]) d[1] = linear_dw(s, ct);
      if (n.inputs.size() == 3 && want[2]) {
        Ints lead(n.shape.rank() - 1);
        std::iota(lead.begin(), lead.end(), 0);
        d[2] = lead.empty() ? ct : g.sum(ct, lead);
      }
      break;
    case OpKind::Softmax: d[0] = softmax_map(s, ct); break;
    case OpKind::LogSoftmax:  // v - softmax(x) sum(v)
      d[0] = g.add(OpKind::LogSoftmaxBackward, {s.y, ct}, {{"axis", n.attrs.get_int("axis")}});
      break;
    case OpKind::LayerNorm:
    case OpKind::RmsNorm: return norm_vjp(s, ct, want);
    case OpKind::Conv1d:
    case OpKind::Conv2d:
    case OpKind::MaxPool2d:
    case OpKind::AvgPool2d:
    case OpKind::Attention:
    case OpKind::SoftmaxBackward:
    case OpKind::LogSoftmaxBackward:
    case OpKind::LayerNormBackward:
    case OpKind::RmsNormBackward: return vjp_decomposed(s, ct, want);
    case OpKind::Custom: {  // the extension's own rule, else through its lowering
      auto ext = ir::find_op_extension(n.attrs.get_str("op"));
      if (auto rule = ext->vjp(g, s.x, s.y, ct, n.attrs)) {
        if (rule->size() != n.inputs.size()) s.fail("its vjp rule returned the wrong number of cotangents");
        return *rule;
      }
      return vjp_decomposed(s, ct, want);
    }
    case OpKind::Scan:
    case OpKind::If:
    case OpKind::While: return control_flow_vjp(s, ct, want);
    default:
      // An op the table decomposes, without a rule here, is differentiated through its decomposition.
      if (ir::op_def(n.op).decompose) return vjp_decomposed(s, ct, want);
      s.fail("no VJP rule for this op");
  }
  return d;
}

Maybe jvp_rule(const Site& s, std::span<const Maybe> t) {
  Graph& g = s.g;
  const Node& n = s.n;
  const Shape& ys = n.shape;
  auto shape = [&](std::size_t k) -> const Shape& { return s.in(k).shape; };
  auto or_zeros = [&](std::size_t k) { return t[k] ? *t[k] : zeros(g, s.in(k).dtype, shape(k)); };
  std::vector<NodeId> terms;
  switch (ir::op_info(n.op).cls) {
    case ir::OpClass::Unary:
      if (!t[0]) return std::nullopt;
      if (auto m = unary_map(s, *t[0])) return m;
      if (ir::op_def(n.op).formula) return jvp_decomposed(s, t);
      s.fail("no derivative rule for this op");
    case ir::OpClass::Binary:
      for (std::size_t k = 0; k < 2; ++k)
        if (t[k]) terms.push_back(binary_partial(s, k, *t[k]));
      return sum_terms(g, terms, ys);
    default: break;
  }
  switch (n.op) {
    case OpKind::Where:
      if (!t[1] && !t[2]) return std::nullopt;
      return fit(g, g.where(s.x[0], t[1] ? *t[1] : cst(s, 0), t[2] ? *t[2] : cst(s, 0)), ys);
    case OpKind::MatMul:
      if (t[0]) terms.push_back(g.matmul(*t[0], s.x[1]));
      if (t[1]) terms.push_back(g.matmul(s.x[0], *t[1]));
      return sum_terms(g, terms, ys);
    case OpKind::Concat: {
      std::vector<NodeId> parts;
      for (std::size_t k = 0; k < t.size(); ++k) parts.push_back(or_zeros(k));
      return same_op(s, std::move(parts));
    }
    case OpKind::ScatterAdd:
      if (!t[2]) return t[0];
      return same_op(s, {or_zeros(0), s.x[1], *t[2]});
    case OpKind::Linear:
      if (t[0]) terms.push_back(g.linear(*t[0], s.x[1]));
      if (t[1]) terms.push_back(g.linear(s.x[0], *t[1]));
      if (t.size() == 3 && t[2]) terms.push_back(*t[2]);
      return sum_terms(g, terms, ys);
    case OpKind::Conv1d:
    case OpKind::Conv2d:  // bilinear in (x, w), plus the bias
      if (t[0]) terms.push_back(g.add(n.op, {*t[0], s.x[1]}, n.attrs));
      if (t[1]) terms.push_back(g.add(n.op, {s.x[0], *t[1]}, n.attrs));
      if (t.size() == 3 && t[2]) terms.push_back(channel_column(s, *t[2]));
      return sum_terms(g, terms, ys);
    case OpKind::LayerNorm:
    case OpKind::RmsNorm:
    case OpKind::MaxPool2d:
    case OpKind::Attention:
    case OpKind::SoftmaxBackward:
    case OpKind::LogSoftmaxBackward:
    case OpKind::LayerNormBackward:
    case OpKind::RmsNormBackward: return jvp_decomposed(s, t);
    case OpKind::Custom: {
      auto ext = ir::find_op_extension(n.attrs.get_str("op"));
      if (auto rule = ext->jvp(g, s.x, t, s.y, n.attrs)) return rule;
      return jvp_decomposed(s, t);
    }
    case OpKind::Scan:
    case OpKind::If:
    case OpKind::While: return control_flow_jvp(s, t);
    default: break;
  }
  if (ir::op_def(n.op).decompose) return jvp_decomposed(s, t);  // as in vjp_rule
  // The rest are linear in their one differentiable operand.
  if (!t[0]) return std::nullopt;
  NodeId v = *t[0];
  switch (n.op) {
    case OpKind::Cast: return g.cast(v, n.dtype);
    case OpKind::Clamp: return clamp_map(s, v);
    case OpKind::ReduceSum:
    case OpKind::ReduceMean:
    case OpKind::ReduceMax:
    case OpKind::ReduceMin:
    case OpKind::ReduceProd: return reduce_jvp(s, v);
    case OpKind::Reshape:
    case OpKind::Permute:
    case OpKind::Expand:
    case OpKind::Slice:
    case OpKind::Squeeze:
    case OpKind::Unsqueeze:
    case OpKind::Flip:
    case OpKind::AvgPool2d: return same_op(s, {v});
    case OpKind::Pad: {
      ir::Attrs a = n.attrs;
      a.set("value", 0.0);  // the padding is a constant
      return g.add_declared(OpKind::Pad, {v}, std::move(a), n.dtype, ys);
    }
    case OpKind::Gather:
    case OpKind::IndexSelect:
    case OpKind::Embedding: return same_op(s, {v, s.x[1]});
    case OpKind::Softmax: return softmax_map(s, v);
    case OpKind::LogSoftmax: {
      i64 ax = ir::normalize_axis(n.attrs.get_int("axis"), ys.rank());
      return g.sub(v, g.sum(g.mul(g.exp(s.y), v), {ax}, true));
    }
    default: s.fail("no JVP rule for this op");
  }
}

}  // namespace rlx::autodiff::detail
