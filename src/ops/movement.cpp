// Movement: reshape, permute, slicing, joining, indexing.
#include <algorithm>
#include <limits>
#include <string>

#include "ops/family.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/limits.hpp"

namespace rlx::ops {
namespace {

using ir::Dim;
using ir::InferArgs;
using ir::Shape;
using ir::TypeInfo;

std::size_t axis_of(const InferArgs& a, std::size_t rank) {
  return static_cast<std::size_t>(ir::normalize_axis(a.attrs.get_int("axis"), rank));
}
void require_rank(const InferArgs& a) { a.require(a.inputs[0].shape.rank() > 0, "needs an input of rank >= 1"); }
const TypeInfo& same_dtype_declared(const InferArgs& a) {
  const TypeInfo& d = a.need_declared();
  a.require(d.dtype == a.inputs[0].dtype, "cannot change the dtype");
  return d;
}

TypeInfo reshape(const InferArgs& a) {
  const TypeInfo& d = same_dtype_declared(a);
  const Shape& s = a.inputs[0].shape;
  if (s.is_static() && d.shape.is_static())
    a.require(s.numel() == d.shape.numel(), "element count changes to " + d.shape.str());
  return d;
}

TypeInfo expand(const InferArgs& a) {
  const TypeInfo& d = same_dtype_declared(a);
  a.require(ir::broadcast_shapes(a.inputs[0].shape, d.shape) == d.shape, "cannot expand to " + d.shape.str());
  return d;
}

TypeInfo permute(const InferArgs& a) {
  const Shape& s = a.inputs[0].shape;
  const auto& perm = a.attrs.get_ints("perm");
  a.require(perm.size() == s.rank(),
            "perm has " + std::to_string(perm.size()) + " entries for rank " + std::to_string(s.rank()));
  std::vector<bool> seen(s.rank(), false);
  std::vector<Dim> out;
  for (auto p : perm) {
    a.require(p >= 0 && static_cast<std::size_t>(p) < s.rank() && !seen[static_cast<std::size_t>(p)],
              "perm is not a permutation");
    seen[static_cast<std::size_t>(p)] = true;
    out.push_back(s[static_cast<std::size_t>(p)]);
  }
  return {a.inputs[0].dtype, Shape(std::move(out))};
}

TypeInfo slice(const InferArgs& a) {
  const Shape& s = a.inputs[0].shape;
  const auto &st = a.attrs.get_ints("starts"), &en = a.attrs.get_ints("ends"), &sp = a.attrs.get_ints("steps");
  const std::size_t rank = s.rank();
  a.require(st.size() == rank && en.size() == rank && sp.size() == rank, "starts/ends/steps need one entry per axis");
  std::vector<Dim> out;
  for (std::size_t i = 0; i < rank; ++i) {
    a.require(sp[i] >= 1, "steps must be >= 1 (use flip for reversal)");
    if (!s[i].is_static()) {
      a.require(st[i] == 0 && en[i] == std::numeric_limits<i64>::max() && sp[i] == 1,
                "cannot slice the symbolic dim " + s[i].sym);
      out.push_back(s[i]);
      continue;
    }
    a.require(0 <= st[i] && st[i] <= en[i] && en[i] <= s[i].size, "slice [" + std::to_string(st[i]) + ":" +
                                                                      std::to_string(en[i]) +
                                                                      "] is out of range on axis " + std::to_string(i));
    const i64 span = en[i] - st[i];  // >= 0, no overflow: both are in [0, extent]
    out.emplace_back(span / sp[i] + (span % sp[i] != 0));
  }
  return {a.inputs[0].dtype, Shape(std::move(out))};
}

TypeInfo concat(const InferArgs& a) {
  require_rank(a);
  const Shape& s0 = a.inputs[0].shape;
  const std::size_t rank = s0.rank(), axis = axis_of(a, rank);
  std::vector<Dim> out = s0.dims();
  i64 total = 0;
  for (const TypeInfo& t : a.inputs) {
    a.require(t.dtype == a.inputs[0].dtype, "input dtypes differ");
    a.require(t.shape.rank() == rank, "input ranks differ");
    for (std::size_t d = 0; d < rank; ++d)
      if (d != axis) a.require(t.shape[d] == s0[d], "dims differ off the concat axis");
    a.require(t.shape[axis].is_static(), "cannot concat along a symbolic dim");
    total = ir::limits::checked_add(total, t.shape[axis].size, "the concat axis");
  }
  out[axis] = Dim(total);
  return {a.inputs[0].dtype, Shape(std::move(out))};
}

TypeInfo pad(const InferArgs& a) {
  const Shape& s = a.inputs[0].shape;
  const std::size_t rank = s.rank();
  const auto& pads = a.attrs.get_ints("pads");
  a.require(pads.size() == 2 * rank, "pads needs 2 entries per axis (befores then afters)");
  std::vector<Dim> out;
  for (std::size_t i = 0; i < rank; ++i) {
    if (pads[i] == 0 && pads[i + rank] == 0) {
      out.push_back(s[i]);
      continue;
    }
    a.require(s[i].is_static(), "cannot pad a symbolic dim");
    using ir::limits::checked_add;
    auto e = checked_add(checked_add(s[i].size, pads[i], "pad"), pads[i + rank], "pad");
    a.require(e >= 0, "padding crops axis " + std::to_string(i) + " below zero");
    out.emplace_back(e);
  }
  return {a.inputs[0].dtype, Shape(std::move(out))};
}

void require_indices(const InferArgs& a) { a.require(ir::is_integer(a.inputs[1].dtype), "indices must be integers"); }

TypeInfo gather(const InferArgs& a) {
  require_rank(a);
  require_indices(a);
  const Shape &s = a.inputs[0].shape, &si = a.inputs[1].shape;
  a.require(si.rank() == s.rank(), "indices need the input's rank");
  const std::size_t axis = axis_of(a, s.rank());
  for (std::size_t d = 0; d < s.rank(); ++d)
    if (d != axis && si[d].is_static() && s[d].is_static())
      a.require(si[d].size <= s[d].size, "indices exceed the input on axis " + std::to_string(d));
  return {a.inputs[0].dtype, si};
}

TypeInfo index_select(const InferArgs& a) {
  require_indices(a);
  const Shape& s = a.inputs[0].shape;
  const auto axis = static_cast<std::ptrdiff_t>(axis_of(a, s.rank()));
  a.require(s.rank() > 0, "needs rank >= 1");
  std::vector<Dim> out(s.dims().begin(), s.dims().begin() + axis);
  for (const auto& d : a.inputs[1].shape.dims()) out.push_back(d);
  out.insert(out.end(), s.dims().begin() + axis + 1, s.dims().end());
  return {a.inputs[0].dtype, Shape(std::move(out))};
}

TypeInfo scatter_add(const InferArgs& a) {
  require_rank(a);
  require_indices(a);
  const TypeInfo &x = a.inputs[0], &idx = a.inputs[1], &upd = a.inputs[2];
  a.require(idx.shape == upd.shape, "indices and updates shapes differ");
  a.require(upd.dtype == x.dtype, "updates dtype differs");
  a.require(idx.shape.rank() == x.shape.rank(), "indices need the input's rank");
  axis_of(a, x.shape.rank());
  return x;
}

TypeInfo dynamic_update_slice(const InferArgs& a) {
  require_rank(a);
  const TypeInfo &x = a.inputs[0], &u = a.inputs[1], &start = a.inputs[2];
  a.require(u.dtype == x.dtype,
            "update is " + std::string(ir::dtype_name(u.dtype)) + ", x is " + std::string(ir::dtype_name(x.dtype)));
  a.require(u.shape.rank() == x.shape.rank(), "update " + u.shape.str() + " needs x's rank (" + x.shape.str() + ")");
  const std::size_t axis = axis_of(a, x.shape.rank());
  for (std::size_t d = 0; d < x.shape.rank(); ++d) {
    const Dim &ud = u.shape[d], &xd = x.shape[d];
    if (d != axis)
      a.require(ud == xd,
                "update " + u.shape.str() + " and x " + x.shape.str() + " differ on axis " + std::to_string(d));
    else if (ud.is_static() && xd.is_static())
      a.require(ud.size <= xd.size, "update " + u.shape.str() + " is longer than x " + x.shape.str() + " on the axis");
  }
  a.require(ir::is_integer(start.dtype), "start must be an integer, got " + std::string(ir::dtype_name(start.dtype)));
  a.require(start.shape.is_static() && ir::estimated_numel(start.shape) == 1,
            "start must hold one index ([] or [1]), got " + start.shape.str());
  return x;
}

TypeInfo squeeze(const InferArgs& a) {
  require_rank(a);
  const Shape& s = a.inputs[0].shape;
  std::vector<bool> drop(s.rank(), false);
  for (auto ax : a.attrs.get_ints("axes")) {
    auto i = static_cast<std::size_t>(ir::normalize_axis(ax, s.rank()));
    a.require(s[i].is_static() && s[i].size == 1,
              "axis " + std::to_string(ax) + " has extent " + s[i].str() + ", not 1");
    drop[i] = true;
  }
  std::vector<Dim> out;
  for (std::size_t i = 0; i < s.rank(); ++i)
    if (!drop[i]) out.push_back(s[i]);
  return {a.inputs[0].dtype, Shape(std::move(out))};
}

TypeInfo unsqueeze(const InferArgs& a) {
  const Shape& s = a.inputs[0].shape;
  const auto& axes = a.attrs.get_ints("axes");
  const std::size_t out_rank = s.rank() + axes.size();
  std::vector<bool> add(out_rank, false);
  for (auto ax : axes) {
    auto i = static_cast<std::size_t>(ir::normalize_axis(ax, out_rank));
    a.require(!add[i], "axis repeated");
    add[i] = true;
  }
  std::vector<Dim> out;
  std::size_t j = 0;
  for (std::size_t i = 0; i < out_rank; ++i) out.push_back(add[i] ? Dim(1) : s[j++]);
  return {a.inputs[0].dtype, Shape(std::move(out))};
}

TypeInfo flip(const InferArgs& a) {
  require_rank(a);
  for (auto ax : a.attrs.get_ints("axes")) ir::normalize_axis(ax, a.inputs[0].shape.rank());
  return a.inputs[0];
}

// ---- float64 references: strided ops (permute, slice, flip, expand) are one
// view gather, per result dim a source stride, plus a base offset.
namespace ref {

F64Value view(const ReferenceArgs& c, const F64Value& x, Extents out, const Extents& strides, std::int64_t base) {
  F64Value r(c.n.dtype, std::move(out));
  auto map = strided_map(r.ext, strides, base);
  for (std::size_t i = 0; i < r.v.size(); ++i) r.v[i] = x.v[map[i]];
  return r;
}

F64Value relabel(const ReferenceArgs& c, const F64Value& x, Extents out) {
  if (numel(out) != numel(x.ext)) c.fail("cannot reshape " + extents_str(x.ext) + " to " + extents_str(out));
  F64Value r = x;
  r.ext = std::move(out);
  return r;
}

std::vector<bool> axis_set(const ReferenceArgs& c, std::size_t rank) {
  std::vector<bool> s(rank, false);
  for (auto a : c.attrs().get_ints("axes")) s[std::size_t(c.axis(a, rank))] = true;
  return s;
}

F64Value permute(const ReferenceArgs& c, const F64Value& x) {
  const auto& perm = c.attrs().get_ints("perm");
  if (perm.size() != x.rank())
    c.fail("perm has " + std::to_string(perm.size()) + " entries for rank " + std::to_string(x.rank()));
  auto cs = ir::contiguous_strides(x.ext);
  Extents out(x.rank()), st(x.rank());
  std::vector<bool> seen(x.rank(), false);
  for (std::size_t i = 0; i < perm.size(); ++i) {
    auto p = std::size_t(c.axis(perm[i], x.rank()));
    if (seen[p]) c.fail("perm repeats axis " + std::to_string(p));
    seen[p] = true;
    out[i] = x.ext[p];
    st[i] = cs[p];
  }
  return view(c, x, out, st, 0);
}

F64Value slice(const ReferenceArgs& c, const F64Value& x) {
  const auto &starts = c.attrs().get_ints("starts"), &ends = c.attrs().get_ints("ends");
  Extents steps = c.attrs().has("steps") ? c.attrs().get_ints("steps") : Extents(x.rank(), 1);
  if (starts.size() != x.rank() || ends.size() != x.rank() || steps.size() != x.rank())
    c.fail("slice needs starts/ends/steps of rank " + std::to_string(x.rank()));
  auto cs = ir::contiguous_strides(x.ext);
  Extents out(x.rank()), st(x.rank());
  std::int64_t base = 0;
  for (std::size_t d = 0; d < x.rank(); ++d) {
    if (steps[d] < 1) c.fail("slice step must be >= 1");
    // Python clamping, an identity on the builder's normalized values.
    std::int64_t n = x.ext[d];
    auto clampi = [n](std::int64_t i) { return std::clamp(i < 0 ? i + n : i, std::int64_t(0), n); };
    std::int64_t s = clampi(starts[d]), e = clampi(ends[d]);
    out[d] = e > s ? (e - s + steps[d] - 1) / steps[d] : 0;
    st[d] = cs[d] * steps[d];
    base += s * cs[d];
  }
  return view(c, x, out, st, base);
}

F64Value flip(const ReferenceArgs& c, const F64Value& x) {
  auto flipped = axis_set(c, x.rank());
  Extents st = ir::contiguous_strides(x.ext);
  std::int64_t base = 0;
  for (std::size_t d = 0; d < x.rank(); ++d)
    if (flipped[d] && x.ext[d] > 0) {
      base += (x.ext[d] - 1) * st[d];
      st[d] = -st[d];
    }
  return view(c, x, x.ext, st, base);
}

F64Value concat(const ReferenceArgs& c) {
  const F64Value& x0 = c.x(0);
  auto axis = std::size_t(c.axis(c.attrs().get_int("axis"), x0.rank()));
  Extents out = x0.ext;
  out[axis] = 0;
  for (auto* p : c.in) {
    Extents e = p->ext;
    if (e.size() != out.size()) c.fail("concat inputs differ in rank");
    out[axis] += e[axis];
    for (std::size_t d = 0; d < e.size(); ++d)
      if (d != axis && e[d] != out[d])
        c.fail("concat inputs " + extents_str(p->ext) + " and " + extents_str(x0.ext) + " differ");
  }
  F64Value r(c.n.dtype, out);
  std::int64_t outer = 1, inner = 1;
  for (std::size_t d = 0; d < axis; ++d) outer *= out[d];
  for (std::size_t d = axis + 1; d < out.size(); ++d) inner *= out[d];
  std::int64_t row = out[axis] * inner, at = 0;
  for (auto* p : c.in) {
    std::int64_t chunk = p->ext[axis] * inner;
    for (std::int64_t o = 0; o < outer; ++o) std::copy_n(p->v.begin() + o * chunk, chunk, r.v.begin() + o * row + at);
    at += chunk;
  }
  return r;
}

F64Value pad(const ReferenceArgs& c, const F64Value& x) {
  const auto& pads = c.attrs().get_ints("pads");
  std::size_t rank = x.rank();
  if (pads.size() != 2 * rank) c.fail("pads needs " + std::to_string(2 * rank) + " entries");
  Extents out(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    out[d] = x.ext[d] + pads[d] + pads[rank + d];
    if (out[d] < 0) c.fail("pads crop more than axis " + std::to_string(d) + " holds");
  }
  F64Value r(c.n.dtype, out);
  double value = c.attrs().float_or("value", 0.0);
  auto cs = ir::contiguous_strides(x.ext);
  for_each_index(out, [&](const Extents& idx, std::int64_t flat) {
    std::int64_t src = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      std::int64_t i = idx[d] - pads[d];
      if (i < 0 || i >= x.ext[d]) {
        r.v[flat] = value;
        return;
      }
      src += i * cs[d];
    }
    r.v[flat] = x.v[src];
  });
  return r;
}

// Offset into `x` of index `idx` with the `axis` coordinate replaced by
// `at`; the other coordinates come from an index tensor and may exceed x.
std::int64_t offset_with(const ReferenceArgs& c, const F64Value& x, const Extents& cs, const Extents& idx,
                         std::size_t axis, std::int64_t at) {
  std::int64_t off = 0;
  for (std::size_t d = 0; d < idx.size(); ++d) {
    std::int64_t i = d == axis ? at : idx[d];
    if (i >= x.ext[d]) c.fail("index shape exceeds " + extents_str(x.ext) + " on axis " + std::to_string(d));
    off += i * cs[d];
  }
  return off;
}

F64Value gather(const ReferenceArgs& c, const F64Value& x, const F64Value& idx) {
  if (idx.rank() != x.rank()) c.fail("gather index must have the rank of the input");
  auto axis = std::size_t(c.axis(c.attrs().get_int("axis"), x.rank()));
  auto cs = ir::contiguous_strides(x.ext);
  F64Value r(c.n.dtype, idx.ext);
  for_each_index(idx.ext, [&](const Extents& i, std::int64_t flat) {
    r.v[flat] = x.v[offset_with(c, x, cs, i, axis, c.index(idx.v[flat], x.ext[axis]))];
  });
  return r;
}

F64Value scatter_add(const ReferenceArgs& c, const F64Value& x, const F64Value& idx, const F64Value& upd) {
  if (idx.rank() != x.rank() || upd.rank() != x.rank())
    c.fail("scatter_add index and updates must have the input's rank");
  auto axis = std::size_t(c.axis(c.attrs().get_int("axis"), x.rank()));
  auto cs = ir::contiguous_strides(x.ext), us = ir::contiguous_strides(upd.ext);
  F64Value r(c.n.dtype, x.ext);
  r.v = x.v;
  for_each_index(idx.ext, [&](const Extents& i, std::int64_t flat) {
    std::int64_t u = 0;
    for (std::size_t d = 0; d < i.size(); ++d) {
      if (i[d] >= upd.ext[d]) c.fail("index shape exceeds updates " + extents_str(upd.ext));
      u += i[d] * us[d];
    }
    r.v[offset_with(c, x, cs, i, axis, c.index(idx.v[flat], x.ext[axis]))] += upd.v[u];
  });
  return r;
}

F64Value index_select(const ReferenceArgs& c, const F64Value& x, const F64Value& idx) {
  auto axis = std::size_t(c.axis(c.attrs().get_int("axis"), x.rank()));
  Extents out(x.ext.begin(), x.ext.begin() + std::ptrdiff_t(axis));
  out.insert(out.end(), idx.ext.begin(), idx.ext.end());
  out.insert(out.end(), x.ext.begin() + std::ptrdiff_t(axis) + 1, x.ext.end());
  std::int64_t outer = 1, inner = 1, n = x.ext[axis], k = numel(idx.ext);
  for (std::size_t d = 0; d < axis; ++d) outer *= x.ext[d];
  for (std::size_t d = axis + 1; d < x.rank(); ++d) inner *= x.ext[d];
  F64Value r(c.n.dtype, out);
  for (std::int64_t j = 0; j < k; ++j) {
    std::int64_t at = c.index(idx.v[std::size_t(j)], n);
    for (std::int64_t o = 0; o < outer; ++o)
      std::copy_n(x.v.begin() + (o * n + at) * inner, inner, r.v.begin() + (o * k + j) * inner);
  }
  return r;
}

F64Value squeeze(const ReferenceArgs& c, const F64Value& x) {
  auto gone = axis_set(c, x.rank());
  Extents out;
  for (std::size_t d = 0; d < x.rank(); ++d) {
    if (gone[d] && x.ext[d] != 1)
      c.fail("cannot squeeze axis " + std::to_string(d) + " of extent " + std::to_string(x.ext[d]));
    if (!gone[d]) out.push_back(x.ext[d]);
  }
  return relabel(c, x, out);
}

F64Value unsqueeze(const ReferenceArgs& c, const F64Value& x) {
  std::size_t rank = x.rank() + c.attrs().get_ints("axes").size();
  auto added = axis_set(c, rank);
  if (std::count(added.begin(), added.end(), true) != std::ptrdiff_t(rank - x.rank())) c.fail("unsqueeze axes repeat");
  Extents out;
  for (std::size_t d = 0, src = 0; d < rank; ++d) out.push_back(added[d] ? 1 : x.ext[src++]);
  return relabel(c, x, out);
}

F64Value expand(const ReferenceArgs& c, const F64Value& x) {
  F64Value r = c.result(c.declared());
  auto map = ir::broadcast_map(c, x.ext, r.ext);
  for (std::size_t i = 0; i < r.v.size(); ++i) r.v[i] = x.v[map[i]];
  return r;
}

// start clamped to [0, X - U], as XLA.
F64Value dynamic_update_slice(const ReferenceArgs& c, const F64Value& x, const F64Value& u, const F64Value& start) {
  const auto axis = std::size_t(c.axis(c.attrs().get_int("axis"), x.rank()));
  const std::int64_t hi = x.ext[axis] - u.ext[axis];
  const auto s = std::int64_t(std::clamp(start.v.at(0), 0.0, double(std::max<std::int64_t>(hi, 0))));
  const auto cs = ir::contiguous_strides(x.ext);
  F64Value r(c.n.dtype, x.ext);
  r.v = x.v;
  for_each_index(u.ext, [&](const Extents& i, std::int64_t flat) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < i.size(); ++d) off += (d == axis ? i[d] + s : i[d]) * cs[d];
    r.v[std::size_t(off)] = u.v[std::size_t(flat)];
  });
  return r;
}

}  // namespace ref

