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

// Visits every multi-index of `extents` in row-major order.
template <class F>
void for_each_index(const Ints& extents, F&& f) {
  Ints idx(extents.size(), 0);
  for (;;) {
    f(idx);
    std::size_t d = extents.size();
    while (d > 0 && ++idx[d - 1] == extents[d - 1]) idx[--d] = 0;
    if (d == 0) return;
  }
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
    for_each_index(kernel, [&](const Ints& k) {
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
  for_each_index(kernel, [&](const Ints& k) {
    NodeId s = g.slice(x, axes, k, {k[0] + (out[0] - 1) * stride[0] + 1, k[1] + (out[1] - 1) * stride[1] + 1}, stride);
    acc = !acc ? s : is_max ? g.binary(OpKind::Max, *acc, s) : g.add(*acc, s);
  });
  return is_max ? *acc : g.div(*acc, c.scalar(double(kernel[0] * kernel[1])));
}

// softmax(q k^T * scale [+ mask]) v. Causal keeps key j for query i when
// j <= i (top-left aligned, as torch's is_causal).
NodeId attention(const Ctx& c) {
  Graph& g = c.g;
  Shape qs = c.arg(0).shape, ks = c.arg(1).shape;  // copies: emitting nodes moves g's storage
  double scale = c.n.attrs.get_float("scale");
  if (scale == 0.0) scale = 1.0 / std::sqrt(double(c.static_dim(0, qs.rank() - 1)));
  NodeId s = g.mul(g.matmul(c.in[0], g.transpose(c.in[1])), c.scalar(scale));
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
  return g.matmul(softmax(g, s, -1), c.in[2]);
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

F64Value group_norm_reference(std::span<const F64Value* const> in, const ir::Node& node) {
  const F64Value& x = *in[0];
  const i64 n = x.ext[0], c = x.ext[1], groups = node.attrs.get_int("num_groups");
  const double eps = node.attrs.get_float("eps");
  i64 spatial = 1;
  for (std::size_t d = 2; d < x.ext.size(); ++d) spatial *= x.ext[d];
  const i64 block = c / groups * spatial;  // one group of one sample is contiguous
  F64Value y{x.ext, std::vector<double>(x.v.size())};
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
             .flops_per_element = 0});  // counted from K by the cost model
  define_op({.kind = OpKind::Linear,
             .doc = "x w + b, w as [in, out]",
             .operands = {"x", "w", "b?"},
             .decompose = via(linear)});
  define_op({.kind = OpKind::Softmax,
             .doc = "softmax along `axis`",
             .operands = {"x"},
             .attrs = axis,
             .decompose = via([](const Ctx& c) { return softmax(c.g, c.in[0], c.n.attrs.get_int("axis")); })});
  define_op({.kind = OpKind::LogSoftmax,
             .doc = "log-softmax along `axis`",
             .operands = {"x"},
             .attrs = axis,
             .decompose = via([](const Ctx& c) { return log_softmax(c.g, c.in[0], c.n.attrs.get_int("axis")); })});
  define_op({.kind = OpKind::LayerNorm,
             .doc = "normalized over dims [axis..), then * gamma + beta",
             .operands = {"x", "gamma?", "beta?"},
             .attrs = layer_norm_attrs,
             .decompose = via(layer_norm)});
  define_op({.kind = OpKind::RmsNorm,
             .doc = "x / rms(x) over the last dim, then * gamma",
             .operands = {"x", "gamma?"},
             .attrs = rms_norm_attrs,
             .decompose = via(rms_norm)});
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
             .decompose = via([](const Ctx& c) { return conv(c, 1); })});
  define_op({.kind = OpKind::Conv2d,
             .doc = "x [N,C,H,W], w [O,C/g,kh,kw]",
             .operands = {"x", "w", "b?"},
             .attrs = conv_attrs,
             .decompose = via([](const Ctx& c) { return conv(c, 2); })});
  define_op({.kind = OpKind::MaxPool2d,
             .doc = "max over windows of the last two dims",
             .operands = {"x"},
             .attrs = pool_attrs,
             .decompose = via([](const Ctx& c) { return pool2d(c, true); })});
  define_op({.kind = OpKind::AvgPool2d,
             .doc = "mean over windows of the last two dims (padding counts)",
             .operands = {"x"},
             .attrs = pool_attrs,
             .decompose = via([](const Ctx& c) { return pool2d(c, false); })});
  define_op({.kind = OpKind::Embedding,
             .doc = "rows of `table` picked by `ids`",
             .operands = {"table", "ids"},
             .decompose = via([](const Ctx& c) { return c.g.index_select(c.in[0], c.in[1], 0); })});
  define_op({.kind = OpKind::Attention,
             .doc = "softmax(q k^T scale [+ mask]) v; a bool mask keeps True",
             .operands = {"q", "k", "v", "mask?"},
             .attrs = {{"causal", T::Bool, true}, {"scale", T::Float, true}},
             .decompose = via(attention)});
  define_op({.kind = OpKind::SoftmaxBackward,
             .doc = "softmax's input cotangent from (y, dy)",
             .operands = {"y", "dy"},
             .attrs = axis,
             .decompose = via([](const Ctx& c) { return softmax_backward(c, false); })});
  define_op({.kind = OpKind::LogSoftmaxBackward,
             .doc = "log_softmax's input cotangent from (y, dy)",
             .operands = {"y", "dy"},
             .attrs = axis,
             .decompose = via([](const Ctx& c) { return softmax_backward(c, true); })});
  define_op({.kind = OpKind::LayerNormBackward,
             .doc = "layer_norm's input cotangent from (x, dy, gamma?)",
             .operands = {"x", "dy", "gamma?"},
             .attrs = layer_norm_attrs,
             .decompose = via([](const Ctx& c) { return norm_backward(c, false); })});
  define_op({.kind = OpKind::RmsNormBackward,
             .doc = "rms_norm's input cotangent from (x, dy, gamma?)",
             .operands = {"x", "dy", "gamma?"},
             .attrs = rms_norm_attrs,
             .decompose = via([](const Ctx& c) { return norm_backward(c, true); })});
  // `rlx new-op --builtin NAME --kind composite` adds a composite's entry above this line.
}
