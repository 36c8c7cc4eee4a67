// ONNX's shape and data-movement ops, reductions and the ops that make values (Constant, Shape, Range,
// ConstantOfShape, EyeLike...). Shape data must be known at import; with the dims bound it always is.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "onnx/detail.hpp"
#include "onnx/proto/onnx.pb.h"

namespace rlx::onnx::detail {

namespace {

using ir::OpKind;

// Normalizes axes against rank (each once).
I64s axes_of(Ctx& c, I64s axes, std::size_t rank) {
  for (auto& a : axes) a = axis_of(c, a, rank);
  auto sorted = axes;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) c.fail("an axis is repeated");
  return axes;
}

// x indexed along `axis` by integer indices, negative ones counting from the end.
NodeId take(Ctx& c, NodeId x, NodeId idx, std::int64_t axis) {
  const std::int64_t d = ext(c, x)[std::size_t(axis)];
  auto it = c.g.node(idx).dtype;
  if (it != ir::DType::I64 && it != ir::DType::I32) c.fail("indices must be int32 or int64");
  auto wrapped = c.g.where(c.g.binary(OpKind::Lt, idx, k(c, 0, idx)), c.g.add(idx, k(c, double(d), idx)), idx);
  return c.g.index_select(x, wrapped, axis);
}

// The reduction axes: the attribute before opset `input_from`, the second input from it on.
std::optional<I64s> reduce_axes(Ctx& c, std::int64_t input_from) {
  if (c.opset() < input_from) {
    if (!c.has_attr("axes")) return std::nullopt;
    return c.attr_ints("axes");
  }
  if (!c.has(1)) return std::nullopt;
  auto v = c.ints(1, "axes");
  return v;
}

// Applies one of RLX's reductions with ONNX's keepdims / noop_with_empty_axes rules; pre/post are
// elementwise steps around it (ReduceL2 = sqrt(sum(x*x)), ...).
template <class Pre, class Post>
void reduction(Table& t, const char* name, OpKind op, std::int64_t input_from, Pre pre, Post post) {
  t[name] = {[=](Ctx& c) -> Outs {
    NodeId x = c.in(0);
    const std::size_t r = c.rank(0);
    auto axes = reduce_axes(c, input_from);
    const bool keep = c.attr_int("keepdims", 1) != 0;
    if (!axes || axes->empty()) {
      if (c.attr_int("noop_with_empty_axes", 0) != 0) return {post(c, pre(c, x))};
      axes = I64s(r);
      std::iota(axes->begin(), axes->end(), 0);
    }
    auto ax = axes_of(c, *axes, r);
    if (r == 0) return {post(c, pre(c, x))};
    if (c.dtype(0) == ir::DType::Bool)  // max is any, min is all: reduce as bytes
      return {c.g.cast(c.g.reduce(op, c.g.cast(x, ir::DType::U8), ax, keep), ir::DType::Bool)};
    return {post(c, c.g.reduce(op, pre(c, x), ax, keep))};
  }};
}

auto same = [](Ctx&, NodeId x) { return x; };

NodeId arg_reduce(Ctx& c, OpKind op) {
  NodeId x = c.in(0);
  const auto axis = axis_of(c, c.attr_int("axis", 0), c.rank(0));
  const bool keep = c.attr_int("keepdims", 1) != 0;
  if (c.attr_int("select_last_index", 0) == 0) return c.g.add(op, {x}, {{"axis", axis}, {"keepdims", keep}});
  // The last of equal extremes: the first in the flipped tensor, counted from the end.
  const std::int64_t d = ext(c, x)[std::size_t(axis)];
  auto i = c.g.add(op, {c.g.flip(x, {axis})}, {{"axis", axis}, {"keepdims", keep}});
  return c.g.sub(c.g.scalar(double(d - 1), ir::DType::I64), i);
}

ir::Tensor i64_tensor(const I64s& v, I64s shape) {
  ir::Tensor t(ir::DType::I64, std::move(shape));
  std::copy(v.begin(), v.end(), t.data_as<std::int64_t>());
  return t;
}

NodeId reshape_to(Ctx& c, NodeId x, const I64s& shape) { return c.g.reshape(x, ir::Shape(shape)); }

NodeId slice_onnx(Ctx& c, NodeId x, const I64s& starts, const I64s& ends, I64s axes, I64s steps) {
  const auto sh = ext(c, x);
  const std::size_t r = sh.size();
  if (axes.empty()) {
    axes.resize(starts.size());
    std::iota(axes.begin(), axes.end(), 0);
  }
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    c.fail("starts, ends, axes and steps differ in length");
  axes = axes_of(c, axes, r);
  I64s pos_axes, st, en, sp, flip_axes;
  for (std::size_t i = 0; i < axes.size(); ++i) {
    const std::int64_t d = sh[std::size_t(axes[i])];
    if (steps[i] == 0) c.fail("a step is 0");
    auto norm = [d](std::int64_t v) { return v < 0 ? (v < -d ? -1 : v + d) : v; };
    if (steps[i] > 0) {
      pos_axes.push_back(axes[i]);
      st.push_back(std::clamp(norm(starts[i]) < 0 ? 0 : norm(starts[i]), std::int64_t{0}, d));
      en.push_back(std::clamp(norm(ends[i]) < 0 ? 0 : norm(ends[i]), std::int64_t{0}, d));
      sp.push_back(steps[i]);
    } else {
      // A negative step walks the flipped axis forward: index i there is d - 1 - i here.
      const std::int64_t s = std::clamp(norm(starts[i]), std::int64_t{0}, d - 1);
      const std::int64_t e = std::clamp(norm(ends[i]), std::int64_t{-1}, d - 1);
      flip_axes.push_back(axes[i]);
      pos_axes.push_back(axes[i]);
      st.push_back(d - 1 - s);
      en.push_back(std::max(d - 1 - s, d - 1 - e));
      sp.push_back(steps[i] == std::numeric_limits<std::int64_t>::min() ? d + 1 : -steps[i]);
    }
  }
  if (!flip_axes.empty()) x = c.g.flip(x, flip_axes);
  return c.g.slice(x, pos_axes, st, en, sp);
}

// Slice with a symbolic start or end (x[:, :S] of a static position table): the IR's slice takes integer
// bounds, so the rows are picked with index_select at iota(end - start) + start, along a static axis with
// step 1. A symbolic bound is taken to lie inside the axis (exporters write the dim itself); the indices
// are clamped to the axis so that a larger binding cannot read outside it.
NodeId slice_symbolic(Ctx& c) {
  const auto starts = c.dim_ints(1, "starts"), ends = c.dim_ints(2, "ends");
  I64s axes = c.has(3) ? c.ints(3, "axes") : I64s{};
  if (axes.empty()) {
    axes.resize(starts.size());
    std::iota(axes.begin(), axes.end(), 0);
  }
  const I64s steps = c.has(4) ? c.ints(4, "steps") : I64s(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    c.fail("starts, ends, axes and steps differ in length");
  axes = axes_of(c, axes, c.rank(0));
  NodeId x = c.in(0);
  for (std::size_t i = 0; i < axes.size(); ++i) {
    const auto axis = std::size_t(axes[i]);
    const ir::Dim dim = c.g.node(x).shape[axis];
    auto s = starts[i].constant(), e = ends[i].constant();
    if (s && e) {  // this axis' bounds are integers: the ordinary slice
      x = slice_onnx(c, x, {*s}, {*e}, {axes[i]}, {steps[i]});
      continue;
    }
    if (!dim.is_static() || steps[i] != 1 || (s && *s < 0) || (e && *e < 0))
      c.fail(
          fmt::format("a symbolic slice bound on axis {} needs a static axis (it is {}), step 1 and bounds that "
                      "do not count from the end",
                      axis, dim.str()));
    const ir::DimExpr n = ends[i] - starts[i];
    auto idx = c.g.iota(ir::Shape(std::vector<ir::Dim>{n.dim()}), 0, ir::DType::I64);
    if (starts[i] != ir::DimExpr(0))
      idx = c.g.add(idx, dims_value(c, {starts[i]}, ir::Shape(std::vector<std::int64_t>{})));
    idx = c.g.clamp(idx, 0, double(std::max<std::int64_t>(dim.size - 1, 0)));
    x = c.g.index_select(x, idx, std::int64_t(axis));
  }
  return x;
}

// Values of a Constant node's attribute (value, value_float, value_ints, ...).
ir::Tensor constant_value(Ctx& c) {
  if (auto t = c.attr_tensor("value")) return *t;
  if (const auto* a = c.attr("value_float")) return ir::Tensor::scalar(ir::DType::F32, a->f());
  if (const auto* a = c.attr("value_int")) return ir::Tensor::scalar(ir::DType::I64, double(a->i()));
  if (const auto* a = c.attr("value_floats")) {
    std::vector<float> v(a->floats().begin(), a->floats().end());
    return ir::Tensor::from_f32({std::int64_t(v.size())}, v);
  }
  if (const auto* a = c.attr("value_ints")) {
    I64s v(a->ints().begin(), a->ints().end());
    return i64_tensor(v, {std::int64_t(v.size())});
  }
  c.fail(
      "no supported value attribute (value, value_float(s), value_int(s)); sparse and string values are not supported");
}

}  // namespace

void register_tensor(Table& t) {
  t["Constant"] = {[](Ctx& c) -> Outs { return {c.constant(constant_value(c))}; }};
  t["Shape"] = {[](Ctx& c) -> Outs {
    auto sh = c.shape(0);
    const auto r = std::int64_t(sh.size());
    auto clampi = [r](std::int64_t v) { return std::clamp(v < 0 ? v + r : v, std::int64_t{0}, r); };
    const std::int64_t s = clampi(c.attr_int("start", 0)), e = std::max(s, clampi(c.attr_int("end", r)));
    I64s v(sh.begin() + s, sh.begin() + e);
    return {c.constant(i64_tensor(v, {std::int64_t(v.size())}))};
  }};
  t["Size"] = {[](Ctx& c) -> Outs {
    return {c.constant(ir::Tensor::scalar(ir::DType::I64, double(ir::checked_numel(c.shape(0)))))};
  }};
  t["ConstantOfShape"] = {[](Ctx& c) -> Outs {
    std::vector<ir::Dim> shape;
    for (const auto& d : c.dim_ints(0, "shape")) {
      if (d.constant() && *d.constant() < 0) c.fail(fmt::format("a negative extent ({})", *d.constant()));
      shape.push_back(d.dim());
    }
    ir::Tensor v = c.attr_tensor("value").value_or(ir::Tensor::scalar(ir::DType::F32, 0));
    if (v.numel() != 1) c.fail("attribute 'value' must hold one element");
    return {c.g.expand(c.g.scalar(v.get(0), v.dtype()), ir::Shape(std::move(shape)))};
  }};
  t["Range"] = {[](Ctx& c) -> Outs {
    if (c.sym(0) || c.sym(1) || c.sym(2)) {
      // A symbolic bound (arange(S)): iota over ceil((limit - start) / delta) entries, for an integer
      // range whose delta is a positive integer known at import.
      const auto start = c.dim_ints(0, "start"), limit = c.dim_ints(1, "limit"), delta = c.dim_ints(2, "delta");
      const std::int64_t step = delta.size() == 1 ? delta[0].constant().value_or(0) : 0;
      if (!ir::is_integer(c.dtype(0)) || start.size() != 1 || limit.size() != 1 || step < 1)
        c.fail("a range with a symbolic bound needs integer scalars and a positive delta known at import");
      const ir::DimExpr n = (limit[0] - start[0] + ir::DimExpr(step - 1)).floordiv(step);
      auto out = c.g.iota(ir::Shape(std::vector<ir::Dim>{n.dim()}), 0, ir::DType::I64);
      if (step != 1) out = c.g.mul(out, c.g.scalar(double(step), ir::DType::I64));
      if (start[0] != ir::DimExpr(0))
        out = c.g.add(out, dims_value(c, {start[0]}, ir::Shape(std::vector<std::int64_t>{})));
      return {cast_to(c, out, c.dtype(0))};
    }
    const double start = c.scalar(0, "start"), limit = c.scalar(1, "limit"), delta = c.scalar(2, "delta");
    if (delta == 0) c.fail("delta is 0");
    const double n = std::max(0.0, std::ceil((limit - start) / delta));
    if (!(n < double(std::int64_t(1) << 40))) c.fail("the range is too long");
    const auto dt = c.dtype(0);
    ir::Tensor out(dt, {std::int64_t(n)});
    for (std::int64_t i = 0; i < std::int64_t(n); ++i) out.set(i, start + double(i) * delta);
    return {c.constant(out)};
  }};
  t["EyeLike"] = {[](Ctx& c) -> Outs {
    auto sh = c.shape(0);
    if (sh.size() != 2) c.fail("the input must be 2-D");
    auto dt = c.has_attr("dtype") ? dtype_of(c.attr_int("dtype")) : std::optional<ir::DType>(c.dtype(0));
    if (!dt) c.fail("attribute 'dtype' names a type RLX lacks");
    const std::int64_t kk = c.attr_int("k", 0);
    ir::Tensor out(*dt, sh);
    for (std::int64_t i = 0; i < sh[0]; ++i)
      if (i + kk >= 0 && i + kk < sh[1]) out.set(i * sh[1] + i + kk, 1);
    return {c.constant(out)};
  }};

  t["Reshape"] = {[](Ctx& c) -> Outs {
    auto x = c.in(0);
    auto target = c.dim_ints(1, "shape");
    const auto in = c.dims(0);
    const bool allowzero = c.attr_int("allowzero", 0) != 0;
    if (in.is_static() && !c.sym(1)) {
      auto sh = c.ints(1, "shape");
      for (std::size_t i = 0; i < sh.size(); ++i)
        if (sh[i] == 0 && !allowzero) {
          if (i >= in.rank()) c.fail("a 0 in the shape past the input's rank");
          sh[i] = in[i].size;
        }
      return {c.g.reshape(x, sh)};
    }
    // Symbolic dims: 0 copies the input's dim, and -1 is the input's element count divided by the other
    // dims', which must divide exactly as expressions (B*S*384 / (B*S) = 384).
    std::optional<std::size_t> infer_at;
    ir::DimExpr known(1);
    for (std::size_t i = 0; i < target.size(); ++i) {
      const auto v = target[i].constant();
      if (v && *v == 0 && !allowzero) {
        if (i >= in.rank()) c.fail("a 0 in the shape past the input's rank");
        target[i] = ir::DimExpr::of(in[i]);
      } else if (v && *v == -1) {
        if (infer_at) c.fail("more than one -1 in the shape");
        infer_at = i;
        continue;
      } else if (v && *v < 0) {
        c.fail(fmt::format("a negative extent ({}) in the shape", *v));
      }
      known = known * target[i];
    }
    if (infer_at) {
      auto rest = ir::shape_numel(in).exact_div(known);
      if (!rest)
        c.fail(fmt::format("cannot infer the -1 of the shape: {} elements do not divide by {} as dim expressions",
                           ir::shape_numel(in).str(), known.str()));
      target[*infer_at] = *rest;
    }
    std::vector<ir::Dim> dims;
    for (const auto& d : target) dims.push_back(d.dim());
    return {c.g.reshape(x, ir::Shape(std::move(dims)))};
  }};
  t["Flatten"] = {[](Ctx& c) -> Outs {
    auto sh = c.shape(0);
    const auto r = sh.size();
    const auto axis = c.attr_int("axis", 1);
    const auto a = axis < 0 ? axis + std::int64_t(r) : axis;
    if (a < 0 || a > std::int64_t(r)) c.fail(fmt::format("axis {} is out of range for rank {}", axis, r));
    std::int64_t outer = 1, inner = 1;
    for (std::size_t i = 0; i < r; ++i) (std::int64_t(i) < a ? outer : inner) *= sh[i];
    return {reshape_to(c, c.in(0), {outer, inner})};
  }};
  t["Transpose"] = {[](Ctx& c) -> Outs {
    const auto r = c.rank(0);
    I64s perm(r);
    std::iota(perm.rbegin(), perm.rend(), 0);
    perm = c.attr_ints("perm", perm);
    return {c.g.permute(c.in(0), axes_of(c, perm, r))};
  }};
  t["Squeeze"] = {[](Ctx& c) -> Outs {
    const auto sh = c.dims(0);
    I64s axes = c.opset() < 13 ? c.attr_ints("axes") : (c.has(1) ? c.ints(1, "axes") : I64s{});
    if (axes.empty()) {
      if (!sh.is_static()) c.shape(0);  // which dims are 1 depends on the binding: the error names them
      for (std::size_t i = 0; i < sh.rank(); ++i)
        if (sh[i] == ir::Dim(1)) axes.push_back(std::int64_t(i));
    }
    axes = axes_of(c, axes, sh.rank());
    for (auto a : axes)
      if (sh[std::size_t(a)] != ir::Dim(1))
        c.fail(fmt::format("axis {} has extent {}, not 1", a, sh[std::size_t(a)].str()));
    if (axes.empty()) return {c.in(0)};
    return {c.g.squeeze(c.in(0), axes)};
  }};
  t["Unsqueeze"] = {[](Ctx& c) -> Outs {
    I64s axes = c.opset() < 13 ? c.attr_ints("axes") : c.ints(1, "axes");
    const auto out_rank = c.rank(0) + axes.size();
    axes = axes_of(c, axes, out_rank);
    std::sort(axes.begin(), axes.end());
    const auto sh = c.dims(0);
    std::vector<ir::Dim> out;
    std::size_t j = 0;
    for (std::size_t i = 0; i < out_rank; ++i)
      out.push_back(std::binary_search(axes.begin(), axes.end(), std::int64_t(i)) ? ir::Dim(1) : sh[j++]);
    return {c.g.reshape(c.in(0), ir::Shape(std::move(out)))};
  }};
  t["Concat"] = {[](Ctx& c) -> Outs {
    std::vector<NodeId> xs;
    for (std::size_t i = 0; i < c.num_inputs(); ++i)
      if (c.has(i)) xs.push_back(c.in(i));
    if (xs.empty()) c.fail("no inputs");
    const auto axis = axis_of(c, c.attr_int("axis"), c.g.node(xs[0]).shape.rank());
    return {c.g.concat(xs, axis)};
  }};
  t["Split"] = {[](Ctx& c) -> Outs {
    const auto sh = c.shape(0);
    const auto axis = axis_of(c, c.attr_int("axis", 0), sh.size());
    const std::int64_t d = sh[std::size_t(axis)];
    I64s sizes = c.opset() < 13 ? c.attr_ints("split") : (c.has(1) ? c.ints(1, "split") : I64s{});
    const auto n_out = std::int64_t(c.attr_int("num_outputs", 0));
    if (sizes.empty()) {
      // Equal parts; from opset 18 num_outputs says how many, the last one smaller when d does not divide.
      const std::int64_t n = n_out > 0 ? n_out : std::int64_t(c.num_outputs());
      if (n <= 0 || n > 65536) c.fail("the number of outputs must be in [1, 65536]");
      const std::int64_t part = (d + n - 1) / n;
      for (std::int64_t i = 0, left = d; i < n; ++i, left -= part)
        sizes.push_back(std::max<std::int64_t>(0, std::min(part, left)));
    }
    auto parts = c.g.split(c.in(0), sizes, axis);
    return {parts.begin(), parts.end()};
  }};
  t["Slice"] = {[](Ctx& c) -> Outs {
    if (c.opset() >= 10 && (c.sym(1) || c.sym(2))) return {slice_symbolic(c)};
    if (c.opset() < 10)
      return {slice_onnx(c, c.in(0), c.attr_ints("starts"), c.attr_ints("ends"), c.attr_ints("axes"), {})};
    return {slice_onnx(c, c.in(0), c.ints(1, "starts"), c.ints(2, "ends"), c.has(3) ? c.ints(3, "axes") : I64s{},
                       c.has(4) ? c.ints(4, "steps") : I64s{})};
  }};
  t["Expand"] = {[](Ctx& c) -> Outs {
    std::vector<ir::Dim> shape;
    for (const auto& d : c.dim_ints(1, "shape")) shape.push_back(d.dim());
    ir::Shape out = ir::broadcast_shapes(c.g.node(c.in(0)).shape, ir::Shape(std::move(shape)));
    auto x = c.in(0);
    if (out == c.g.node(x).shape) return {x};
    return {c.g.expand(x, out)};
  }};
  t["Tile"] = {[](Ctx& c) -> Outs {
    auto sh = c.shape(0);
    auto reps = c.ints(1, "repeats");
    if (reps.size() != sh.size()) c.fail("repeats must have one entry per axis");
    // [.., d, ..] -> [.., 1, d, ..] expanded to [.., r, d, ..] -> [.., r*d, ..]
    I64s un, big, out;
    for (std::size_t i = 0; i < sh.size(); ++i) {
      if (reps[i] < 0) c.fail("a negative repeat");
      un.insert(un.end(), {1, sh[i]});
      big.insert(big.end(), {reps[i], sh[i]});
      out.push_back(reps[i] * sh[i]);
    }
    auto x = reshape_to(c, c.in(0), un);
    return {reshape_to(c, c.g.expand(x, ir::Shape(big)), out)};
  }};
  t["Gather"] = {[](Ctx& c) -> Outs {
    const auto axis = axis_of(c, c.attr_int("axis", 0), c.rank(0));
    return {take(c, c.in(0), c.in(1), axis)};
  }};
  t["GatherElements"] = {[](Ctx& c) -> Outs {
    const auto axis = axis_of(c, c.attr_int("axis", 0), c.rank(0));
    auto idx = c.in(1);
    const std::int64_t d = c.shape(0)[std::size_t(axis)];
    idx = c.g.where(c.g.binary(OpKind::Lt, idx, k(c, 0, idx)), c.g.add(idx, k(c, double(d), idx)), idx);
    return {c.g.gather(c.in(0), idx, axis)};
  }};
  t["GatherND"] = {[](Ctx& c) -> Outs {
    // Flattens the indexed leading dims into one and gathers rows of it: out = data[idx...] for each
    // index tuple, batch_dims leading dims shared. Extents are dim expressions, so symbolic data and
    // indices work too (the strides then enter as run-time values, dims_value).
    const auto data_sh = c.dims(0).dims();
    const auto idx_sh = c.dims(1).dims();
    const auto batch_dims = c.attr_int("batch_dims", 0);
    if (idx_sh.empty() || !idx_sh.back().is_static() || idx_sh.back().size < 1 || batch_dims < 0)
      c.fail("indices must have rank >= 1 and a static last dim >= 1");
    const auto b = std::size_t(batch_dims);
    const auto q = std::size_t(idx_sh.back().size);
    if (b + q > data_sh.size() || b >= idx_sh.size()) c.fail("indices do not fit the data's rank");
    auto ex = [](const ir::Dim& d) { return ir::DimExpr::of(d); };
    ir::DimExpr batch(1), rows(1), inner(1), tuples(1);
    for (std::size_t i = 0; i < b; ++i) batch = batch * ex(data_sh[i]);
    for (std::size_t i = b; i < b + q; ++i) rows = rows * ex(data_sh[i]);
    for (std::size_t i = b + q; i < data_sh.size(); ++i) inner = inner * ex(data_sh[i]);
    for (std::size_t i = b; i + 1 < idx_sh.size(); ++i) tuples = tuples * ex(idx_sh[i]);
    auto idx = cast_to(c, c.in(1), ir::DType::I64);
    // The row number of each tuple: sum_j wrap(idx_j) * stride_j, plus the batch's offset.
    std::vector<ir::DimExpr> strides(q, ir::DimExpr(1)), dims;
    for (std::size_t j = q; j-- > 1;) strides[j - 1] = strides[j] * ex(data_sh[b + j]);
    for (std::size_t j = 0; j < q; ++j) dims.push_back(ex(data_sh[b + j]));
    const ir::Shape per_tuple{1, 1, std::int64_t(q)};
    idx = c.g.reshape(idx, ir::Shape(std::vector<ir::Dim>{batch.dim(), tuples.dim(), ir::Dim(std::int64_t(q))}));
    auto dims_c = dims_value(c, dims, per_tuple);
    idx = c.g.where(c.g.binary(OpKind::Lt, idx, c.g.scalar(0, ir::DType::I64)), c.g.add(idx, dims_c), idx);
    auto row = c.g.sum(c.g.mul(idx, dims_value(c, strides, per_tuple)), {2});
    auto off = c.g.mul(c.g.iota(ir::Shape(std::vector<ir::Dim>{batch.dim(), tuples.dim()}), 0, ir::DType::I64),
                       dims_value(c, {rows}, ir::Shape(std::vector<std::int64_t>{})));
    row = c.g.reshape(c.g.add(row, off), ir::Shape(std::vector<ir::Dim>{(batch * tuples).dim()}));
    auto flat = c.g.reshape(c.in(0), ir::Shape(std::vector<ir::Dim>{(batch * rows).dim(), inner.dim()}));
    auto picked = c.g.index_select(flat, row, 0);
    std::vector<ir::Dim> out(idx_sh.begin(), idx_sh.end() - 1);
    out.insert(out.end(), data_sh.begin() + std::ptrdiff_t(b + q), data_sh.end());
    return {c.g.reshape(picked, ir::Shape(std::move(out)))};
  }};
  t["Pad"] = {[](Ctx& c) -> Outs {
    const auto mode = c.attr_str("mode", "constant");
    if (mode != "constant" && mode != "edge" && mode != "reflect" && mode != "wrap")
      c.fail(fmt::format("mode '{}' is not supported", mode));
    const auto r = c.rank(0);
    I64s pads = c.opset() < 11 ? c.attr_ints("pads") : c.ints(1, "pads");
    // A constant value computed at run time pads with zeros, then selects it outside the input.
    const bool runtime_value = c.opset() >= 11 && c.has(2) && !c.value(2);
    double value = c.opset() < 11                 ? c.attr_float("value", 0)
                   : (c.has(2) && !runtime_value) ? c.scalar(2, "constant_value")
                                                  : 0.0;
    I64s axes(r);
    std::iota(axes.begin(), axes.end(), 0);
    if (c.opset() >= 18 && c.has(3)) axes = axes_of(c, c.ints(3, "axes"), r);
    if (pads.size() != 2 * axes.size()) c.fail("pads must hold two entries per axis");
    I64s full(2 * r, 0);
    for (std::size_t i = 0; i < axes.size(); ++i) {
      full[std::size_t(axes[i])] = pads[i];
      full[r + std::size_t(axes[i])] = pads[axes.size() + i];
    }
    // Negative pads crop: slice first, then pad by the positive part.
    I64s st, en, ax;
    const auto sh = c.shape(0);
    for (std::size_t i = 0; i < r; ++i) {
      ax.push_back(std::int64_t(i));
      st.push_back(std::max<std::int64_t>(0, -full[i]));
      en.push_back(sh[i] - std::max<std::int64_t>(0, -full[r + i]));
      full[i] = std::max<std::int64_t>(0, full[i]);
      full[r + i] = std::max<std::int64_t>(0, full[r + i]);
    }
    auto x = c.g.slice(c.in(0), ax, st, en);
    if (mode == "constant" && runtime_value) {
      auto inside = c.g.pad(c.g.expand(c.g.scalar(1, ir::DType::Bool), c.g.node(x).shape), full, 0);
      return {c.g.where(inside, c.g.pad(x, full, 0), c.g.reshape(c.in(2), I64s{}))};
    }
    if (mode == "constant") return {c.g.pad(x, full, value)};
    // edge, reflect, wrap: each axis grows by concatenating slices of itself.
    for (std::size_t i = 0; i < r; ++i) {
      const std::int64_t before = full[i], after = full[r + i], d = ext(c, x)[i];
      if (before == 0 && after == 0) continue;
      const auto a = std::int64_t(i);
      if (d == 0 || (mode == "reflect" && (before >= d || after >= d)) || (mode == "wrap" && (before > d || after > d)))
        c.fail(fmt::format("{} padding of {} and {} does not fit axis {} of extent {}", mode, before, after, i, d));
      std::vector<NodeId> parts;
      auto edge = [&](std::int64_t at, std::int64_t n) {
        auto sh = ext(c, x);
        sh[i] = n;
        return c.g.expand(c.g.slice(x, {a}, {at}, {at + 1}), ir::Shape(sh));
      };
      if (before > 0)
        parts.push_back(mode == "edge"      ? edge(0, before)
                        : mode == "reflect" ? c.g.flip(c.g.slice(x, {a}, {1}, {1 + before}), {a})
                                            : c.g.slice(x, {a}, {d - before}, {d}));
      parts.push_back(x);
      if (after > 0)
        parts.push_back(mode == "edge"      ? edge(d - 1, after)
                        : mode == "reflect" ? c.g.flip(c.g.slice(x, {a}, {d - 1 - after}, {d - 1}), {a})
                                            : c.g.slice(x, {a}, {0}, {after}));
      x = c.g.concat(parts, a);
    }
    return {x};
  }};
  t["Trilu"] = {[](Ctx& c) -> Outs {
    auto sh = c.shape(0);
    if (sh.size() < 2) c.fail("the input must have rank >= 2");
    const std::int64_t kk = c.has(1) ? std::int64_t(c.scalar(1, "k")) : 0;
    const bool upper = c.attr_int("upper", 1) != 0;
    const auto r = sh.size();
    ir::Shape m({sh[r - 2], sh[r - 1]});
    auto rows = c.g.iota(m, 0, ir::DType::I64), cols = c.g.iota(m, 1, ir::DType::I64);
    auto diff = c.g.sub(cols, rows);  // j - i
    auto kc = c.g.scalar(double(kk), ir::DType::I64);
    auto keep = upper ? c.g.binary(OpKind::Ge, diff, kc) : c.g.binary(OpKind::Le, diff, kc);
    auto x = c.in(0);
    return {c.g.where(keep, x, k(c, 0, x))};
  }};
  t["DepthToSpace"] = {[](Ctx& c) -> Outs {
    auto sh = c.shape(0);
    if (sh.size() != 4) c.fail("the input must be 4-D");
    const std::int64_t b = c.attr_int("blocksize"), n = sh[0], ch = sh[1], h = sh[2], w = sh[3];
    if (b <= 0 || ch % (b * b) != 0) c.fail("channels are not a multiple of blocksize^2");
    const bool crd = c.attr_str("mode", "DCR") == "CRD";
    auto x = crd ? reshape_to(c, c.in(0), {n, ch / (b * b), b, b, h, w})
                 : reshape_to(c, c.in(0), {n, b, b, ch / (b * b), h, w});
    x = crd ? c.g.permute(x, {0, 1, 4, 2, 5, 3}) : c.g.permute(x, {0, 3, 4, 1, 5, 2});
    return {reshape_to(c, x, {n, ch / (b * b), h * b, w * b})};
  }};
  t["SpaceToDepth"] = {[](Ctx& c) -> Outs {
    auto sh = c.shape(0);
    if (sh.size() != 4) c.fail("the input must be 4-D");
    const std::int64_t b = c.attr_int("blocksize"), n = sh[0], ch = sh[1], h = sh[2], w = sh[3];
    if (b <= 0 || h % b != 0 || w % b != 0) c.fail("height and width are not multiples of blocksize");
    auto x = reshape_to(c, c.in(0), {n, ch, h / b, b, w / b, b});
    // DCR: the block offsets outermost in the channel; CRD (opset 25's mode): innermost.
    const bool crd = c.attr_str("mode", "DCR") == "CRD";
    x = crd ? c.g.permute(x, {0, 1, 3, 5, 2, 4}) : c.g.permute(x, {0, 3, 5, 1, 2, 4});
    return {reshape_to(c, x, {n, ch * b * b, h / b, w / b})};
  }};
  t["OneHot"] = {[](Ctx& c) -> Outs {
    const auto depth = std::int64_t(c.scalar(1, "depth"));
    auto idx_sh = c.shape(0);
    const auto r = idx_sh.size() + 1;
    const auto axis = axis_of(c, c.attr_int("axis", -1), r);
    auto idx = cast_to(c, c.in(0), ir::DType::I64);
    idx = c.g.where(c.g.binary(OpKind::Lt, idx, c.g.scalar(0, ir::DType::I64)),
                    c.g.add(idx, c.g.scalar(double(depth), ir::DType::I64)), idx);
    idx = c.g.unsqueeze(idx, {axis});
    I64s out = idx_sh;
    out.insert(out.begin() + axis, depth);
    auto pos = c.g.iota(ir::Shape(out), axis, ir::DType::I64);
    auto hit = c.g.binary(OpKind::Eq, pos, idx);
    auto vals = c.in(2);
    if (c.rank(2) != 1 || c.shape(2)[0] != 2) c.fail("values must be [off_value, on_value]");
    auto off = c.g.slice(vals, {0}, {0}, {1}), on = c.g.slice(vals, {0}, {1}, {2});
    return {c.g.where(hit, c.g.reshape(on, I64s{}), c.g.reshape(off, I64s{}))};
  }};

  reduction(t, "ReduceSum", OpKind::ReduceSum, 13, same, same);
  reduction(t, "ReduceMean", OpKind::ReduceMean, 18, same, same);
  reduction(t, "ReduceMax", OpKind::ReduceMax, 18, same, same);
  reduction(t, "ReduceMin", OpKind::ReduceMin, 18, same, same);
  reduction(t, "ReduceProd", OpKind::ReduceProd, 18, same, same);
  reduction(
      t, "ReduceL1", OpKind::ReduceSum, 18, [](Ctx& c, NodeId x) { return c.g.unary(OpKind::Abs, x); }, same);
  reduction(
      t, "ReduceL2", OpKind::ReduceSum, 18, [](Ctx& c, NodeId x) { return c.g.mul(x, x); },
      [](Ctx& c, NodeId x) { return c.g.unary(OpKind::Sqrt, x); });
  reduction(
      t, "ReduceSumSquare", OpKind::ReduceSum, 18, [](Ctx& c, NodeId x) { return c.g.mul(x, x); }, same);
  reduction(t, "ReduceLogSum", OpKind::ReduceSum, 18, same, [](Ctx& c, NodeId x) { return c.g.unary(OpKind::Log, x); });
  reduction(
      t, "ReduceLogSumExp", OpKind::ReduceSum, 18, [](Ctx& c, NodeId x) { return c.g.exp(x); },
      [](Ctx& c, NodeId x) { return c.g.unary(OpKind::Log, x); });
  t["ArgMax"] = {[](Ctx& c) -> Outs { return {arg_reduce(c, OpKind::ArgMax)}; }};
  t["ArgMin"] = {[](Ctx& c) -> Outs { return {arg_reduce(c, OpKind::ArgMin)}; }};
  t["CumSum"] = {[](Ctx& c) -> Outs {
    // A running sum as a product with a triangular matrix of ones (floats only): exclusive shifts the
    // diagonal, reverse mirrors the triangle.
    // Integers go through f64, exact for sums below 2^53.
    const auto dt0 = c.dtype(0);
    auto x = ir::is_float(dt0) ? c.in(0) : c.g.cast(c.in(0), ir::DType::F64);
    const auto dt = c.g.node(x).dtype;
    const auto r = c.rank(0);
    const auto axis = axis_of(c, std::int64_t(c.scalar(1, "axis")), r);
    const std::int64_t d = c.shape(0)[std::size_t(axis)];
    const bool excl = c.attr_int("exclusive", 0) != 0, rev = c.attr_int("reverse", 0) != 0;
    ir::Tensor tri(dt, {d, d});
    for (std::int64_t i = 0; i < d; ++i)  // out[j] = sum_i x[i] * tri[i][j]
      for (std::int64_t j = 0; j < d; ++j) tri.set(i * d + j, rev ? (excl ? i > j : i >= j) : (excl ? i < j : i <= j));
    I64s perm(r);
    std::iota(perm.begin(), perm.end(), 0);
    std::swap(perm[std::size_t(axis)], perm[r - 1]);
    auto moved = c.g.permute(x, perm);
    if (r == 1) moved = c.g.reshape(moved, I64s{1, d});
    auto y = c.g.matmul(moved, c.constant(tri));
    if (r == 1) y = c.g.reshape(y, I64s{d});
    return {cast_to(c, c.g.permute(y, perm), dt0)};
  }};
}

}  // namespace rlx::onnx::detail