// In primitives: each position along the axis takes the update's row (gathered at position - start) inside
// [start, start + U), else x's.
NodeId dynamic_update_slice_decompose(const ir::DecomposeArgs& a) {
  ir::Graph& g = a.g;
  const Shape xs = g.node(a.in[0]).shape, us = g.node(a.in[1]).shape;
  const auto axis = std::size_t(a.attrs().get_int("axis"));
  if (!xs[axis].is_static() || !us[axis].is_static())
    throw Error("dynamic_update_slice: the decomposition needs a static extent on the axis, got x " + xs.str() +
                " and update " + us.str());
  const std::int64_t X = xs[axis].size, U = us[axis].size;
  if (U == 0) return a.in[0];
  const ir::DType i64 = ir::DType::I64;
  NodeId start = g.clamp(g.cast(g.reshape(a.in[2], Shape(std::vector<Dim>{})), i64), 0, double(X - U));
  std::vector<Dim> column(xs.rank(), Dim(1));
  column[axis] = Dim(X);
  NodeId rel = g.sub(g.iota(Shape(column), std::int64_t(axis), i64), start);
  NodeId inside = g.binary(OpKind::And, g.binary(OpKind::Ge, rel, g.scalar(0, i64)),
                           g.binary(OpKind::Lt, rel, g.scalar(double(U), i64)));
  NodeId rows = g.gather(a.in[1], g.expand(g.clamp(rel, 0, double(U - 1)), xs), std::int64_t(axis));
  return g.where(inside, rows, a.in[0]);
}

