// Matmul and the composites (HIR): decomposed into primitives unless a backend
// claims them natively.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <string>

#include "ops/family.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/limits.hpp"

namespace rlx::ops {
namespace {

using ir::DecomposeArgs;
using ir::Dim;
using ir::DType;
using ir::F64Value;
using ir::Graph;
using ir::InferArgs;
using ir::Node;
using ir::NodeId;
using ir::Shape;
using ir::TypeInfo;
using Ints = std::vector<i64>;

// The composite being replaced, its mapped inputs and the graph receiving the
// primitives; the decompose pass prefixes failures with the source node.
struct Ctx {
  const Node& n;
  Graph& g;
  std::vector<NodeId> in;

  explicit Ctx(const ir::DecomposeArgs& a) : n(a.node), g(a.g), in(a.in.begin(), a.in.end()) {}

  const Node& arg(std::size_t i) const { return g.node(in[i]); }
  std::optional<NodeId> optional_arg(std::size_t i) const {
    return i < in.size() ? std::optional<NodeId>(in[i]) : std::nullopt;
  }
  [[noreturn]] void fail(const std::string& why) const { throw Error(why); }

  // Slicing offsets are baked into the graph, so those extents must be known.
  i64 static_dim(std::size_t input, std::size_t axis) const {
    const Shape& s = arg(input).shape;
    if (!s[axis].is_static())
      fail("cannot decompose: dim " + std::to_string(axis) + " of input " + std::to_string(input) + " " + s.str() +
           " is symbolic");
    return s[axis].size;
  }
  // A per-spatial-dim attribute; a single entry applies to every dim, as in inference.
  Ints ints(std::string_view key, std::size_t count) const {
    Ints out = n.attrs.get_ints(key);
    if (out.size() == 1) out.resize(count, out[0]);
    if (out.size() != count)
      fail("attribute '" + std::string(key) + "' needs " + std::to_string(count) + " entries, got " +
           std::to_string(out.size()));
    return out;
  }
  NodeId scalar(double v) const { return g.scalar(v, n.dtype); }
};

Ints range(i64 lo, i64 hi) {
  Ints r(std::size_t(hi - lo));
  std::iota(r.begin(), r.end(), lo);
  return r;
}

// x - max(x): exp of it cannot overflow, and -inf entries (masked) stay -inf.
NodeId shift_by_max(Graph& g, NodeId x, i64 axis) { return g.sub(x, g.reduce(OpKind::ReduceMax, x, {axis}, true)); }

NodeId softmax(Graph& g, NodeId x, i64 axis) {
  NodeId e = g.exp(shift_by_max(g, x, axis));
  return g.div(e, g.sum(e, {axis}, true));
}

NodeId log_softmax(Graph& g, NodeId x, i64 axis) {
  NodeId s = shift_by_max(g, x, axis);
  return g.sub(s, g.unary(OpKind::Log, g.sum(g.exp(s), {axis}, true)));
}

NodeId layer_norm(const Ctx& c) {
  auto rank = c.arg(0).shape.rank();
  i64 axis = ir::normalize_axis(c.n.attrs.get_int("axis"), rank);
  Ints axes = range(axis, i64(rank));
  NodeId centered = c.g.sub(c.in[0], c.g.mean(c.in[0], axes, true));
  NodeId var = c.g.mean(c.g.mul(centered, centered), axes, true);
  NodeId y = c.g.mul(centered, c.g.unary(OpKind::Rsqrt, c.g.add(var, c.scalar(c.n.attrs.get_float("eps")))));
  if (auto gamma = c.optional_arg(1)) y = c.g.mul(y, *gamma);
  if (auto beta = c.optional_arg(2)) y = c.g.add(y, *beta);
  return y;
}

// The two halves of each pair (as [..., D/2] each), rotated, put back in their places.
NodeId rope(const Ctx& c) {
  Graph& g = c.g;
  const Shape xs = c.arg(0).shape;
  const auto rank = i64(xs.rank());
  const i64 half = c.static_dim(0, std::size_t(rank - 1)) / 2;
  const bool interleaved = c.n.attrs.get_bool("interleaved");
  std::vector<Dim> lead(xs.dims().begin(), xs.dims().end() - 1);
  NodeId x0, x1;
  if (interleaved) {
    std::vector<Dim> pairs = lead;
    pairs.insert(pairs.end(), {Dim(half), Dim(2)});
    NodeId p = g.reshape(c.in[0], Shape(pairs));
    std::vector<Dim> halves = lead;
    halves.emplace_back(half);
    x0 = g.reshape(g.narrow(p, rank, 0, 1), Shape(halves));
    x1 = g.reshape(g.narrow(p, rank, 1, 1), Shape(halves));
  } else {
    x0 = g.narrow(c.in[0], rank - 1, 0, half);
    x1 = g.narrow(c.in[0], rank - 1, half, half);
  }
  const NodeId cos = c.in[1], sin = c.in[2];
  NodeId o0 = g.sub(g.mul(x0, cos), g.mul(x1, sin));
  NodeId o1 = g.add(g.mul(x0, sin), g.mul(x1, cos));
  if (!interleaved) return g.concat({o0, o1}, rank - 1);
  return g.reshape(g.concat({g.unsqueeze(o0, {rank}), g.unsqueeze(o1, {rank})}, rank), xs);
}

NodeId rms_norm(const Ctx& c) {
  NodeId x = c.in[0];
  NodeId ms = c.g.mean(c.g.mul(x, x), {-1}, true);
  NodeId y = c.g.mul(x, c.g.unary(OpKind::Rsqrt, c.g.add(ms, c.scalar(c.n.attrs.get_float("eps")))));
  if (auto gamma = c.optional_arg(1)) y = c.g.mul(y, *gamma);
  return y;
}

// The backward ops: the input cotangent from (forward value, output cotangent[, gamma]).
NodeId softmax_backward(const Ctx& c, bool log) {
  Graph& g = c.g;
  i64 axis = c.n.attrs.get_int("axis");
  NodeId y = c.in[0], dy = c.in[1];
  if (log) return g.sub(dy, g.mul(g.exp(y), g.sum(dy, {axis}, true)));
  return g.mul(y, g.sub(dy, g.sum(g.mul(dy, y), {axis}, true)));
}

// r (g - mean(g) - xhat mean(g xhat)) over the normalized dims, with
// xhat = (x - mean) r and g = dy gamma; rms_norm has no mean terms.
NodeId norm_backward(const Ctx& c, bool rms) {
  Graph& g = c.g;
  auto rank = c.arg(0).shape.rank();
  Ints axes = rms ? Ints{-1} : range(ir::normalize_axis(c.n.attrs.get_int("axis"), rank), i64(rank));
  NodeId x = c.in[0], centered = rms ? x : g.sub(x, g.mean(x, axes, true));
  NodeId var = g.mean(g.mul(centered, centered), axes, true);
  NodeId r = g.unary(OpKind::Rsqrt, g.add(var, c.scalar(c.n.attrs.get_float("eps"))));
  NodeId xhat = g.mul(centered, r);
  NodeId dy = c.in[1];
  if (auto gamma = c.optional_arg(2)) dy = g.mul(dy, *gamma);
  NodeId inner = g.sub(dy, g.mul(xhat, g.mean(g.mul(dy, xhat), axes, true)));
  if (!rms) inner = g.sub(inner, g.mean(dy, axes, true));
  return g.mul(r, inner);
}

// conv over `sp` spatial dims: channels go last so that each kernel offset is
// one plain 2-d matmul [N*o.., Cg] x [Cg, Og] of a strided slice of the padded
// input; offsets accumulate, groups concat along channels.
NodeId conv(const Ctx& c, std::size_t sp) {
  Graph& g = c.g;
  Ints stride = c.ints("stride", sp), padding = c.ints("padding", sp), dilation = c.ints("dilation", sp);
  i64 groups = c.n.attrs.get_int("groups");
  i64 group_ch = c.static_dim(1, 1), group_out = c.static_dim(1, 0) / groups;
  Ints kernel(sp), out(sp);
  i64 rows = c.static_dim(0, 0);  // of every matmul: one per output position
  for (std::size_t d = 0; d < sp; ++d) {
    kernel[d] = c.static_dim(1, d + 2);
    out[d] = (c.static_dim(0, d + 2) + 2 * padding[d] - dilation[d] * (kernel[d] - 1) - 1) / stride[d] + 1;
    rows *= out[d];
  }
  i64 ch_axis = i64(sp) + 1;  // channels-last axis of input and output
  Ints to_last = range(2, ch_axis + 1);
  to_last.insert(to_last.begin(), 0);
  to_last.push_back(1);
  NodeId x = g.permute(c.in[0], to_last);
  if (std::any_of(padding.begin(), padding.end(), [](i64 p) { return p != 0; })) {
    Ints pads(2 * (sp + 2), 0);
    for (std::size_t d = 0; d < sp; ++d) pads[1 + d] = pads[sp + 3 + d] = padding[d];
    x = g.pad(x, pads, 0.0);
  }
  Ints w_perm = range(2, ch_axis + 1);  // [O, Cg, k..] -> [k.., Cg, O]
  w_perm.push_back(1);
  w_perm.push_back(0);
  NodeId w = g.permute(c.in[1], w_perm);
  Ints spatial_axes = range(1, ch_axis), w_axes = range(0, i64(sp));
  w_axes.push_back(ch_axis);

  std::vector<NodeId> results;
  for (i64 gi = 0; gi < groups; ++gi) {
    NodeId xg = groups == 1 ? x : g.slice(x, {ch_axis}, {gi * group_ch}, {(gi + 1) * group_ch});
    std::optional<NodeId> acc;
    for_each_index(kernel, [&](const Ints& k, std::int64_t) {
      Ints starts(sp), ends(sp), w_starts = k, w_ends = k;
      for (std::size_t d = 0; d < sp; ++d) {
        starts[d] = k[d] * dilation[d];
        ends[d] = starts[d] + (out[d] - 1) * stride[d] + 1;
        ++w_ends[d];
      }
      w_starts.push_back(gi * group_out);
      w_ends.push_back((gi + 1) * group_out);
      NodeId patch = g.reshape(g.slice(xg, spatial_axes, starts, ends, stride), Ints{rows, group_ch});
      NodeId wk = g.reshape(g.slice(w, w_axes, w_starts, w_ends), Ints{group_ch, group_out});
      NodeId prod = g.matmul(patch, wk);
      acc = acc ? g.add(*acc, prod) : prod;
    });
    results.push_back(*acc);
  }
  NodeId y = groups == 1 ? results[0] : g.concat(results, 1);
  if (auto bias = c.optional_arg(2)) y = g.add(y, *bias);
  Ints nhwc{c.static_dim(0, 0)};
  nhwc.insert(nhwc.end(), out.begin(), out.end());
  nhwc.push_back(group_out * groups);
  y = g.reshape(y, nhwc);
  Ints to_first = range(0, ch_axis);
  to_first.insert(to_first.begin() + 1, ch_axis);
  return g.permute(y, to_first);
}

// Pools over the last two dims: one strided slice of the padded input per
// kernel offset, combined with max (-inf padding never wins) or summed and
// divided by kh*kw.
NodeId pool2d(const Ctx& c, bool is_max) {
  Graph& g = c.g;
  Ints kernel = c.ints("kernel", 2), stride = c.ints("stride", 2), padding = c.ints("padding", 2);
  auto rank = c.arg(0).shape.rank();
  Ints axes{i64(rank) - 2, i64(rank) - 1}, out(2);
  for (std::size_t d = 0; d < 2; ++d)
    out[d] = (c.static_dim(0, rank - 2 + d) + 2 * padding[d] - kernel[d]) / stride[d] + 1;
  NodeId x = c.in[0];
  if (padding[0] != 0 || padding[1] != 0) {
    Ints pads(2 * rank, 0);
    pads[rank - 2] = pads[2 * rank - 2] = padding[0];
    pads[rank - 1] = pads[2 * rank - 1] = padding[1];
    x = g.pad(x, pads, is_max ? -std::numeric_limits<double>::infinity() : 0.0);
  }
  std::optional<NodeId> acc;
  for_each_index(kernel, [&](const Ints& k, std::int64_t) {
    NodeId s = g.slice(x, axes, k, {k[0] + (out[0] - 1) * stride[0] + 1, k[1] + (out[1] - 1) * stride[1] + 1}, stride);
    acc = !acc ? s : is_max ? g.binary(OpKind::Max, *acc, s) : g.add(*acc, s);
  });
  return is_max ? *acc : g.div(*acc, c.scalar(double(kernel[0] * kernel[1])));
}

// softmax(q k^T * scale [+ mask]) v. Causal keeps key j for query i when
// j <= i (top-left aligned, as torch's is_causal).
NodeId attention(const Ctx& c) {
  Graph& g = c.g;
  Shape qs = c.arg(0).shape, ks = c.arg(1).shape, vs = c.arg(2).shape;  // copies: emitting nodes moves g's storage
  double scale = c.n.attrs.get_float("scale");
  if (scale == 0.0) scale = 1.0 / std::sqrt(double(c.static_dim(0, qs.rank() - 1)));
  NodeId k = c.in[1], v = c.in[2];
  if (!(qs[1] == ks[1])) {  // grouped KV heads: each repeated for its group of query heads
    const Dim group(qs[1].size / ks[1].size);
    auto repeat = [&](NodeId t, const Shape& s) {
      NodeId e = g.expand(g.reshape(t, Shape(std::vector<Dim>{s[0], s[1], Dim(1), s[2], s[3]})),
                          Shape(std::vector<Dim>{s[0], s[1], group, s[2], s[3]}));
      return g.reshape(e, Shape(std::vector<Dim>{s[0], qs[1], s[2], s[3]}));
    };
    k = repeat(k, ks);
    v = repeat(v, vs);
  }
  NodeId s = g.mul(g.matmul(c.in[0], g.transpose(k)), c.scalar(scale));
  std::optional<NodeId> neg_inf;
  auto masked = [&](NodeId keep) {
    if (!neg_inf) neg_inf = c.scalar(-std::numeric_limits<double>::infinity());
    return g.where(keep, s, *neg_inf);
  };
  if (auto mask = c.optional_arg(3)) s = c.arg(3).dtype == DType::Bool ? masked(*mask) : g.add(s, *mask);
  if (c.n.attrs.get_bool("causal")) {
    NodeId rows = g.iota(Shape(std::vector<Dim>{qs[qs.rank() - 2], Dim(1)}), 0);
    NodeId cols = g.iota(Shape(std::vector<Dim>{Dim(1), ks[ks.rank() - 2]}), 1);
    s = masked(g.binary(OpKind::Le, cols, rows));
  }
  return g.matmul(softmax(g, s, -1), v);
}

NodeId linear(const Ctx& c) {
  // matmul needs rank >= 2: a vector x is a row of one.
  const Shape xs = c.arg(0).shape;
  const bool vec = xs.rank() == 1;
  NodeId x = vec ? c.g.reshape(c.in[0], Shape(std::vector<Dim>{Dim(1), xs[0]})) : c.in[0];
  NodeId y = c.g.matmul(x, c.in[1]);
  if (vec) y = c.g.reshape(y, Shape(std::vector<Dim>{c.g.node(y).shape[1]}));
  if (auto bias = c.optional_arg(2)) y = c.g.add(y, *bias);
  return y;
}

// A table decomposition from one of the rules above, written over Ctx.
std::function<NodeId(const DecomposeArgs&)> via(NodeId (*rule)(const Ctx&)) {
  return [rule](const DecomposeArgs& a) { return rule(Ctx(a)); };
}

// group_norm: x [N, C, spatial...] normalized per sample over each group of
// C / num_groups channels and all spatial positions (population variance),
// then scaled and shifted per channel by gamma and beta [C].
TypeInfo group_norm_infer(const InferArgs& a) {
  const TypeInfo& x = a.inputs[0];
  a.require(ir::is_float(x.dtype), "needs a float input");
  a.require(x.shape.rank() >= 2, "needs x as [N, C, ...] (rank >= 2)");
  const ir::Dim& c = x.shape[1];
  a.require(c.is_static(), "needs a static channel dim, got " + c.str());
  const i64 groups = a.attrs.get_int("num_groups");
  a.require(groups >= 1 && c.size % groups == 0,
            "num_groups " + std::to_string(groups) + " does not divide the " + std::to_string(c.size) + " channels");
  for (std::size_t i = 1; i < a.inputs.size(); ++i) {
    const char* what = i == 1 ? "gamma" : "beta";
    a.require(a.inputs[i].dtype == x.dtype, std::string(what) + " has another dtype than x");
    a.require(a.inputs[i].shape == Shape{c.size}, std::string(what) + " must be [" + std::to_string(c.size) + "]");
  }
  return x;
}

NodeId group_norm_decompose(const DecomposeArgs& a) {
  ir::Graph& g = a.g;
  const Shape s = g.node(a.in[0]).shape;  // a copy: adding nodes moves the graph's storage
  const i64 groups = a.attrs().get_int("num_groups"), c = s[1].size;
  i64 per_group = c / groups;
  for (std::size_t d = 2; d < s.rank(); ++d) {
    if (!s[d].is_static()) throw Error("group_norm: cannot decompose with a symbolic spatial dim " + s.str());
    per_group *= s[d].size;
  }
  NodeId x = g.reshape(a.in[0], Shape(std::vector<ir::Dim>{s[0], ir::Dim(groups), ir::Dim(per_group)}));
  NodeId centered = g.sub(x, g.mean(x, {2}, true));
  NodeId var = g.mean(g.mul(centered, centered), {2}, true);
  NodeId y = g.mul(centered, g.unary(OpKind::Rsqrt, g.add(var, a.scalar(a.attrs().get_float("eps")))));
  y = g.reshape(y, s);
  std::vector<i64> per_channel(s.rank() - 1, 1);  // [C, 1, ...]: broadcasts over the spatial dims
  per_channel[0] = c;
  if (auto gamma = a.optional_in(1)) y = g.mul(y, g.reshape(*gamma, per_channel));
  if (auto beta = a.optional_in(2)) y = g.add(y, g.reshape(*beta, per_channel));
  return y;
}

F64Value group_norm_reference(const ReferenceArgs& args) {
  const std::span<const F64Value* const> in = args.in;
  const F64Value& x = *in[0];
  const i64 n = x.ext[0], c = x.ext[1], groups = args.attrs().get_int("num_groups");
  const double eps = args.attrs().get_float("eps");
  i64 spatial = 1;
  for (std::size_t d = 2; d < x.ext.size(); ++d) spatial *= x.ext[d];
  const i64 block = c / groups * spatial;  // one group of one sample is contiguous
  F64Value y = args.result(x.ext);
  for (i64 b = 0; b < n * groups; ++b) {
    const double* src = x.v.data() + b * block;
    double mean = 0, var = 0;
    for (i64 i = 0; i < block; ++i) mean += src[i];
    mean /= double(block);
    for (i64 i = 0; i < block; ++i) var += (src[i] - mean) * (src[i] - mean);
    const double inv = 1 / std::sqrt(var / double(block) + eps);
    for (i64 i = 0; i < block; ++i) {
      const i64 channel = (b % groups) * (c / groups) + i / spatial;
      double v = (src[i] - mean) * inv;
      if (in.size() > 1) v *= in[1]->v[std::size_t(channel)];
      if (in.size() > 2) v += in[2]->v[std::size_t(channel)];
      y.v[std::size_t(b * block + i)] = v;
    }
  }
  return y;
}

// ---- shape rules --------------------------------------------------------------

const Shape& shape0(const InferArgs& a) { return a.inputs[0].shape; }
void require_float(const InferArgs& a) { a.require(ir::is_float(a.inputs[0].dtype), "needs a float input"); }
// The input's type after checking `axis` against its rank.
TypeInfo same_with_axis(const InferArgs& a) {
  require_float(a);
  ir::normalize_axis(a.attrs.get_int("axis"), shape0(a).rank());
  return a.inputs[0];
}
// The trailing dims [axis..) of the input that layer_norm normalizes over.
Shape trailing(const Shape& s, std::size_t axis) {
  return Shape(std::vector<Dim>(s.dims().begin() + static_cast<std::ptrdiff_t>(axis), s.dims().end()));
}

TypeInfo matmul_infer(const InferArgs& a) {
  const Shape &x = a.inputs[0].shape, &y = a.inputs[1].shape;
  a.require(a.inputs[0].dtype == a.inputs[1].dtype, "operand dtypes differ");
  a.require(a.inputs[0].dtype != DType::Bool, "does not take bool");
  a.require(x.rank() >= 2 && y.rank() >= 2, "operands need rank >= 2");
  a.require(x[x.rank() - 1] == y[y.rank() - 2],
            "contraction dims differ (" + x[x.rank() - 1].str() + " vs " + y[y.rank() - 2].str() + ")");
  Shape bx(std::vector<Dim>(x.dims().begin(), x.dims().end() - 2));
  Shape by(std::vector<Dim>(y.dims().begin(), y.dims().end() - 2));
  auto dims = ir::broadcast_shapes(bx, by).dims();
  dims.push_back(x[x.rank() - 2]);
  dims.push_back(y[y.rank() - 1]);
  return {a.inputs[0].dtype, Shape(std::move(dims))};
}

// 2 K FLOPs per result element (a multiply and an add per term of the dot product).
double matmul_flops(std::span<const TypeInfo> in, const TypeInfo& out) {
  const Shape& x = in[0].shape;
  const double k = x.rank() && x[x.rank() - 1].is_static() ? double(x[x.rank() - 1].size) : 1.0;
  return 2 * ir::estimated_numel(out.shape) * k;
}

TypeInfo linear_infer(const InferArgs& a) {
  const Shape &x = shape0(a), &w = a.inputs[1].shape;
  const DType t = a.inputs[0].dtype;
  a.require(ir::is_float(t) && a.inputs[1].dtype == t, "needs float x and w of the same dtype");
  a.require(x.rank() >= 1 && w.rank() == 2, "needs x [..., in] and w [in, out]");
  a.require(x[x.rank() - 1] == w[0], "x's last dim " + x[x.rank() - 1].str() + " differs from w's first " + w[0].str());
  if (a.inputs.size() == 3)
    a.require(a.inputs[2].shape == Shape(std::vector<Dim>{w[1]}) && a.inputs[2].dtype == t, "bias must be [out]");
  auto out = x.dims();
  out.back() = w[1];
  return {t, Shape(std::move(out))};
}

TypeInfo layer_norm_infer(const InferArgs& a) {
  require_float(a);
  const auto axis = static_cast<std::size_t>(ir::normalize_axis(a.attrs.get_int("axis"), shape0(a).rank()));
  const Shape norm = trailing(shape0(a), axis);
  for (std::size_t i = 1; i < a.inputs.size(); ++i)
    a.require(a.inputs[i].shape == norm && a.inputs[i].dtype == a.inputs[0].dtype, "gamma/beta must be " + norm.str());
  return a.inputs[0];
}

TypeInfo rms_norm_infer(const InferArgs& a) {
  const Shape& s = shape0(a);
  a.require(ir::is_float(a.inputs[0].dtype) && s.rank() >= 1, "needs a float input of rank >= 1");
  if (a.inputs.size() == 2)
    a.require(a.inputs[1].shape == Shape(std::vector<Dim>{s[s.rank() - 1]}) && a.inputs[1].dtype == a.inputs[0].dtype,
              "gamma must be [last dim]");
  return a.inputs[0];
}

// Backward ops: (forward value, output cotangent[, gamma]) -> input cotangent.
void require_same_second(const InferArgs& a, const char* names) {
  require_float(a);
  a.require(a.inputs[1].dtype == a.inputs[0].dtype && a.inputs[1].shape == shape0(a),
            std::string(names) + " must have the same dtype and shape");
}

TypeInfo softmax_backward_infer(const InferArgs& a) {
  require_same_second(a, "y and dy");
  return same_with_axis(a);
}

TypeInfo norm_backward_infer(const InferArgs& a, bool rms) {
  require_same_second(a, "x and dy");
  const Shape& s = shape0(a);
  std::size_t axis = s.rank() ? s.rank() - 1 : 0;
  if (rms)
    a.require(s.rank() >= 1, "needs rank >= 1");
  else
    axis = static_cast<std::size_t>(ir::normalize_axis(a.attrs.get_int("axis"), s.rank()));
  const Shape norm = trailing(s, axis);
  if (a.inputs.size() == 3)
    a.require(a.inputs[2].shape == norm && a.inputs[2].dtype == a.inputs[0].dtype, "gamma must be " + norm.str());
  return a.inputs[0];
}

// Convolutions and pools over `spatial` trailing dims of a static [N, C, ...] input.
TypeInfo window_infer(const InferArgs& a, std::size_t spatial, bool pool) {
  const Shape& s = shape0(a);
  const DType t = a.inputs[0].dtype;
  require_float(a);
  a.require(s.rank() == spatial + 2 && s.is_static(),
            "input must be static N,C" + std::string(spatial == 1 ? ",L" : ",H,W"));
  auto ints = [&](std::string_view k) {
    auto v = a.attrs.get_ints(k);
    if (v.size() == 1 && spatial == 2) v.push_back(v[0]);
    a.require(v.size() == spatial, std::string(k) + " needs " + std::to_string(spatial) + " entries");
    return v;
  };
  const Ints stride = ints("stride"), padding = ints("padding");
  Ints dilation(spatial, 1), kernel;
  i64 out_c = s[1].size;
  if (pool) {
    kernel = ints("kernel");
  } else {
    dilation = ints("dilation");
    const Shape& w = a.inputs[1].shape;
    const i64 groups = a.attrs.get_int("groups");
    a.require(a.inputs[1].dtype == t && w.rank() == s.rank() && w.is_static(), "weight must be [O, C/groups, k...]");
    a.require(groups >= 1 && s[1].size % groups == 0 && w[0].size % groups == 0, "groups must divide C and O");
    a.require(w[1].size * groups == s[1].size, "weight has " + w[1].str() + " input channels per group, input has " +
                                                   s[1].str() + " channels and groups=" + std::to_string(groups));
    out_c = w[0].size;
    for (std::size_t i = 0; i < spatial; ++i) kernel.push_back(w[2 + i].size);
    if (a.inputs.size() == 3)
      a.require(a.inputs[2].shape == Shape{out_c} && a.inputs[2].dtype == t, "bias must be [O]");
  }
  std::vector<Dim> out{s[0], Dim(out_c)};
  for (std::size_t i = 0; i < spatial; ++i) {
    a.require(stride[i] >= 1 && dilation[i] >= 1 && padding[i] >= 0 && kernel[i] >= 1,
              "stride/dilation/kernel must be >= 1");
    using ir::limits::checked_add, ir::limits::checked_mul;
    auto eff = checked_add(checked_mul(dilation[i], kernel[i] - 1, "the dilated kernel"), 1, "the dilated kernel");
    auto e = checked_add(s[2 + i].size, checked_mul(2, padding[i], "the padding"), "the padded input") - eff;
    a.require(e >= 0, "kernel is larger than the padded input");
    out.emplace_back(e / stride[i] + 1);
  }
  return {t, Shape(std::move(out))};
}

// A block-quantized table's rows come out dequantized, as f32.
TypeInfo embedding_infer(const InferArgs& a) {
  a.require(shape0(a).rank() == 2, "table must be [vocab, dim]");
  a.require(ir::is_integer(a.inputs[1].dtype), "ids must be integers");
  auto out = a.inputs[1].shape.dims();
  out.push_back(shape0(a)[1]);
  const DType t = a.inputs[0].dtype;
  return {ir::is_block_quantized(t) ? DType::F32 : t, Shape(std::move(out))};
}

// rope(x [..., D], cos, sin): D even; cos and sin of x's dtype broadcast to [..., D/2] (x's leading dims).
TypeInfo rope_infer(const InferArgs& a) {
  const TypeInfo &x = a.inputs[0], &cos = a.inputs[1], &sin = a.inputs[2];
  a.require(ir::is_float(x.dtype), "x must be a float type, got " + std::string(ir::dtype_name(x.dtype)));
  a.require(cos.dtype == x.dtype && sin.dtype == x.dtype, "cos and sin need x's dtype");
  a.require(x.shape.rank() >= 1, "x needs rank >= 1");
  const Dim& d = x.shape[x.shape.rank() - 1];
  a.require(d.is_static() && d.size % 2 == 0, "x's last dim must be static and even, got " + x.shape.str());
  std::vector<Dim> half(x.shape.dims().begin(), x.shape.dims().end());
  half.back() = Dim(d.size / 2);
  const Shape want(half);
  for (const TypeInfo* t : {&cos, &sin}) {
    a.require(t->shape.rank() <= want.rank(),
              "cos and sin must broadcast to " + want.str() + " (x's leading dims, D/2), got " + t->shape.str());
    Shape joint = want;
    try {
      joint = ir::broadcast_shapes(t->shape, want);
    } catch (const Error&) {
      joint = Shape();
    }
    a.require(joint == want,
              "cos and sin must broadcast to " + want.str() + " (x's leading dims, D/2), got " + t->shape.str());
  }
  return x;
}

TypeInfo attention_infer(const InferArgs& a) {
  const Shape &q = shape0(a), &k = a.inputs[1].shape, &v = a.inputs[2].shape;
  const DType t = a.inputs[0].dtype;
  a.require(ir::is_float(t) && a.inputs[1].dtype == t && a.inputs[2].dtype == t, "q, k, v must share a float dtype");
  a.require(q.rank() == 4 && k.rank() == 4 && v.rank() == 4, "q, k, v must be [B, H, S, D]");
  a.require(q[0] == k[0] && k[0] == v[0] && k[1] == v[1], "batch dims differ, or k's and v's heads");
  // Grouped-query attention (torch's enable_gqa): each k/v head serves q's heads / k's heads query heads.
  a.require(q[1] == k[1] || (q[1].is_static() && k[1].is_static() && k[1].size > 0 && q[1].size % k[1].size == 0),
            "q's " + q[1].str() + " heads are not a multiple of k's and v's " + k[1].str());
  a.require(q[3] == k[3], "q and k head dims differ");
  a.require(k[2] == v[2], "k and v sequence lengths differ");
  if (a.inputs.size() == 4) {
    const TypeInfo& m = a.inputs[3];
    a.require(m.dtype == DType::Bool || m.dtype == t, "mask must be bool or q's dtype");
    Shape scores(std::vector<Dim>{q[0], q[1], q[2], k[2]});
    a.require(ir::broadcast_shapes(m.shape, scores) == scores, "mask does not broadcast to " + scores.str());
  }
  return {t, Shape(std::vector<Dim>{q[0], q[1], q[2], v[3]})};
}

// ---- float64 references, computed directly (never through the
// decompositions above) so that they check them.
namespace ref {

const F64Value* optional(const ReferenceArgs& c, std::size_t i) { return i < c.in.size() ? c.in[i] : nullptr; }
// layer_norm's first normalized axis (a scalar is a row of one), and rms_norm's.
std::size_t norm_axis(const ReferenceArgs& c) {
  const std::size_t rank = c.x(0).rank();
  return rank ? std::size_t(c.axis(c.attrs().get_int("axis"), rank)) : 0;
}
std::size_t last_axis(const ReferenceArgs& c) {
  if (c.x(0).rank() < 1) c.fail("needs rank >= 1");
  return c.x(0).rank() - 1;
}

F64Value matmul(const ReferenceArgs& c, const F64Value& a, const F64Value& b) {
  if (a.rank() < 2 || b.rank() < 2 || a.ext[a.rank() - 1] != b.ext[b.rank() - 2])
    c.fail("matmul needs [..,M,K] x [..,K,N], got " + extents_str(a.ext) + " x " + extents_str(b.ext));
  std::int64_t M = a.ext[a.rank() - 2], K = a.ext[a.rank() - 1], N = b.ext[b.rank() - 1];
  Extents ab(a.ext.begin(), a.ext.end() - 2), bb(b.ext.begin(), b.ext.end() - 2);
  Extents batch = broadcast_extents(c, ab, bb);
  auto ma = broadcast_map(c, ab, batch), mb = broadcast_map(c, bb, batch);
  Extents out = batch;
  out.insert(out.end(), {M, N});
  F64Value r(c.n.dtype, out);
  for (std::size_t i = 0; i < ma.size(); ++i) {
    const double *pa = a.v.data() + ma[i] * M * K, *pb = b.v.data() + mb[i] * K * N;
    double* pr = r.v.data() + std::int64_t(i) * M * N;
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (std::int64_t k = 0; k < K; ++k) acc += pa[m * K + k] * pb[k * N + n];
        pr[m * N + n] = acc;
      }
  }
  return r;
}

struct Split {
  std::int64_t outer = 1, n = 1, inner = 1;
};
// [outer, n, inner] around `axis`.
Split split_at(const Extents& e, std::size_t axis) {
  Split s;
  for (std::size_t d = 0; d < e.size(); ++d) (d < axis ? s.outer : d == axis ? s.n : s.inner) *= e[d];
  return s;
}

F64Value softmax(const ReferenceArgs& c, const F64Value& x, bool log) {
  // A scalar is a row of one.
  auto axis = x.rank() ? std::size_t(c.axis(c.attrs().int_or("axis", -1), x.rank())) : 0;
  const Split s = split_at(x.ext, axis);
  F64Value r(c.n.dtype, x.ext);
  for (std::int64_t o = 0; o < s.outer; ++o)
    for (std::int64_t i = 0; i < s.inner; ++i) {
      const double* p = x.v.data() + o * s.n * s.inner + i;
      double* q = r.v.data() + o * s.n * s.inner + i;
      double m = -INFINITY, sum = 0;
      for (std::int64_t k = 0; k < s.n; ++k) m = std::fmax(m, p[k * s.inner]);
      for (std::int64_t k = 0; k < s.n; ++k) sum += std::exp(p[k * s.inner] - m);
      for (std::int64_t k = 0; k < s.n; ++k)
        q[k * s.inner] = log ? p[k * s.inner] - m - std::log(sum) : std::exp(p[k * s.inner] - m) / sum;
    }
  return r;
}

// Normalizes rows of `m` trailing elements; gamma/beta broadcast over a row.
F64Value normalize(const ReferenceArgs& c, const F64Value& x, std::size_t axis, bool rms, const F64Value* gamma,
                   const F64Value* beta) {
  Extents row(x.ext.begin() + std::ptrdiff_t(axis), x.ext.end());
  std::int64_t m = numel(row), rows = numel(Extents(x.ext.begin(), x.ext.begin() + std::ptrdiff_t(axis)));
  std::vector<std::int64_t> mg, mb;
  if (gamma) mg = broadcast_map(c, gamma->ext, row);
  if (beta) mb = broadcast_map(c, beta->ext, row);
  double eps = c.attrs().get_float("eps");
  F64Value r(c.n.dtype, x.ext);
  for (std::int64_t i = 0; i < rows; ++i) {
    const double* p = x.v.data() + i * m;
    double mean = 0, var = 0;
    if (!rms) {
      for (std::int64_t j = 0; j < m; ++j) mean += p[j];
      mean /= double(m);
    }
    for (std::int64_t j = 0; j < m; ++j) var += (p[j] - mean) * (p[j] - mean);
    double inv = 1 / std::sqrt(var / double(m) + eps);
    for (std::int64_t j = 0; j < m; ++j) {
      double y = (p[j] - mean) * inv;
      if (gamma) y *= gamma->v[mg[j]];
      if (beta) y += beta->v[mb[j]];
      r.v[std::size_t(i * m + j)] = y;
    }
  }
  return r;
}

// The backward of softmax (log: of log_softmax) from its result y and the
// cotangent dy: y (dy - sum(dy y)), or dy - exp(y) sum(dy).
F64Value softmax_backward(const ReferenceArgs& c, const F64Value& y, const F64Value& dy, bool log) {
  auto axis = y.rank() ? std::size_t(c.axis(c.attrs().get_int("axis"), y.rank())) : 0;
  const Split s = split_at(y.ext, axis);
  F64Value r(c.n.dtype, y.ext);
  for (std::int64_t o = 0; o < s.outer; ++o)
    for (std::int64_t i = 0; i < s.inner; ++i) {
      auto at = [&](std::int64_t k) { return std::size_t(o * s.n * s.inner + i + k * s.inner); };
      double sum = 0;
      for (std::int64_t k = 0; k < s.n; ++k) sum += log ? dy.v[at(k)] : dy.v[at(k)] * y.v[at(k)];
      for (std::int64_t k = 0; k < s.n; ++k)
        r.v[at(k)] = log ? dy.v[at(k)] - std::exp(y.v[at(k)]) * sum : y.v[at(k)] * (dy.v[at(k)] - sum);
    }
  return r;
}

// The backward of layer_norm (rms: of rms_norm) with respect to x, per row of
// m elements with xhat = (x - mean) r and g = dy gamma:
// r (g - mean(g) - xhat mean(g xhat)), without the mean terms for rms.
F64Value normalize_backward(const ReferenceArgs& c, const F64Value& x, const F64Value& dy, std::size_t axis, bool rms,
                            const F64Value* gamma) {
  Extents row(x.ext.begin() + std::ptrdiff_t(axis), x.ext.end());
  std::int64_t m = numel(row), rows = numel(Extents(x.ext.begin(), x.ext.begin() + std::ptrdiff_t(axis)));
  std::vector<std::int64_t> mg;
  if (gamma) mg = broadcast_map(c, gamma->ext, row);
  double eps = c.attrs().get_float("eps");
  F64Value r(c.n.dtype, x.ext);
  std::vector<double> xhat(static_cast<std::size_t>(m)), g(static_cast<std::size_t>(m));
  for (std::int64_t i = 0; i < rows; ++i) {
    const double *p = x.v.data() + i * m, *d = dy.v.data() + i * m;
    double mean = 0, var = 0, mean_g = 0, mean_gx = 0;
    if (!rms) {
      for (std::int64_t j = 0; j < m; ++j) mean += p[j];
      mean /= double(m);
    }
    for (std::int64_t j = 0; j < m; ++j) var += (p[j] - mean) * (p[j] - mean);
    double inv = 1 / std::sqrt(var / double(m) + eps);
    for (std::size_t j = 0; j < std::size_t(m); ++j) {
      xhat[j] = (p[j] - mean) * inv;
      g[j] = gamma ? d[j] * gamma->v[std::size_t(mg[j])] : d[j];
      mean_g += g[j];
      mean_gx += g[j] * xhat[j];
    }
    mean_g = rms ? 0 : mean_g / double(m);
    mean_gx /= double(m);
    for (std::size_t j = 0; j < std::size_t(m); ++j)
      r.v[std::size_t(i * m) + j] = inv * (g[j] - mean_g - xhat[j] * mean_gx);
  }
  return r;
}

F64Value linear(const ReferenceArgs& c, const F64Value& x, const F64Value& w, const F64Value* b) {
  if (w.rank() != 2 || x.rank() < 1 || x.ext.back() != w.ext[0])
    c.fail("linear needs x[..., in] and w[in, out], got " + extents_str(x.ext) + " and " + extents_str(w.ext));
  std::int64_t in = w.ext[0], out = w.ext[1];
  Extents oe = x.ext;
  oe.back() = out;
  std::int64_t rows = numel(Extents(x.ext.begin(), x.ext.end() - 1));
  F64Value r(c.n.dtype, oe);
  std::vector<std::int64_t> mb;
  if (b) mb = broadcast_map(c, b->ext, oe);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < out; ++j) {
      double acc = 0;
      for (std::int64_t k = 0; k < in; ++k) acc += x.v[i * in + k] * w.v[k * out + j];
      std::size_t at = std::size_t(i * out + j);
      r.v[at] = b ? acc + b->v[mb[at]] : acc;
    }
  return r;
}

// conv1d/conv2d over x[N, C, spatial...] and w[O, C/groups, kernel...].
F64Value conv(const ReferenceArgs& c, const F64Value& x, const F64Value& w, const F64Value* b, std::size_t nsp) {
  if (x.rank() != nsp + 2 || w.rank() != nsp + 2)
    c.fail("conv needs input and weight of rank " + std::to_string(nsp + 2) + ", got " + extents_str(x.ext) + " and " +
           extents_str(w.ext));
  std::int64_t N = x.ext[0], C = x.ext[1], O = w.ext[0], Cg = w.ext[1], G = c.attrs().int_or("groups", 1);
  if (G < 1 || C % G || O % G || Cg != C / G)
    c.fail("conv channels: input " + extents_str(x.ext) + ", weight " + extents_str(w.ext) + ", groups " +
           std::to_string(G));
  Extents stride = c.ints_n("stride", Extents(nsp, 1)), pad = c.ints_n("padding", Extents(nsp, 0)),
          dil = c.ints_n("dilation", Extents(nsp, 1));
  Extents in_sp(x.ext.begin() + 2, x.ext.end()), k_sp(w.ext.begin() + 2, w.ext.end()), out_ext{N, O};
  for (std::size_t d = 0; d < nsp; ++d) {
    std::int64_t span = in_sp[d] + 2 * pad[d] - dil[d] * (k_sp[d] - 1) - 1;
    if (span < 0 || stride[d] < 1) c.fail("conv window does not fit the padded input " + extents_str(x.ext));
    out_ext.push_back(span / stride[d] + 1);
  }
  Extents out_sp(out_ext.begin() + 2, out_ext.end());
  auto xs = ir::contiguous_strides(x.ext), ws = ir::contiguous_strides(w.ext);
  F64Value r(c.n.dtype, out_ext);
  std::int64_t per_group = O / G, n_out = numel(out_sp);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < O; ++o)
      for_each_index(out_sp, [&](const Extents& op, std::int64_t flat) {
        double acc = b ? b->v[std::size_t(o)] : 0.0;
        for (std::int64_t ci = 0; ci < Cg; ++ci) {
          std::int64_t ch = (o / per_group) * Cg + ci;
          for_each_index(k_sp, [&](const Extents& kp, std::int64_t) {
            std::int64_t xo = n * xs[0] + ch * xs[1], wo = o * ws[0] + ci * ws[1];
            for (std::size_t d = 0; d < nsp; ++d) {
              std::int64_t pos = op[d] * stride[d] - pad[d] + kp[d] * dil[d];
              if (pos < 0 || pos >= in_sp[d]) return;
              xo += pos * xs[d + 2];
              wo += kp[d] * ws[d + 2];
            }
            acc += x.v[std::size_t(xo)] * w.v[std::size_t(wo)];
          });
        }
        r.v[std::size_t((n * O + o) * n_out + flat)] = acc;
      });
  return r;
}

