// Matmul and the composites (HIR): decomposed into primitives unless a backend
// claims them natively.
#include "ops/family.hpp"

RLX_OP_FAMILY(nn) {
  using namespace rlx::ops;
  using rlx::ir::define_op;
  const std::vector<AttrSpec> axis{{"axis", T::Int, true}};
  const std::vector<AttrSpec> layer_norm{{"axis", T::Int, true}, {"eps", T::Float, true}};
  const std::vector<AttrSpec> rms_norm{{"eps", T::Float, true}};
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
}