// ---- derivatives: every movement op is linear in its data operand ----
namespace grad {

using ir::Graph;
using Vjp = std::function<std::vector<Tangent>(const DerivativeArgs&, NodeId, const std::vector<bool>&)>;
using Jvp = std::function<Tangent(const DerivativeArgs&, std::span<const Tangent>)>;

const Shape& shape(const DerivativeArgs& s, std::size_t k) { return s.in(k).shape; }
i64 axis(const DerivativeArgs& s) { return ir::normalize_axis(s.n.attrs.get_int("axis"), shape(s, 0).rank()); }

// A VJP for an op with one differentiable operand (the first).
template <class F>
Vjp first(F f) {
  return [f](const DerivativeArgs& s, NodeId ct, const std::vector<bool>& want) {
    std::vector<Tangent> d(s.n.inputs.size());
    if (want[0]) d[0] = f(s, ct);
    return d;
  };
}
// The JVP of an op linear in its first operand, the others kept: the op itself.
Tangent same(const DerivativeArgs& s, std::span<const Tangent> t) {
  if (!t[0]) return std::nullopt;
  std::vector<NodeId> ins{*t[0]};
  ins.insert(ins.end(), s.x.begin() + 1, s.x.end());
  return same_op(s, std::move(ins));
}

// The transpose of slice: zeros between strided elements, zeros around.
NodeId slice_vjp(const DerivativeArgs& s, NodeId ct) {
  Graph& g = s.g;
  const Shape &xs = shape(s, 0), &ys = s.n.shape;
  const auto &starts = s.n.attrs.get_ints("starts"), &steps = s.n.attrs.get_ints("steps");
  const std::size_t rank = xs.rank();
  for (std::size_t d = 0; d < rank; ++d)
    if (ys[d].is_static() && ys[d].size == 0) return zeros(g, s.n.dtype, xs);
  std::vector<i64> pads(2 * rank, 0);
  for (std::size_t d = 0; d < rank; ++d) {
    if (!xs[d].is_static()) continue;  // a symbolic dim is always taken whole
    i64 m = ys[d].size, span = m;
    if (steps[d] > 1 && m > 1) {
      // [.., m, ..] -> [.., m, step, ..] padded with zeros -> [.., m*step, ..], cut after the last element.
      std::vector<i64> p(2 * (rank + 1), 0);
      p[rank + 1 + d + 1] = steps[d] - 1;
      NodeId v = g.pad(g.unsqueeze(ct, {i64(d) + 1}), p);
      Shape flat = g.node(ct).shape;
      flat[d] = ir::Dim(m * steps[d]);
      span = (m - 1) * steps[d] + 1;
      ct = g.narrow(g.reshape(v, flat), i64(d), 0, span);
    }
    pads[d] = starts[d];
    pads[rank + d] = xs[d].size - starts[d] - span;
  }
  return std::all_of(pads.begin(), pads.end(), [](i64 p) { return p == 0; }) ? ct : g.pad(ct, pads);
}

// The transpose of pad: crop what was added; where pad cropped, zeros.
NodeId pad_vjp(const DerivativeArgs& s, NodeId ct) {
  Graph& g = s.g;
  std::vector<i64> pads = s.n.attrs.get_ints("pads");
  const Shape& xs = shape(s, 0);
  if (std::any_of(pads.begin(), pads.end(), [](i64 p) { return p < 0; })) {
    for (auto& p : pads) p = -p;
    return g.pad(ct, pads);
  }
  std::vector<i64> axes, starts, ends;
  for (std::size_t d = 0; d < xs.rank(); ++d) {
    if (pads[d] == 0 && pads[xs.rank() + d] == 0) continue;
    axes.push_back(i64(d));
    starts.push_back(pads[d]);
    ends.push_back(pads[d] + xs[d].size);
  }
  return g.slice(ct, axes, starts, ends);
}

// The padding is a constant: its tangent is zero.
Tangent pad_jvp(const DerivativeArgs& s, std::span<const Tangent> t) {
  if (!t[0]) return std::nullopt;
  ir::Attrs a = s.n.attrs;
  a.set("value", 0.0);
  return s.g.add_declared(OpKind::Pad, {*t[0]}, std::move(a), s.n.dtype, s.n.shape);
}

// The transpose of index_select along its axis: every selected slice is added
// back at its index (scatter_add over the flattened index).
NodeId index_select_vjp(const DerivativeArgs& s, NodeId ct) {
  Graph& g = s.g;
  const Shape& xs = shape(s, 0);
  const i64 ax = axis(s);
  i64 count = 1;
  for (const auto& d : shape(s, 1).dims()) count *= static_extent(s, d, "index shape");
  Shape flat = xs, column(std::vector<ir::Dim>(xs.rank(), ir::Dim(1)));
  flat[std::size_t(ax)] = column[std::size_t(ax)] = ir::Dim(count);
  NodeId where_to = g.expand(g.reshape(s.x[1], column), flat);
  return g.scatter_add(zeros(g, s.n.dtype, xs), where_to, g.reshape(ct, flat), ax);
}

std::vector<Tangent> concat_vjp(const DerivativeArgs& s, NodeId ct, const std::vector<bool>& want) {
  std::vector<Tangent> d(s.n.inputs.size());
  const i64 ax = axis(s);
  i64 at = 0;
  for (std::size_t k = 0; k < s.n.inputs.size(); ++k) {
    const i64 size = static_extent(s, shape(s, k)[std::size_t(ax)], "concat dim");
    if (want[k]) d[k] = s.g.slice(ct, {ax}, {at}, {at + size});
    at += size;
  }
  return d;
}

Tangent concat_jvp(const DerivativeArgs& s, std::span<const Tangent> t) {
  std::vector<NodeId> parts;
  for (std::size_t k = 0; k < t.size(); ++k) parts.push_back(t[k] ? *t[k] : zeros(s.g, s.in(k).dtype, shape(s, k)));
  return same_op(s, std::move(parts));
}

std::vector<Tangent> scatter_add_vjp(const DerivativeArgs& s, NodeId ct, const std::vector<bool>& want) {
  std::vector<Tangent> d(3);
  if (want[0]) d[0] = ct;
  if (want[2]) d[2] = s.g.gather(ct, s.x[1], axis(s));
  return d;
}

Tangent scatter_add_jvp(const DerivativeArgs& s, std::span<const Tangent> t) {
  if (!t[2]) return t[0];
  return same_op(s, {t[0] ? *t[0] : zeros(s.g, s.n.dtype, shape(s, 0)), s.x[1], *t[2]});
}

}  // namespace grad