// Pools the last two dims. Max ignores padding; avg counts it as zeros.
F64Value pool(const ReferenceArgs& c, const F64Value& x, bool is_max) {
  if (x.rank() < 2) c.fail("pooling needs rank >= 2, got " + extents_str(x.ext));
  Extents kernel = c.ints_n("kernel", Extents(2, 1)), stride = c.ints_n("stride", kernel),
          pad = c.ints_n("padding", Extents(2, 0));
  std::int64_t H = x.ext[x.rank() - 2], W = x.ext[x.rank() - 1];
  std::int64_t spans[2] = {H + 2 * pad[0] - kernel[0], W + 2 * pad[1] - kernel[1]};
  if (spans[0] < 0 || spans[1] < 0 || stride[0] < 1 || stride[1] < 1 || kernel[0] < 1 || kernel[1] < 1)
    c.fail("pool window does not fit the padded input " + extents_str(x.ext));
  std::int64_t OH = spans[0] / stride[0] + 1, OW = spans[1] / stride[1] + 1;
  Extents out = x.ext;
  out[x.rank() - 2] = OH;
  out[x.rank() - 1] = OW;
  F64Value r(c.n.dtype, out);
  std::int64_t planes = numel(Extents(x.ext.begin(), x.ext.end() - 2));
  for (std::int64_t p = 0; p < planes; ++p)
    for (std::int64_t oh = 0; oh < OH; ++oh)
      for (std::int64_t ow = 0; ow < OW; ++ow) {
        double acc = is_max ? -INFINITY : 0.0;
        for (std::int64_t kh = 0; kh < kernel[0]; ++kh)
          for (std::int64_t kw = 0; kw < kernel[1]; ++kw) {
            std::int64_t h = oh * stride[0] - pad[0] + kh, w = ow * stride[1] - pad[1] + kw;
            if (h < 0 || h >= H || w < 0 || w >= W) continue;
            double v = x.v[std::size_t((p * H + h) * W + w)];
            if (!is_max)
              acc += v;
            else if (!std::isnan(acc) && (std::isnan(v) || v > acc))
              acc = v;  // NaN propagates
          }
        r.v[std::size_t((p * OH + oh) * OW + ow)] = is_max ? acc : acc / double(kernel[0] * kernel[1]);
      }
  return r;
}

