// Matmul and the composites (HIR): decomposed into primitives unless a backend
// claims them natively.
#include <string>

#include "ops/family.hpp"
#include "rlx/error.hpp"

namespace rlx::ops {
namespace {

using ir::DecomposeArgs;
using ir::F64Value;
using ir::InferArgs;
using ir::NodeId;
using ir::Shape;
using ir::TypeInfo;

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
  const std::vector<AttrSpec> layer_norm{{"axis", T::Int, true}, {"eps", T::Float, false, 1e-5}};
  const std::vector<AttrSpec> rms_norm{{"eps", T::Float, false, 1e-6}};
  const std::vector<AttrSpec> conv{
      {"stride", T::Ints, true}, {"padding", T::Ints, true}, {"dilation", T::Ints, true}, {"groups", T::Int, true}};
  const std::vector<AttrSpec> pool{{"kernel", T::Ints, true}, {"stride", T::Ints, true}, {"padding", T::Ints, true}};
  define_op({.kind = OpKind::MatMul,
             .doc = "[..,M,K] x [..,K,N], batch dims broadcast",
             .operands = {"a", "b"},
             .flops_per_element = 0});  // counted from K by the cost model
  define_op({.kind = OpKind::Linear, .doc = "x w + b, w as [in, out]", .operands = {"x", "w", "b?"}});
  define_op({.kind = OpKind::Softmax, .doc = "softmax along `axis`", .operands = {"x"}, .attrs = axis});
  define_op({.kind = OpKind::LogSoftmax, .doc = "log-softmax along `axis`", .operands = {"x"}, .attrs = axis});
  define_op({.kind = OpKind::LayerNorm,
             .doc = "normalized over dims [axis..), then * gamma + beta",
             .operands = {"x", "gamma?", "beta?"},
             .attrs = layer_norm});
  define_op({.kind = OpKind::RmsNorm,
             .doc = "x / rms(x) over the last dim, then * gamma",
             .operands = {"x", "gamma?"},
             .attrs = rms_norm});
  define_op({.kind = OpKind::GroupNorm,
             .doc = "per sample, normalized over each of num_groups channel groups, then * gamma + beta per channel",
             .operands = {"x", "gamma?", "beta?"},
             .attrs = {{"num_groups", T::Int, true}, {"eps", T::Float, false, 1e-5}},
             .infer = group_norm_infer,
             .decompose = group_norm_decompose,
             .reference = group_norm_reference,
             .flops_per_element = 8});
  define_op({.kind = OpKind::Conv1d, .doc = "x [N,C,L], w [O,C/g,k]", .operands = {"x", "w", "b?"}, .attrs = conv});
  define_op(
      {.kind = OpKind::Conv2d, .doc = "x [N,C,H,W], w [O,C/g,kh,kw]", .operands = {"x", "w", "b?"}, .attrs = conv});
  define_op(
      {.kind = OpKind::MaxPool2d, .doc = "max over windows of the last two dims", .operands = {"x"}, .attrs = pool});
  define_op({.kind = OpKind::AvgPool2d,
             .doc = "mean over windows of the last two dims (padding counts)",
             .operands = {"x"},
             .attrs = pool});
  define_op({.kind = OpKind::Embedding, .doc = "rows of `table` picked by `ids`", .operands = {"table", "ids"}});
  define_op({.kind = OpKind::Attention,
             .doc = "softmax(q k^T scale [+ mask]) v; a bool mask keeps True",
             .operands = {"q", "k", "v", "mask?"},
             .attrs = {{"causal", T::Bool, true}, {"scale", T::Float, true}}});
  define_op({.kind = OpKind::SoftmaxBackward,
             .doc = "softmax's input cotangent from (y, dy)",
             .operands = {"y", "dy"},
             .attrs = axis});
  define_op({.kind = OpKind::LogSoftmaxBackward,
             .doc = "log_softmax's input cotangent from (y, dy)",
             .operands = {"y", "dy"},
             .attrs = axis});
  define_op({.kind = OpKind::LayerNormBackward,
             .doc = "layer_norm's input cotangent from (x, dy, gamma?)",
             .operands = {"x", "dy", "gamma?"},
             .attrs = layer_norm});
  define_op({.kind = OpKind::RmsNormBackward,
             .doc = "rms_norm's input cotangent from (x, dy, gamma?)",
             .operands = {"x", "dy", "gamma?"},
             .attrs = rms_norm});
  // `rlx new-op --builtin NAME --kind composite` adds a composite's entry above this line.
}
