// Reductions over axes.
#include "ops/family.hpp"

RLX_OP_FAMILY(reduce) {
  using namespace rlx::ops;
  auto reduce = [](OpKind k, std::string_view doc) {
    rlx::ir::define_op(
        {.kind = k, .doc = doc, .operands = {"x"}, .attrs = {{"axes", T::Ints, true}, {"keepdims", T::Bool, true}}});
  };
  reduce(OpKind::ReduceSum, "sum over `axes`");
  reduce(OpKind::ReduceMean, "mean over `axes`");
  reduce(OpKind::ReduceMax, "maximum over `axes`");
  reduce(OpKind::ReduceMin, "minimum over `axes`");
  reduce(OpKind::ReduceProd, "product over `axes`");
  auto arg = [](OpKind k, std::string_view doc) {
    rlx::ir::define_op(
        {.kind = k, .doc = doc, .operands = {"x"}, .attrs = {{"axis", T::Int, true}, {"keepdims", T::Bool, true}}});
  };
  arg(OpKind::ArgMax, "index of the first maximum along `axis` (i64)");
  arg(OpKind::ArgMin, "index of the first minimum along `axis` (i64)");
}