F64Value embedding(const ReferenceArgs& c, const F64Value& table, const F64Value& ids) {
  if (table.rank() < 1) c.fail("embedding table must have rank >= 1");
  Extents out = ids.ext;
  out.insert(out.end(), table.ext.begin() + 1, table.ext.end());
  std::int64_t row = numel(Extents(table.ext.begin() + 1, table.ext.end()));
  F64Value r(c.n.dtype, out);
  for (std::size_t i = 0; i < ids.v.size(); ++i)
    std::copy_n(table.v.begin() + c.index(ids.v[i], table.ext[0]) * row, row, r.v.begin() + std::int64_t(i) * row);
  return r;
}

// softmax(q k^T * scale + mask) v over q[..., Sq, D], k[..., Sk, D], v[..., Sk, Dv].
// causal hides key j from query i when j > i (top-left aligned, as torch).
// t [B, Hkv, S, D] with each head repeated `group` times: [B, Hkv * group, S, D] (grouped-query attention).
F64Value repeat_heads(const F64Value& t, std::int64_t group) {
  Extents ext = t.ext;
  ext[1] *= group;
  F64Value r(t.dtype, ext);
  const std::int64_t plane = t.ext[2] * t.ext[3];
  for (std::int64_t bh = 0; bh < ext[0] * ext[1]; ++bh) {
    const std::int64_t src = (bh / ext[1]) * t.ext[1] + (bh % ext[1]) / group;
    std::copy_n(t.v.begin() + src * plane, plane, r.v.begin() + bh * plane);
  }
  return r;
}