// ---- batching: the batch axis is one more leading axis ----
namespace batch {

using ir::shifted_axes;
using ir::with_attr;

BatchedValue shift_axes(const BatchArgs& a, std::size_t rank) {
  return BatchArgs::out(
      a.g.add(a.n.op, {a.x[0].id}, with_attr(a.n, "axes", shifted_axes(a.n.attrs.get_ints("axes"), rank))));
}

BatchedValue permute(const BatchArgs& a) {
  std::vector<i64> perm{0};
  for (auto p : shifted_axes(a.n.attrs.get_ints("perm"), a.rank(0))) perm.push_back(p);
  return BatchArgs::out(a.g.add(OpKind::Permute, {a.x[0].id}, with_attr(a.n, "perm", perm)));
}

BatchedValue slice(const BatchArgs& a) {
  auto starts = a.n.attrs.get_ints("starts"), ends = a.n.attrs.get_ints("ends"), steps = a.n.attrs.get_ints("steps");
  starts.insert(starts.begin(), 0);
  ends.insert(ends.begin(), a.size.is_static() ? a.size.size : std::numeric_limits<i64>::max());
  steps.insert(steps.begin(), 1);
  ir::Attrs attrs = a.n.attrs;
  attrs.set("starts", starts);
  attrs.set("ends", ends);
  attrs.set("steps", steps);
  return BatchArgs::out(a.g.add(OpKind::Slice, {a.x[0].id}, std::move(attrs)));
}

BatchedValue pad(const BatchArgs& a) {
  auto pads = a.n.attrs.get_ints("pads");
  pads.insert(pads.begin() + i64(a.rank(0)), 0);
  pads.insert(pads.begin(), 0);
  return BatchArgs::out(a.g.add(OpKind::Pad, {a.x[0].id}, with_attr(a.n, "pads", pads)));
}

// Every operand lifted, the axis past the batch axis.
BatchedValue lifted_along_axis(const BatchArgs& a) {
  std::vector<NodeId> ins;
  for (std::size_t k = 0; k < a.x.size(); ++k) ins.push_back(a.lifted(k));
  return BatchArgs::out(a.g.add(a.n.op, std::move(ins), with_attr(a.n, "axis", a.axis1(0))));
}

BatchedValue index_select(const BatchArgs& a) {
  ir::Graph& g = a.g;
  const Shape &xs = a.shape(0), &is = a.shape(1);
  const i64 axis = ir::normalize_axis(a.n.attrs.get_int("axis"), xs.rank());
  auto perm_to_front = [&](std::size_t at, std::size_t rank) {  // moves dim `at` to 0
    std::vector<i64> p{i64(at)};
    for (std::size_t d = 0; d < rank; ++d)
      if (d != at) p.push_back(i64(d));
    return p;
  };
  const auto& x = a.x;
  if (!x[1].batched)
    return BatchArgs::out(g.add(OpKind::IndexSelect, {x[0].id, x[1].id}, with_attr(a.n, "axis", axis + 1)));
  if (!x[0].batched) {  // the batch axis of the indices lands at `axis`
    NodeId r = g.add(OpKind::IndexSelect, {x[0].id, x[1].id}, a.n.attrs);
    return BatchArgs::out(g.permute(r, perm_to_front(std::size_t(axis), a.n.shape.rank() + 1)));
  }
  // Both batched: example b's rows are rows [b n, (b + 1) n) of the table
  // with the batch and the indexed dim merged.
  const i64 B = a.static_size("index_select with batched table and indices");
  if (!xs[std::size_t(axis)].is_static()) throw Error("vmap: index_select over a symbolic dim");
  const i64 len = xs[std::size_t(axis)].size;
  std::vector<i64> perm{0, axis + 1};
  for (i64 d = 0; d < i64(xs.rank()); ++d)
    if (d != axis) perm.push_back(d + 1);
  NodeId t = g.permute(x[0].id, perm);
  std::vector<Dim> flat{Dim(B * len)};
  for (i64 d = 0; d < i64(xs.rank()); ++d)
    if (d != axis) flat.push_back(xs[std::size_t(d)]);
  t = g.reshape(t, Shape(flat));
  const ir::DType it = g.node(x[1].id).dtype;
  NodeId zero = g.scalar(0, it), extent = g.scalar(double(len), it);
  NodeId idx = g.where(g.binary(OpKind::Lt, x[1].id, zero), g.add(x[1].id, extent), x[1].id);
  std::vector<Dim> col(is.rank() + 1, Dim(1));
  col[0] = Dim(B);
  NodeId offsets = g.mul(g.iota(Shape(col), 0, it), extent);
  NodeId r = g.add(OpKind::IndexSelect, {t, g.add(idx, offsets)}, with_attr(a.n, "axis", i64(0)));
  // r: [B, idx..., x[:axis], x[axis+1:]] -> [B, x[:axis], idx..., x[axis+1:]]
  const i64 ni = i64(is.rank());
  std::vector<i64> back{0};
  for (i64 d = 0; d < axis; ++d) back.push_back(1 + ni + d);
  for (i64 d = 0; d < ni; ++d) back.push_back(1 + d);
  for (i64 d = axis + 1; d < i64(xs.rank()); ++d) back.push_back(ni + d);
  return BatchArgs::out(g.permute(r, back));
}

}  // namespace batch

}  // namespace
}  // namespace rlx::ops

