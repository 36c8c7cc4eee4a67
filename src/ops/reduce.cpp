// Reductions over axes.
#include <algorithm>
#include <cmath>
#include <string>

#include "ops/family.hpp"

namespace rlx::ops {
namespace {

using ir::Dim;
using ir::InferArgs;
using ir::Shape;
using ir::TypeInfo;

// The input's dims with the reduced ones dropped, or kept as 1 with keepdims.
TypeInfo reduced(const InferArgs& a, const std::vector<bool>& is_reduced, ir::DType t) {
  const Shape& s = a.inputs[0].shape;
  const bool keep = a.attrs.get_bool("keepdims");
  std::vector<Dim> out;
  for (std::size_t i = 0; i < s.rank(); ++i) {
    if (!is_reduced[i])
      out.push_back(s[i]);
    else if (keep)
      out.emplace_back(1);
  }
  return {t, Shape(std::move(out))};
}

void require_not_bool(const InferArgs& a) {
  a.require(a.inputs[0].dtype != ir::DType::Bool, "does not take bool (cast first)");
}

TypeInfo reduce_axes(const InferArgs& a) {
  require_not_bool(a);
  const std::size_t rank = a.inputs[0].shape.rank();
  std::vector<bool> is_reduced(rank, false);
  for (auto ax : a.attrs.get_ints("axes")) {
    auto i = static_cast<std::size_t>(ir::normalize_axis(ax, rank));
    a.require(rank > 0 && !is_reduced[i], "axis " + std::to_string(ax) + " is repeated or invalid");
    is_reduced[i] = true;
  }
  return reduced(a, is_reduced, a.inputs[0].dtype);
}

TypeInfo reduce_mean(const InferArgs& a) {
  require_not_bool(a);
  a.require(ir::is_float(a.inputs[0].dtype), "needs a float input");
  return reduce_axes(a);
}

TypeInfo arg_reduce(const InferArgs& a) {
  require_not_bool(a);
  const std::size_t rank = a.inputs[0].shape.rank();
  std::vector<bool> is_reduced(rank, false);
  auto i = static_cast<std::size_t>(ir::normalize_axis(a.attrs.get_int("axis"), rank));
  if (rank > 0) is_reduced[i] = true;
  return reduced(a, is_reduced, ir::DType::I64);
}

// One operation per input element.
double input_elements(std::span<const TypeInfo> in, const TypeInfo&) { return ir::estimated_numel(in[0].shape); }

// ---- float64 references ----
namespace ref {

F64Value reduce(const ReferenceArgs& c) {
  const F64Value& x = c.x(0);
  std::vector<bool> reduced(x.rank(), false);
  for (auto a : c.attrs().get_ints("axes")) reduced[std::size_t(c.axis(a, x.rank()))] = true;
  bool keep = c.attrs().bool_or("keepdims", false);
  // Accumulate into the keepdims layout: reduced dims get stride 0.
  Extents kept(x.rank()), out_ext;
  for (std::size_t d = 0; d < x.rank(); ++d) {
    kept[d] = reduced[d] ? 1 : x.ext[d];
    if (keep || !reduced[d]) out_ext.push_back(kept[d]);
  }
  Extents strides = ir::contiguous_strides(kept);
  for (std::size_t d = 0; d < x.rank(); ++d)
    if (reduced[d]) strides[d] = 0;
  auto map = strided_map(x.ext, strides);

  const OpKind op = c.n.op;
  double init = op == OpKind::ReduceProd  ? 1.0
                : op == OpKind::ReduceMax ? -INFINITY
                : op == OpKind::ReduceMin ? INFINITY
                                          : 0.0;
  F64Value r(c.n.dtype, out_ext);
  std::fill(r.v.begin(), r.v.end(), init);
  for (std::size_t i = 0; i < x.v.size(); ++i) {
    double& acc = r.v[map[i]];
    double v = x.v[i];
    switch (op) {
      case OpKind::ReduceSum:
      case OpKind::ReduceMean: acc += v; break;
      case OpKind::ReduceProd: acc *= v; break;
      // NaN propagates: once the accumulator is NaN it stays NaN.
      case OpKind::ReduceMax:
        if (!std::isnan(acc) && (std::isnan(v) || v > acc)) acc = v;
        break;
      case OpKind::ReduceMin:
        if (!std::isnan(acc) && (std::isnan(v) || v < acc)) acc = v;
        break;
      default: break;
    }
  }
  if (op == OpKind::ReduceMean) {
    double count = r.v.empty() ? 0.0 : double(x.v.size()) / double(r.v.size());
    for (auto& v : r.v) v /= count;  // 0/0: the mean of nothing is NaN
  }
  return r;
}

// The first extreme wins; NaN counts as the extreme, as in NumPy.
F64Value arg_reduce(const ReferenceArgs& c) {
  const F64Value& x = c.x(0);
  if (x.rank() == 0) return F64Value(c.n.dtype, {});  // a scalar is its own extreme: index 0
  auto axis = std::size_t(c.axis(c.attrs().get_int("axis"), x.rank()));
  bool keep = c.attrs().bool_or("keepdims", false);
  std::int64_t n = x.ext[axis];
  if (n == 0) c.fail("argmax/argmin over an empty axis");
  std::int64_t outer = 1, inner = 1;
  for (std::size_t d = 0; d < axis; ++d) outer *= x.ext[d];
  for (std::size_t d = axis + 1; d < x.rank(); ++d) inner *= x.ext[d];
  Extents out_ext = x.ext;
  if (keep)
    out_ext[axis] = 1;
  else
    out_ext.erase(out_ext.begin() + std::ptrdiff_t(axis));
  bool is_max = c.n.op == OpKind::ArgMax;
  F64Value r(c.n.dtype, out_ext);
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i) {
      const double* p = x.v.data() + o * n * inner + i;
      std::int64_t best = 0;
      for (std::int64_t k = 1; k < n && !std::isnan(p[best * inner]); ++k) {
        double v = p[k * inner];
        if (std::isnan(v) || (is_max ? v > p[best * inner] : v < p[best * inner])) best = k;
      }
      r.v[std::size_t(o * inner + i)] = double(best);
    }
  return r;
}

}  // namespace ref

// ---- derivatives ----
namespace grad {

using ir::Dim;
using ir::Graph;

struct Reduction {
  std::vector<i64> axes;
  bool keep;
  Shape kept;  // the operand's shape with reduced dims 1
};

Reduction reduction(const DerivativeArgs& s) {
  const Shape& xs = s.in(0).shape;
  Reduction r{normalized_axes(s.n.attrs.get_ints("axes"), xs.rank()), s.n.attrs.get_bool("keepdims"), xs};
  for (auto a : r.axes) r.kept[std::size_t(a)] = Dim(1);
  return r;
}

// A value of the result's shape, with the reduced dims back as 1 so that it
// broadcasts against the operand.
NodeId kept(const DerivativeArgs& s, const Reduction& r, NodeId v) { return r.keep ? v : s.g.reshape(v, r.kept); }

// d y / d x for max and min: the extreme elements share the derivative.
NodeId extreme_partials(const DerivativeArgs& s, const Reduction& r) {
  Graph& g = s.g;
  NodeId mask = g.binary(OpKind::Eq, s.x[0], kept(s, r, s.y));
  NodeId count = g.sum(g.where(mask, s.constant(1), s.constant(0)), r.axes, true);
  return g.where(mask, g.div(s.constant(1), count), s.constant(0));
}

// d y / d x for prod: the product of the other elements of the group,
// without dividing (zeros stay exact, to every order). The reduced dims are
// moved last and flattened; then an exclusive prefix product times an
// exclusive suffix product, each a scan of log2(n) shifted products.
NodeId prod_partials(const DerivativeArgs& s, const Reduction& r) {
  Graph& g = s.g;
  const Shape& xs = s.in(0).shape;
  const std::size_t rank = xs.rank();
  std::vector<i64> perm;
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
  dims.emplace_back(n);
  NodeId moved = g.permute(s.x[0], perm);
  Shape moved_shape = g.node(moved).shape, rows(std::move(dims));
  const std::size_t last = rows.rank() - 1;
  auto shift = [&](NodeId v, i64 k) {  // v[i - k] along the last axis, ones shifted in
    std::vector<i64> pads(2 * rows.rank(), 0);
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

std::vector<Tangent> vjp(const DerivativeArgs& s, NodeId ct, const std::vector<bool>&) {
  Graph& g = s.g;
  const Reduction r = reduction(s);
  const Shape& xs = s.in(0).shape;
  NodeId c = kept(s, r, ct);
  switch (s.n.op) {
    case OpKind::ReduceSum: return {fit(g, c, xs)};
    case OpKind::ReduceMean: {
      i64 count = 1;
      for (auto a : r.axes) count *= static_extent(s, xs[std::size_t(a)], "reduced dim");
      return {fit(g, g.div(c, s.constant(double(count))), xs)};
    }
    case OpKind::ReduceMax:
    case OpKind::ReduceMin: return {g.mul(extreme_partials(s, r), c)};
    case OpKind::ReduceProd: return {g.mul(prod_partials(s, r), c)};
    default: s.fail("no derivative rule for this op");
  }
}

Tangent jvp(const DerivativeArgs& s, std::span<const Tangent> t) {
  if (!t[0]) return std::nullopt;
  const Reduction r = reduction(s);
  switch (s.n.op) {
    case OpKind::ReduceSum:
    case OpKind::ReduceMean: return same_op(s, {*t[0]});
    case OpKind::ReduceMax:
    case OpKind::ReduceMin: return s.g.sum(s.g.mul(extreme_partials(s, r), *t[0]), r.axes, r.keep);
    case OpKind::ReduceProd: return s.g.sum(s.g.mul(prod_partials(s, r), *t[0]), r.axes, r.keep);
    default: s.fail("no derivative rule for this op");
  }
}

}  // namespace grad

// Batched: the reduced axes move past the batch axis.
BatchedValue batch_reduce(const BatchArgs& a) {
  return BatchArgs::out(a.g.add(a.n.op, {a.x[0].id},
                                ir::with_attr(a.n, "axes", ir::shifted_axes(a.n.attrs.get_ints("axes"), a.rank(0)))));
}
BatchedValue batch_arg_reduce(const BatchArgs& a) {
  if (a.rank(0) == 0) return a.scalar_as_row();
  return BatchArgs::out(a.g.add(a.n.op, {a.x[0].id}, ir::with_attr(a.n, "axis", a.axis1(0))));
}

}  // namespace
}  // namespace rlx::ops

RLX_OP_FAMILY(reduce) {
  using namespace rlx::ops;
  auto reduce = [](OpKind k, std::string_view doc, auto infer) {
    rlx::ir::define_op({.kind = k,
                        .doc = doc,
                        .operands = {"x"},
                        .attrs = {{"axes", T::Ints, true}, {"keepdims", T::Bool, true}},
                        .infer = infer,
                        .reference = ref::reduce,
                        .vjp = grad::vjp,
                        .jvp = grad::jvp,
                        .vmap = batch_reduce,
                        .flops = input_elements});
  };
  // argmax and argmin have no derivative rules: autodiff refuses a derivative through an index.
  reduce(OpKind::ReduceSum, "sum over `axes`", reduce_axes);
  reduce(OpKind::ReduceMean, "mean over `axes`", reduce_mean);
  reduce(OpKind::ReduceMax, "maximum over `axes`", reduce_axes);
  reduce(OpKind::ReduceMin, "minimum over `axes`", reduce_axes);
  reduce(OpKind::ReduceProd, "product over `axes`", reduce_axes);
  auto arg = [](OpKind k, std::string_view doc) {
    rlx::ir::define_op({.kind = k,
                        .doc = doc,
                        .operands = {"x"},
                        .attrs = {{"axis", T::Int, true}, {"keepdims", T::Bool, true}},
                        .infer = arg_reduce,
                        .reference = ref::arg_reduce,
                        .vmap = batch_arg_reduce,
                        .flops = input_elements});
  };
  arg(OpKind::ArgMax, "index of the first maximum along `axis` (i64)");
  arg(OpKind::ArgMin, "index of the first minimum along `axis` (i64)");
}