F64Value attention(const ReferenceArgs& c, const F64Value& q, const F64Value& k_in, const F64Value& v_in,
                   const F64Value* mask) {
  if (q.rank() < 2 || k_in.rank() != q.rank() || v_in.rank() != q.rank())
    c.fail("attention needs q, k, v of equal rank >= 2");
  const bool grouped = q.rank() == 4 && k_in.ext[1] != q.ext[1];
  if (grouped && (k_in.ext[1] == 0 || q.ext[1] % k_in.ext[1] != 0 || v_in.ext[1] != k_in.ext[1]))
    c.fail("attention: q's heads are not a multiple of k's and v's");
  const std::int64_t group = grouped ? q.ext[1] / k_in.ext[1] : 1;
  const F64Value k = grouped ? repeat_heads(k_in, group) : k_in, v = grouped ? repeat_heads(v_in, group) : v_in;
  std::size_t r2 = q.rank() - 2;
  std::int64_t Sq = q.ext[r2], D = q.ext[r2 + 1], Sk = k.ext[r2], Dv = v.ext[r2 + 1];
  if (k.ext[r2 + 1] != D || v.ext[r2] != Sk)
    c.fail("attention shapes q " + extents_str(q.ext) + ", k " + extents_str(k.ext) + ", v " + extents_str(v.ext) +
           " disagree");
  auto batch_of = [&](const F64Value& t) { return Extents(t.ext.begin(), t.ext.begin() + std::ptrdiff_t(r2)); };
  Extents batch = broadcast_extents(c, broadcast_extents(c, batch_of(q), batch_of(k)), batch_of(v));
  auto mq = broadcast_map(c, batch_of(q), batch), mk = broadcast_map(c, batch_of(k), batch),
       mv = broadcast_map(c, batch_of(v), batch);
  Extents scores_ext = batch;
  scores_ext.insert(scores_ext.end(), {Sq, Sk});
  std::vector<std::int64_t> mm;
  if (mask) mm = broadcast_map(c, mask->ext, scores_ext);
  bool bool_mask = mask && mask->dtype == ir::DType::Bool, causal = c.attrs().bool_or("causal", false);
  double scale = c.attrs().float_or("scale", 0.0);
  if (scale == 0) scale = 1 / std::sqrt(double(D));
  Extents out_ext = batch;
  out_ext.insert(out_ext.end(), {Sq, Dv});
  F64Value r(c.n.dtype, out_ext);
  std::vector<double> s(static_cast<std::size_t>(Sk));
  for (std::size_t b = 0; b < mq.size(); ++b)
    for (std::int64_t i = 0; i < Sq; ++i) {
      const double* qi = q.v.data() + (mq[b] * Sq + i) * D;
      double m = -INFINITY, sum = 0;
      for (std::int64_t j = 0; j < Sk; ++j) {
        const double* kj = k.v.data() + (mk[b] * Sk + j) * D;
        double dot = 0;
        for (std::int64_t d = 0; d < D; ++d) dot += qi[d] * kj[d];
        double sc = dot * scale;
        if (mask) {
          double mval = mask->v[mm[(std::int64_t(b) * Sq + i) * Sk + j]];
          sc = bool_mask ? (mval != 0 ? sc : -INFINITY) : sc + mval;
        }
        if (causal && j > i) sc = -INFINITY;
        s[j] = sc;
        m = std::fmax(m, sc);
      }
      // A fully masked row is 0/0 = NaN, as torch's math attention gives.
      for (auto& e : s) sum += (e = std::exp(e - m));
      double* o = r.v.data() + (std::int64_t(b) * Sq + i) * Dv;
      for (std::int64_t j = 0; j < Sk; ++j) {
        const double* vj = v.v.data() + (mv[b] * Sk + j) * Dv;
        for (std::int64_t d = 0; d < Dv; ++d) o[d] += s[j] / sum * vj[d];
      }
    }
  return r;
}