RLX_OP_FAMILY(movement) {
  using namespace rlx::ops;
  using rlx::ir::define_op;
  const std::vector<AttrSpec> axis{{"axis", T::Int, true}}, axes{{"axes", T::Ints, true}};
  define_op({.kind = OpKind::Reshape,
             .doc = "the declared shape, same element count",
             .operands = {"x"},
             .storage_operands = {0},
             .storage = rlx::ir::StorageKind::Element,
             .infer = reshape,
             .reference = [](const ReferenceArgs& c) { return ref::relabel(c, c.x(0), c.declared()); },
             .vjp = grad::first([](const DerivativeArgs& s, NodeId ct) { return s.g.reshape(ct, grad::shape(s, 0)); }),
             .jvp = grad::same,
             .vmap = [](const BatchArgs& a) { return a.declared(OpKind::Reshape, {a.x[0].id}, a.n.attrs); },
             .flops_per_element = 0});
  define_op({.kind = OpKind::Permute,
             .doc = "axes reordered by `perm`",
             .operands = {"x"},
             .storage_operands = {0},
             .storage = rlx::ir::StorageKind::Element,
             .attrs = {{"perm", T::Ints, true}},
             .infer = permute,
             .reference = [](const ReferenceArgs& c) { return ref::permute(c, c.x(0)); },
             .vjp = grad::first([](const DerivativeArgs& s, NodeId ct) {
               return s.g.permute(ct, inverse_permutation(s.n.attrs.get_ints("perm")));
             }),
             .jvp = grad::same,
             .vmap = batch::permute,
             .flops_per_element = 0});
  define_op(
      {.kind = OpKind::Expand,
       .doc = "broadcast to the declared shape",
       .operands = {"x"},
       .storage_operands = {0},
       .storage = rlx::ir::StorageKind::Element,
       .infer = expand,
       .reference = [](const ReferenceArgs& c) { return ref::expand(c, c.x(0)); },
       .vjp = grad::first([](const DerivativeArgs& s, NodeId ct) { return unbroadcast(s.g, ct, grad::shape(s, 0)); }),
       .jvp = grad::same,
       .vmap =
           [](const BatchArgs& a) {
             return a.declared(OpKind::Expand, {rlx::ir::align(a.g, a.x[0].id, a.rank(0), a.n.shape.rank())},
                               a.n.attrs);
           },
       .flops_per_element = 0});
  define_op({.kind = OpKind::Slice,
             .doc = "x[starts:ends:steps] per axis (full rank, steps >= 1, clamped like Python)",
             .operands = {"x"},
             .storage_operands = {0},
             .storage = rlx::ir::StorageKind::Element,
             .attrs = {{"starts", T::Ints, true}, {"ends", T::Ints, true}, {"steps", T::Ints, true}},
             .infer = slice,
             .reference = [](const ReferenceArgs& c) { return ref::slice(c, c.x(0)); },
             .vjp = grad::first(grad::slice_vjp),
             .jvp = grad::same,
             .vmap = batch::slice,
             .flops_per_element = 0});
  define_op({.kind = OpKind::Concat,
             .doc = "joined along `axis`",
             .operands = {"xs..."},
             .storage_operands = {rlx::ir::kAnyOperand},
             .storage = rlx::ir::StorageKind::Element,
             .attrs = axis,
             .infer = concat,
             .reference = ref::concat,
             .vjp = grad::concat_vjp,
             .jvp = grad::concat_jvp,
             .vmap = batch::lifted_along_axis,
             .flops_per_element = 0});
  define_op({.kind = OpKind::Pad,
             .doc = "padded by pads=[before..., after...] with `value`",
             .operands = {"x"},
             .attrs = {{"pads", T::Ints, true}, {"value", T::Float, true}},
             .infer = pad,
             .reference = [](const ReferenceArgs& c) { return ref::pad(c, c.x(0)); },
             .vjp = grad::first(grad::pad_vjp),
             .jvp = grad::pad_jvp,
             .vmap = batch::pad,
             .flops_per_element = 0});
  define_op({.kind = OpKind::Gather,
             .doc = "torch.gather: idx has x's rank, the result idx's shape",
             .operands = {"x", "idx"},
             .storage_operands = {0},
             .storage = rlx::ir::StorageKind::Element,
             .selector_operands = {1},
             .attrs = axis,
             .infer = gather,
             .reference = [](const ReferenceArgs& c) { return ref::gather(c, c.x(0), c.x(1)); },
             .vjp = grad::first([](const DerivativeArgs& s, NodeId ct) {
               return s.g.scatter_add(zeros(s.g, s.n.dtype, grad::shape(s, 0)), s.x[1], ct, grad::axis(s));
             }),
             .jvp = grad::same,
             .vmap = batch::lifted_along_axis,
             .flops_per_element = 0});
  define_op({.kind = OpKind::IndexSelect,
             .doc = "numpy.take: x[:axis] + idx.shape + x[axis+1:]",
             .operands = {"x", "idx"},
             .storage_operands = {0},
             .storage = rlx::ir::StorageKind::Element,
             .selector_operands = {1},
             .attrs = axis,
             .infer = index_select,
             .reference = [](const ReferenceArgs& c) { return ref::index_select(c, c.x(0), c.x(1)); },
             .vjp = grad::first(grad::index_select_vjp),
             .jvp = grad::same,
             .vmap = batch::index_select,
             .flops_per_element = 0});
  define_op({.kind = OpKind::ScatterAdd,
             .doc = "torch.scatter_add",
             .operands = {"x", "idx", "updates"},
             .selector_operands = {1},
             .attrs = axis,
             .infer = scatter_add,
             .reference = [](const ReferenceArgs& c) { return ref::scatter_add(c, c.x(0), c.x(1), c.x(2)); },
             .vjp = grad::scatter_add_vjp,
             .jvp = grad::scatter_add_jvp,
             .vmap = batch::lifted_along_axis});
  define_op({.kind = OpKind::DynamicUpdateSlice,
             .doc = "x with `update` written from the run-time index `start` along `axis` (XLA's; start clamped)",
             .operands = {"x", "update", "start"},
             .selector_operands = {2},
             .attrs = axis,
             .infer = dynamic_update_slice,
             .decompose = dynamic_update_slice_decompose,
             .reference = [](const ReferenceArgs& c) { return ref::dynamic_update_slice(c, c.x(0), c.x(1), c.x(2)); },
             .flops_per_element = 0});
  define_op({.kind = OpKind::Squeeze,
             .doc = "drops the size-1 `axes`",
             .operands = {"x"},
             .storage_operands = {0},
             .storage = rlx::ir::StorageKind::Element,
             .attrs = axes,
             .infer = squeeze,
             .reference = [](const ReferenceArgs& c) { return ref::squeeze(c, c.x(0)); },
             .vjp = grad::first([](const DerivativeArgs& s, NodeId ct) {
               return s.g.unsqueeze(ct, normalized_axes(s.n.attrs.get_ints("axes"), grad::shape(s, 0).rank()));
             }),
             .jvp = grad::same,
             .vmap = [](const BatchArgs& a) { return batch::shift_axes(a, a.rank(0)); },
             .flops_per_element = 0});
  define_op({.kind = OpKind::Unsqueeze,
             .doc = "inserts size-1 `axes`",
             .operands = {"x"},
             .storage_operands = {0},
             .storage = rlx::ir::StorageKind::Element,
             .attrs = axes,
             .infer = unsqueeze,
             .reference = [](const ReferenceArgs& c) { return ref::unsqueeze(c, c.x(0)); },
             .vjp = grad::first([](const DerivativeArgs& s, NodeId ct) {
               return s.g.squeeze(ct, normalized_axes(s.n.attrs.get_ints("axes"), s.n.shape.rank()));
             }),
             .jvp = grad::same,
             .vmap = [](const BatchArgs& a) { return batch::shift_axes(a, a.n.shape.rank()); },
             .flops_per_element = 0});
  define_op(
      {.kind = OpKind::Flip,
       .doc = "reversed along `axes`",
       .operands = {"x"},
       .storage_operands = {0},
       .storage = rlx::ir::StorageKind::Element,
       .attrs = axes,
       .infer = flip,
       .reference = [](const ReferenceArgs& c) { return ref::flip(c, c.x(0)); },
       .vjp = grad::first([](const DerivativeArgs& s, NodeId ct) { return s.g.flip(ct, s.n.attrs.get_ints("axes")); }),
       .jvp = grad::same,
       .vmap = [](const BatchArgs& a) { return batch::shift_axes(a, a.rank(0)); },
       .flops_per_element = 0});
}
