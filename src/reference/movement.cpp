// Movement ops. Strided ones (permute, slice, flip, expand) are one view
// gather: per output dim a source stride, plus a base offset.
#include <algorithm>

#include "reference/value.hpp"

namespace rlx::reference::detail {
namespace {

using ir::OpKind;

Value view(const Ctx& c, const Value& x, Ext out, const Ext& strides, std::int64_t base) {
  Value r(c.n.dtype, std::move(out));
  auto map = strided_map(r.ext, strides, base);
  for (std::size_t i = 0; i < r.v.size(); ++i) r.v[i] = x.v[map[i]];
  return r;
}

Value relabel(const Ctx& c, const Value& x, Ext out) {
  if (numel(out) != numel(x.ext)) c.fail("cannot reshape " + ext_str(x.ext) + " to " + ext_str(out));
  Value r = x;
  r.ext = std::move(out);
  return r;
}

std::vector<bool> axis_set(const Ctx& c, std::size_t rank) {
  std::vector<bool> s(rank, false);
  for (auto a : c.attrs().get_ints("axes")) s[std::size_t(c.axis(a, rank))] = true;
  return s;
}

Value permute(const Ctx& c, const Value& x) {
  const auto& perm = c.attrs().get_ints("perm");
  if (perm.size() != x.rank())
    c.fail("perm has " + std::to_string(perm.size()) + " entries for rank " + std::to_string(x.rank()));
  auto cs = ir::contiguous_strides(x.ext);
  Ext out(x.rank()), st(x.rank());
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

Value slice(const Ctx& c, const Value& x) {
  const auto &starts = c.attrs().get_ints("starts"), &ends = c.attrs().get_ints("ends");
  Ext steps = c.attrs().has("steps") ? c.attrs().get_ints("steps") : Ext(x.rank(), 1);
  if (starts.size() != x.rank() || ends.size() != x.rank() || steps.size() != x.rank())
    c.fail("slice needs starts/ends/steps of rank " + std::to_string(x.rank()));
  auto cs = ir::contiguous_strides(x.ext);
  Ext out(x.rank()), st(x.rank());
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

Value flip(const Ctx& c, const Value& x) {
  auto flipped = axis_set(c, x.rank());
  Ext st = ir::contiguous_strides(x.ext);
  std::int64_t base = 0;
  for (std::size_t d = 0; d < x.rank(); ++d)
    if (flipped[d] && x.ext[d] > 0) {
      base += (x.ext[d] - 1) * st[d];
      st[d] = -st[d];
    }
  return view(c, x, x.ext, st, base);
}

Value concat(const Ctx& c) {
  const Value& x0 = c.x(0);
  auto axis = std::size_t(c.axis(c.attrs().get_int("axis"), x0.rank()));
  Ext out = x0.ext;
  out[axis] = 0;
  for (auto* p : c.in) {
    Ext e = p->ext;
    if (e.size() != out.size()) c.fail("concat inputs differ in rank");
    out[axis] += e[axis];
    for (std::size_t d = 0; d < e.size(); ++d)
      if (d != axis && e[d] != out[d])
        c.fail("concat inputs " + ext_str(p->ext) + " and " + ext_str(x0.ext) + " differ");
  }
  Value r(c.n.dtype, out);
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

Value pad(const Ctx& c, const Value& x) {
  const auto& pads = c.attrs().get_ints("pads");
  std::size_t rank = x.rank();
  if (pads.size() != 2 * rank) c.fail("pads needs " + std::to_string(2 * rank) + " entries");
  Ext out(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    out[d] = x.ext[d] + pads[d] + pads[rank + d];
    if (out[d] < 0) c.fail("pads crop more than axis " + std::to_string(d) + " holds");
  }
  Value r(c.n.dtype, out);
  double value = c.attrs().float_or("value", 0.0);
  auto cs = ir::contiguous_strides(x.ext);
  for_each_index(out, [&](const Ext& idx, std::int64_t flat) {
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
std::int64_t offset_with(const Ctx& c, const Value& x, const Ext& cs, const Ext& idx, std::size_t axis,
                         std::int64_t at) {
  std::int64_t off = 0;
  for (std::size_t d = 0; d < idx.size(); ++d) {
    std::int64_t i = d == axis ? at : idx[d];
    if (i >= x.ext[d]) c.fail("index shape exceeds " + ext_str(x.ext) + " on axis " + std::to_string(d));
    off += i * cs[d];
  }
  return off;
}

Value gather(const Ctx& c, const Value& x, const Value& idx) {
  if (idx.rank() != x.rank()) c.fail("gather index must have the rank of the input");
  auto axis = std::size_t(c.axis(c.attrs().get_int("axis"), x.rank()));
  auto cs = ir::contiguous_strides(x.ext);
  Value r(c.n.dtype, idx.ext);
  for_each_index(idx.ext, [&](const Ext& i, std::int64_t flat) {
    r.v[flat] = x.v[offset_with(c, x, cs, i, axis, c.index(idx.v[flat], x.ext[axis]))];
  });
  return r;
}

Value scatter_add(const Ctx& c, const Value& x, const Value& idx, const Value& upd) {
  if (idx.rank() != x.rank() || upd.rank() != x.rank())
    c.fail("scatter_add index and updates must have the input's rank");
  auto axis = std::size_t(c.axis(c.attrs().get_int("axis"), x.rank()));
  auto cs = ir::contiguous_strides(x.ext), us = ir::contiguous_strides(upd.ext);
  Value r(c.n.dtype, x.ext);
  r.v = x.v;
  for_each_index(idx.ext, [&](const Ext& i, std::int64_t flat) {
    std::int64_t u = 0;
    for (std::size_t d = 0; d < i.size(); ++d) {
      if (i[d] >= upd.ext[d]) c.fail("index shape exceeds updates " + ext_str(upd.ext));
      u += i[d] * us[d];
    }
    r.v[offset_with(c, x, cs, i, axis, c.index(idx.v[flat], x.ext[axis]))] += upd.v[u];
  });
  return r;
}

Value index_select(const Ctx& c, const Value& x, const Value& idx) {
  auto axis = std::size_t(c.axis(c.attrs().get_int("axis"), x.rank()));
  Ext out(x.ext.begin(), x.ext.begin() + std::ptrdiff_t(axis));
  out.insert(out.end(), idx.ext.begin(), idx.ext.end());
  out.insert(out.end(), x.ext.begin() + std::ptrdiff_t(axis) + 1, x.ext.end());
  std::int64_t outer = 1, inner = 1, n = x.ext[axis], k = numel(idx.ext);
  for (std::size_t d = 0; d < axis; ++d) outer *= x.ext[d];
  for (std::size_t d = axis + 1; d < x.rank(); ++d) inner *= x.ext[d];
  Value r(c.n.dtype, out);
  for (std::int64_t j = 0; j < k; ++j) {
    std::int64_t at = c.index(idx.v[std::size_t(j)], n);
    for (std::int64_t o = 0; o < outer; ++o)
      std::copy_n(x.v.begin() + (o * n + at) * inner, inner, r.v.begin() + (o * k + j) * inner);
  }
  return r;
}

Value squeeze(const Ctx& c, const Value& x) {
  auto gone = axis_set(c, x.rank());
  Ext out;
  for (std::size_t d = 0; d < x.rank(); ++d) {
    if (gone[d] && x.ext[d] != 1)
      c.fail("cannot squeeze axis " + std::to_string(d) + " of extent " + std::to_string(x.ext[d]));
    if (!gone[d]) out.push_back(x.ext[d]);
  }
  return relabel(c, x, out);
}

Value unsqueeze(const Ctx& c, const Value& x) {
  std::size_t rank = x.rank() + c.attrs().get_ints("axes").size();
  auto added = axis_set(c, rank);
  if (std::count(added.begin(), added.end(), true) != std::ptrdiff_t(rank - x.rank())) c.fail("unsqueeze axes repeat");
  Ext out;
  for (std::size_t d = 0, src = 0; d < rank; ++d) out.push_back(added[d] ? 1 : x.ext[src++]);
  return relabel(c, x, out);
}

}  // namespace

Value eval_movement(const Ctx& c) {
  const Value& x = c.x(0);
  switch (c.n.op) {
    case OpKind::Reshape: return relabel(c, x, c.declared());
    case OpKind::Expand: {
      Ext out = c.declared();
      Value r(c.n.dtype, out);
      auto map = broadcast_map(c, x.ext, out);
      for (std::size_t i = 0; i < r.v.size(); ++i) r.v[i] = x.v[map[i]];
      return r;
    }
    case OpKind::Permute: return permute(c, x);
    case OpKind::Slice: return slice(c, x);
    case OpKind::Flip: return flip(c, x);
    case OpKind::Concat: return concat(c);
    case OpKind::Pad: return pad(c, x);
    case OpKind::Gather: return gather(c, x, c.x(1));
    case OpKind::IndexSelect: return index_select(c, x, c.x(1));
    case OpKind::ScatterAdd: return scatter_add(c, x, c.x(1), c.x(2));
    case OpKind::Squeeze: return squeeze(c, x);
    case OpKind::Unsqueeze: return unsqueeze(c, x);
    default: c.fail("not a movement op");
  }
}

}  // namespace rlx::reference::detail