F64Value rope(const ReferenceArgs& c, const F64Value& x, const F64Value& cos, const F64Value& sin) {
  const std::size_t rank = x.rank();
  if (rank < 1 || x.ext[rank - 1] % 2 != 0) c.fail("rope needs an even last dim, got " + extents_str(x.ext));
  const std::int64_t D = x.ext[rank - 1], half = D / 2, rows = D ? std::int64_t(x.v.size()) / D : 0;
  const bool interleaved = c.attrs().get_bool("interleaved");
  Extents hx = x.ext;
  hx[rank - 1] = half;
  const auto mc = broadcast_map(c, cos.ext, hx), ms = broadcast_map(c, sin.ext, hx);
  F64Value r(c.n.dtype, x.ext);
  for (std::int64_t row = 0; row < rows; ++row)
    for (std::int64_t i = 0; i < half; ++i) {
      const std::int64_t a = row * D + (interleaved ? 2 * i : i), b = a + (interleaved ? 1 : half);
      const double co = cos.v[std::size_t(mc[std::size_t(row * half + i)])];
      const double si = sin.v[std::size_t(ms[std::size_t(row * half + i)])];
      r.v[std::size_t(a)] = x.v[std::size_t(a)] * co - x.v[std::size_t(b)] * si;
      r.v[std::size_t(b)] = x.v[std::size_t(a)] * si + x.v[std::size_t(b)] * co;
    }
  return r;
}

}  // namespace ref

