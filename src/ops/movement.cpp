// Movement: reshape, permute, slicing, joining, indexing.
#include "ops/family.hpp"

RLX_OP_FAMILY(movement) {
  using namespace rlx::ops;
  using rlx::ir::define_op;
  const std::vector<AttrSpec> axis{{"axis", T::Int, true}}, axes{{"axes", T::Ints, true}};
  define_op({.kind = OpKind::Reshape, .doc = "the declared shape, same element count", .operands = {"x"}});
  define_op({.kind = OpKind::Permute,
             .doc = "axes reordered by `perm`",
             .operands = {"x"},
             .attrs = {{"perm", T::Ints, true}}});
  define_op({.kind = OpKind::Expand, .doc = "broadcast to the declared shape", .operands = {"x"}});
  define_op({.kind = OpKind::Slice,
             .doc = "x[starts:ends:steps] per axis (full rank, steps >= 1, clamped like Python)",
             .operands = {"x"},
             .attrs = {{"starts", T::Ints, true}, {"ends", T::Ints, true}, {"steps", T::Ints, true}}});
  define_op({.kind = OpKind::Concat, .doc = "joined along `axis`", .operands = {"xs..."}, .attrs = axis});
  define_op({.kind = OpKind::Pad,
             .doc = "padded by pads=[before..., after...] with `value`",
             .operands = {"x"},
             .attrs = {{"pads", T::Ints, true}, {"value", T::Float, true}}});
  define_op({.kind = OpKind::Gather,
             .doc = "torch.gather: idx has x's rank, the result idx's shape",
             .operands = {"x", "idx"},
             .attrs = axis});
  define_op({.kind = OpKind::IndexSelect,
             .doc = "numpy.take: x[:axis] + idx.shape + x[axis+1:]",
             .operands = {"x", "idx"},
             .attrs = axis});
  define_op(
      {.kind = OpKind::ScatterAdd, .doc = "torch.scatter_add", .operands = {"x", "idx", "updates"}, .attrs = axis});
  define_op({.kind = OpKind::Squeeze, .doc = "drops the size-1 `axes`", .operands = {"x"}, .attrs = axes});
  define_op({.kind = OpKind::Unsqueeze, .doc = "inserts size-1 `axes`", .operands = {"x"}, .attrs = axes});
  define_op({.kind = OpKind::Flip, .doc = "reversed along `axes`", .operands = {"x"}, .attrs = axes});
}
