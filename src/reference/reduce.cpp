// reduce_{sum,mean,max,min,prod}, argmax, argmin.
#include <cmath>

#include "reference/value.hpp"

namespace rlx::reference::detail {
namespace {

using ir::OpKind;

Value reduce(const Ctx& c) {
  const Value& x = c.x(0);
  std::vector<bool> reduced(x.rank(), false);
  for (auto a : c.attrs().get_ints("axes")) reduced[std::size_t(c.axis(a, x.rank()))] = true;
  bool keep = c.attrs().bool_or("keepdims", false);
  // Accumulate into the keepdims layout: reduced dims get stride 0.
  Ext kept(x.rank()), out_ext;
  for (std::size_t d = 0; d < x.rank(); ++d) {
    kept[d] = reduced[d] ? 1 : x.ext[d];
    if (keep || !reduced[d]) out_ext.push_back(kept[d]);
  }
  Ext strides = ir::contiguous_strides(kept);
  for (std::size_t d = 0; d < x.rank(); ++d)
    if (reduced[d]) strides[d] = 0;
  auto map = strided_map(x.ext, strides);

  const OpKind op = c.n.op;
  double init = op == OpKind::ReduceProd  ? 1.0
                : op == OpKind::ReduceMax ? -INFINITY
                : op == OpKind::ReduceMin ? INFINITY
                                          : 0.0;
  Value r(c.n.dtype, out_ext);
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
Value arg_reduce(const Ctx& c) {
  const Value& x = c.x(0);
  if (x.rank() == 0) return Value(c.n.dtype, {});  // a scalar is its own extreme: index 0
  auto axis = std::size_t(c.axis(c.attrs().get_int("axis"), x.rank()));
  bool keep = c.attrs().bool_or("keepdims", false);
  std::int64_t n = x.ext[axis];
  if (n == 0) c.fail("argmax/argmin over an empty axis");
  std::int64_t outer = 1, inner = 1;
  for (std::size_t d = 0; d < axis; ++d) outer *= x.ext[d];
  for (std::size_t d = axis + 1; d < x.rank(); ++d) inner *= x.ext[d];
  Ext out_ext = x.ext;
  if (keep)
    out_ext[axis] = 1;
  else
    out_ext.erase(out_ext.begin() + std::ptrdiff_t(axis));
  bool is_max = c.n.op == OpKind::ArgMax;
  Value r(c.n.dtype, out_ext);
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

}  // namespace

Value eval_reduce(const Ctx& c) {
  return c.n.op == OpKind::ArgMax || c.n.op == OpKind::ArgMin ? arg_reduce(c) : reduce(c);
}

}  // namespace rlx::reference::detail