// ---- derivatives (the ops without a rule here are differentiated through
// their decompositions) ----
namespace grad {

using Vjp = std::function<std::vector<Tangent>(const DerivativeArgs&, NodeId, const std::vector<bool>&)>;

const Shape& shape(const DerivativeArgs& s, std::size_t k) { return s.in(k).shape; }

std::vector<Tangent> matmul_vjp(const DerivativeArgs& s, NodeId ct, const std::vector<bool>& want) {
  Graph& g = s.g;
  std::vector<Tangent> d(2);
  if (want[0]) d[0] = unbroadcast(g, g.matmul(ct, g.transpose(s.x[1])), shape(s, 0));
  if (want[1]) d[1] = unbroadcast(g, g.matmul(g.transpose(s.x[0]), ct), shape(s, 1));
  return d;
}

// Bilinear ops (matmul, linear, conv): the sum of the op with one operand's
// tangent in place at a time, plus `extra` for a bias's.
Tangent bilinear_jvp(const DerivativeArgs& s, std::span<const Tangent> t, Tangent extra = std::nullopt) {
  std::vector<NodeId> terms;
  if (t[0]) terms.push_back(s.g.add(s.n.op, {*t[0], s.x[1]}, s.n.attrs));
  if (t[1]) terms.push_back(s.g.add(s.n.op, {s.x[0], *t[1]}, s.n.attrs));
  if (extra) terms.push_back(*extra);
  return sum_terms(s.g, terms, s.n.shape);
}

// Rows of x and of the output cotangent as matrices, so that dW is one matmul.
NodeId linear_dw(const DerivativeArgs& s, NodeId ct) {
  Graph& g = s.g;
  auto rows = [&](NodeId v, const Shape& sh) {
    const std::size_t r = sh.rank();
    if (r == 1) return g.reshape(v, Shape(std::vector<Dim>{Dim(1), sh[0]}));
    if (r == 2 || !sh.is_static()) return v;  // symbolic batch dims: batched matmul, summed below
    i64 n = 1;
    for (std::size_t d = 0; d + 1 < r; ++d) n *= sh[d].size;
    return g.reshape(v, Ints{n, sh[r - 1].size});
  };
  NodeId m = g.matmul(g.transpose(rows(s.x[0], shape(s, 0))), rows(ct, s.n.shape));
  Ints batch(g.node(m).shape.rank() - 2);
  std::iota(batch.begin(), batch.end(), 0);
  return batch.empty() ? m : g.sum(m, batch);
}

std::vector<Tangent> linear_vjp(const DerivativeArgs& s, NodeId ct, const std::vector<bool>& want) {
  Graph& g = s.g;
  std::vector<Tangent> d(s.n.inputs.size());
  if (want[0]) d[0] = g.linear(ct, g.transpose(s.x[1]));
  if (want[1]) d[1] = linear_dw(s, ct);
  if (s.n.inputs.size() == 3 && want[2]) {
    Ints lead(s.n.shape.rank() - 1);
    std::iota(lead.begin(), lead.end(), 0);
    d[2] = lead.empty() ? ct : g.sum(ct, lead);
  }
  return d;
}

Tangent linear_jvp(const DerivativeArgs& s, std::span<const Tangent> t) {
  return bilinear_jvp(s, t, t.size() == 3 ? t[2] : std::nullopt);
}

// A bias of [O] as [O, 1, ..] so that it broadcasts over N, C, spatial.
Tangent conv_jvp(const DerivativeArgs& s, std::span<const Tangent> t) {
  Tangent bias;
  if (t.size() == 3 && t[2]) {
    std::vector<Dim> dims(s.n.shape.rank() - 1, Dim(1));
    dims[0] = shape(s, 2)[0];
    bias = s.g.reshape(*t[2], Shape(std::move(dims)));
  }
  return bilinear_jvp(s, t, bias);
}

// y * (v - sum(v * y)), as the fused backward op: the softmax Jacobian is
// symmetric, so both modes use it.
NodeId softmax_map(const DerivativeArgs& s, NodeId v) {
  return s.g.add(OpKind::SoftmaxBackward, {s.y, v}, {{"axis", s.n.attrs.get_int("axis")}});
}

std::vector<Tangent> log_softmax_vjp(const DerivativeArgs& s, NodeId ct, const std::vector<bool>&) {
  return {s.g.add(OpKind::LogSoftmaxBackward, {s.y, ct}, {{"axis", s.n.attrs.get_int("axis")}})};
}

// v - softmax(x) sum(v)
Tangent log_softmax_jvp(const DerivativeArgs& s, std::span<const Tangent> t) {
  if (!t[0]) return std::nullopt;
  const i64 ax = ir::normalize_axis(s.n.attrs.get_int("axis"), s.n.shape.rank());
  return s.g.sub(*t[0], s.g.sum(s.g.mul(s.g.exp(s.y), *t[0]), {ax}, true));
}

// layer_norm and rms_norm: dx by their fused backward op; d gamma and d beta
// sum the cotangent (times the normalized x, the op without its affine part)
// over the leading dims.
std::vector<Tangent> norm_vjp(const DerivativeArgs& s, NodeId ct, const std::vector<bool>& want) {
  Graph& g = s.g;
  const Node& n = s.n;
  const bool rms = n.op == OpKind::RmsNorm;
  const std::size_t rank = n.shape.rank();
  const std::size_t axis = rms ? rank - 1 : std::size_t(ir::normalize_axis(n.attrs.get_int("axis"), rank));
  Ints lead(axis);
  std::iota(lead.begin(), lead.end(), 0);
  auto over_rows = [&](NodeId v) { return lead.empty() ? v : g.sum(v, lead); };
  std::vector<Tangent> d(n.inputs.size());
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

Tangent same(const DerivativeArgs& s, std::span<const Tangent> t) {
  if (!t[0]) return std::nullopt;
  return same_op(s, {*t[0]});
}

}  // namespace grad

// ---- batching (the ops without a rule here are batched through their
// decompositions) ----
namespace batch {

using ir::with_attr;

BatchedValue along_axis(const BatchArgs& a) {
  if (a.rank(0) == 0) return a.scalar_as_row();
  return BatchArgs::out(a.g.add(a.n.op, {a.x[0].id}, with_attr(a.n, "axis", a.axis1(0))));
}

// softmax's and log_softmax's backward ops: both operands lifted.
BatchedValue softmax_backward(const BatchArgs& a) {
  if (a.rank(0) == 0) return a.scalar_as_row();
  return BatchArgs::out(a.g.add(a.n.op, {a.lifted(0), a.lifted(1)}, with_attr(a.n, "axis", a.axis1(0))));
}

// linear and rms_norm with only x batched keep their op; layer_norm shifts its axis.
BatchedValue first_batched(const BatchArgs& a) {
  if (!a.only_first_batched()) return a.decomposed();
  return BatchArgs::out(a.g.add(a.n.op, a.ids(), a.n.attrs));
}
BatchedValue layer_norm(const BatchArgs& a) {
  if (a.rank(0) == 0) return a.scalar_as_row();
  if (!a.only_first_batched()) return a.decomposed();
  return BatchArgs::out(a.g.add(a.n.op, a.ids(), with_attr(a.n, "axis", a.axis1(0))));
}

BatchedValue norm_backward(const BatchArgs& a) {
  if (a.n.op == OpKind::LayerNormBackward && a.rank(0) == 0) return a.scalar_as_row();
  if (a.x.size() == 3 && a.x[2].batched) return a.decomposed();
  std::vector<NodeId> ins{a.lifted(0), a.lifted(1)};
  if (a.x.size() == 3) ins.push_back(a.x[2].id);
  return BatchArgs::out(a.g.add(a.n.op, std::move(ins),
                                a.n.op == OpKind::RmsNormBackward ? a.n.attrs : with_attr(a.n, "axis", a.axis1(0))));
}

BatchedValue embedding(const BatchArgs& a) {
  if (a.x[0].batched) return a.decomposed();
  return BatchArgs::out(a.g.add(OpKind::Embedding, {a.x[0].id, a.x[1].id}, a.n.attrs));
}

// conv and pooling: the batch merged into N.
BatchedValue conv(const BatchArgs& a) {
  if (!a.only_first_batched() || !a.mergeable()) return a.decomposed();
  auto ins = a.ids();
  ins[0] = a.merge(ins[0]);
  return BatchArgs::out(a.split(a.g.add(a.n.op, std::move(ins), a.n.attrs)));
}
BatchedValue pool(const BatchArgs& a) {
  if (!a.mergeable()) return a.decomposed();
  return BatchArgs::out(a.split(a.g.add(a.n.op, {a.merge(a.x[0].id)}, a.n.attrs)));
}

// The batch merged into B; a mask per sequence is expanded and merged too.
BatchedValue attention(const BatchArgs& a) {
  const Shape& qs = a.shape(0);
  if (!a.size.is_static() || !qs[0].is_static()) return a.decomposed();
  std::vector<NodeId> ins;
  for (std::size_t k = 0; k < 3; ++k) ins.push_back(a.merge(a.lifted(k)));
  if (a.x.size() == 4) {
    const Shape& ms = a.shape(3);
    const bool per_sequence = ms.rank() == 4 && !(ms[0].is_static() && ms[0].size == 1);
    if (!a.x[3].batched && !per_sequence) {
      ins.push_back(a.x[3].id);  // broadcasts over the merged batch as it did over N
    } else {
      Shape scores(std::vector<Dim>{qs[0], qs[1], qs[2], a.shape(1)[2]});
      NodeId m = a.x[3].batched ? ir::align(a.g, a.x[3].id, ms.rank(), 4) : a.x[3].id;
      ins.push_back(a.merge(a.g.expand(m, ir::prepend(a.size, scores))));
    }
  }
  return BatchArgs::out(a.split(a.g.add(OpKind::Attention, std::move(ins), a.n.attrs)));
}

}  // namespace batch

}  // namespace
}  // namespace rlx::ops

RLX_OP_FAMILY(nn) {
  using namespace rlx::ops;
  using rlx::ir::define_op;
  const std::vector<AttrSpec> axis{{"axis", T::Int, true}};
  const std::vector<AttrSpec> layer_norm_attrs{{"axis", T::Int, true}, {"eps", T::Float, false, 1e-5}};
  const std::vector<AttrSpec> rms_norm_attrs{{"eps", T::Float, false, 1e-6}};
  const std::vector<AttrSpec> conv_attrs{
      {"stride", T::Ints, true}, {"padding", T::Ints, true}, {"dilation", T::Ints, true}, {"groups", T::Int, true}};
  const std::vector<AttrSpec> pool_attrs{
      {"kernel", T::Ints, true}, {"stride", T::Ints, true}, {"padding", T::Ints, true}};
  define_op({.kind = OpKind::MatMul,
             .doc = "[..,M,K] x [..,K,N], batch dims broadcast",
             .operands = {"a", "b"},
             .infer = matmul_infer,
             .reference = [](const ReferenceArgs& c) { return ref::matmul(c, c.x(0), c.x(1)); },
             .vjp = grad::matmul_vjp,
             .jvp = [](const DerivativeArgs& s, std::span<const Tangent> t) { return grad::bilinear_jvp(s, t); },
             .vmap = batch_elementwise,
             .flops = matmul_flops});
  define_op({.kind = OpKind::Linear,
             .doc = "x w + b, w as [in, out]",
             .operands = {"x", "w", "b?"},
             .infer = linear_infer,
             .decompose = via(linear),
             .reference = [](const ReferenceArgs& c) { return ref::linear(c, c.x(0), c.x(1), ref::optional(c, 2)); },
             .vjp = grad::linear_vjp,
             .jvp = grad::linear_jvp,
             .vmap = batch::first_batched});
  define_op({.kind = OpKind::Softmax,
             .doc = "softmax along `axis`",
             .operands = {"x"},
             .attrs = axis,
             .infer = same_with_axis,
             .decompose = via([](const Ctx& c) { return softmax(c.g, c.in[0], c.n.attrs.get_int("axis")); }),
             .reference = [](const ReferenceArgs& c) { return ref::softmax(c, c.x(0), false); },
             .vjp = [](const DerivativeArgs& s, NodeId ct, const std::vector<bool>&) -> std::vector<Tangent> {
               return {grad::softmax_map(s, ct)};
             },
             .jvp = [](const DerivativeArgs& s, std::span<const Tangent> t) -> Tangent {
               if (!t[0]) return std::nullopt;
               return grad::softmax_map(s, *t[0]);
             },
             .vmap = batch::along_axis});
  define_op({.kind = OpKind::LogSoftmax,
             .doc = "log-softmax along `axis`",
             .operands = {"x"},
             .attrs = axis,
             .infer = same_with_axis,
             .decompose = via([](const Ctx& c) { return log_softmax(c.g, c.in[0], c.n.attrs.get_int("axis")); }),
             .reference = [](const ReferenceArgs& c) { return ref::softmax(c, c.x(0), true); },
             .vjp = grad::log_softmax_vjp,
             .jvp = grad::log_softmax_jvp,
             .vmap = batch::along_axis});
  define_op({.kind = OpKind::LayerNorm,
             .doc = "normalized over dims [axis..), then * gamma + beta",
             .operands = {"x", "gamma?", "beta?"},
             .attrs = layer_norm_attrs,
             .infer = layer_norm_infer,
             .decompose = via(layer_norm),
             .reference =
                 [](const ReferenceArgs& c) {
                   return ref::normalize(c, c.x(0), ref::norm_axis(c), false, ref::optional(c, 1), ref::optional(c, 2));
                 },
             .vjp = grad::norm_vjp,
             .vmap = batch::layer_norm});
  define_op({.kind = OpKind::RmsNorm,
             .doc = "x / rms(x) over the last dim, then * gamma",
             .operands = {"x", "gamma?"},
             .attrs = rms_norm_attrs,
             .infer = rms_norm_infer,
             .decompose = via(rms_norm),
             .reference =
                 [](const ReferenceArgs& c) {
                   return ref::normalize(c, c.x(0), ref::last_axis(c), true, ref::optional(c, 1), nullptr);
                 },
             .vjp = grad::norm_vjp,
             .vmap = batch::first_batched});
  define_op({.kind = OpKind::GroupNorm,
             .doc = "per sample, normalized over each of num_groups channel groups, then * gamma + beta per channel",
             .operands = {"x", "gamma?", "beta?"},
             .attrs = {{"num_groups", T::Int, true}, {"eps", T::Float, false, 1e-5}},
             .infer = group_norm_infer,
             .decompose = group_norm_decompose,
             .reference = group_norm_reference,
             .flops_per_element = 8});
  define_op({.kind = OpKind::Conv1d,
             .doc = "x [N,C,L], w [O,C/g,k]",
             .operands = {"x", "w", "b?"},
             .attrs = conv_attrs,
             .infer = [](const InferArgs& a) { return window_infer(a, 1, false); },
             .decompose = via([](const Ctx& c) { return conv(c, 1); }),
             .reference = [](const ReferenceArgs& c) { return ref::conv(c, c.x(0), c.x(1), ref::optional(c, 2), 1); },
             .jvp = grad::conv_jvp,
             .vmap = batch::conv});
  define_op({.kind = OpKind::Conv2d,
             .doc = "x [N,C,H,W], w [O,C/g,kh,kw]",
             .operands = {"x", "w", "b?"},
             .attrs = conv_attrs,
             .infer = [](const InferArgs& a) { return window_infer(a, 2, false); },
             .decompose = via([](const Ctx& c) { return conv(c, 2); }),
             .reference = [](const ReferenceArgs& c) { return ref::conv(c, c.x(0), c.x(1), ref::optional(c, 2), 2); },
             .jvp = grad::conv_jvp,
             .vmap = batch::conv});
  define_op({.kind = OpKind::MaxPool2d,
             .doc = "max over windows of the last two dims",
             .operands = {"x"},
             .attrs = pool_attrs,
             .infer = [](const InferArgs& a) { return window_infer(a, 2, true); },
             .decompose = via([](const Ctx& c) { return pool2d(c, true); }),
             .reference = [](const ReferenceArgs& c) { return ref::pool(c, c.x(0), true); },
             .vmap = batch::pool});
  define_op({.kind = OpKind::AvgPool2d,
             .doc = "mean over windows of the last two dims (padding counts)",
             .operands = {"x"},
             .attrs = pool_attrs,
             .infer = [](const InferArgs& a) { return window_infer(a, 2, true); },
             .decompose = via([](const Ctx& c) { return pool2d(c, false); }),
             .reference = [](const ReferenceArgs& c) { return ref::pool(c, c.x(0), false); },
             .jvp = grad::same,
             .vmap = batch::pool});
  define_op({.kind = OpKind::Embedding,
             .doc = "rows of `table` picked by `ids`",
             .operands = {"table", "ids"},
             .storage_operands = {0},
             .selector_operands = {1},
             .infer = embedding_infer,
             .decompose = via([](const Ctx& c) {
               const bool block = rlx::ir::is_block_quantized(c.arg(0).dtype);
               return c.g.index_select(block ? c.g.dequantize(c.in[0]) : c.in[0], c.in[1], 0);
             }),
             .reference = [](const ReferenceArgs& c) { return ref::embedding(c, c.x(0), c.x(1)); },
             .vmap = batch::embedding});
  define_op({.kind = OpKind::Attention,
             .doc = "softmax(q k^T scale [+ mask]) v; a bool mask keeps True",
             .operands = {"q", "k", "v", "mask?"},
             .selector_operands = {3},  // a bool mask; a float one is added to the scores
             .attrs = {{"causal", T::Bool, true}, {"scale", T::Float, true}},
             .infer = attention_infer,
             .decompose = via(attention),
             .reference =
                 [](const ReferenceArgs& c) { return ref::attention(c, c.x(0), c.x(1), c.x(2), ref::optional(c, 3)); },
             .vmap = batch::attention});
  define_op({.kind = OpKind::SoftmaxBackward,
             .doc = "softmax's input cotangent from (y, dy)",
             .operands = {"y", "dy"},
             .attrs = axis,
             .infer = softmax_backward_infer,
             .decompose = via([](const Ctx& c) { return softmax_backward(c, false); }),
             .reference = [](const ReferenceArgs& c) { return ref::softmax_backward(c, c.x(0), c.x(1), false); },
             .vmap = batch::softmax_backward});
  define_op({.kind = OpKind::LogSoftmaxBackward,
             .doc = "log_softmax's input cotangent from (y, dy)",
             .operands = {"y", "dy"},
             .attrs = axis,
             .infer = softmax_backward_infer,
             .decompose = via([](const Ctx& c) { return softmax_backward(c, true); }),
             .reference = [](const ReferenceArgs& c) { return ref::softmax_backward(c, c.x(0), c.x(1), true); },
             .vmap = batch::softmax_backward});
  define_op({.kind = OpKind::LayerNormBackward,
             .doc = "layer_norm's input cotangent from (x, dy, gamma?)",
             .operands = {"x", "dy", "gamma?"},
             .attrs = layer_norm_attrs,
             .infer = [](const InferArgs& a) { return norm_backward_infer(a, false); },
             .decompose = via([](const Ctx& c) { return norm_backward(c, false); }),
             .reference =
                 [](const ReferenceArgs& c) {
                   return ref::normalize_backward(c, c.x(0), c.x(1), ref::norm_axis(c), false, ref::optional(c, 2));
                 },
             .vmap = batch::norm_backward});
  define_op({.kind = OpKind::RmsNormBackward,
             .doc = "rms_norm's input cotangent from (x, dy, gamma?)",
             .operands = {"x", "dy", "gamma?"},
             .attrs = rms_norm_attrs,
             .infer = [](const InferArgs& a) { return norm_backward_infer(a, true); },
             .decompose = via([](const Ctx& c) { return norm_backward(c, true); }),
             .reference =
                 [](const ReferenceArgs& c) {
                   return ref::normalize_backward(c, c.x(0), c.x(1), ref::last_axis(c), true, ref::optional(c, 2));
                 },
             .vmap = batch::norm_backward});
  define_op({.kind = OpKind::Rope,
             .doc = "rotary positions: each pair of x's last dim (2i, 2i+1; or i, i + D/2 unless interleaved) "
                    "rotated by (cos[i], sin[i])",
             .operands = {"x", "cos", "sin"},
             .attrs = {{"interleaved", T::Bool, false, true}},
             .infer = rope_infer,
             .decompose = via(rope),
             .reference = [](const ReferenceArgs& c) { return ref::rope(c, c.x(0), c.x(1), c.x(2)); },
             .flops_per_element = 3});
  // `rlx new-op --builtin NAME --kind composite` adds a composite's entry above this line.
}
