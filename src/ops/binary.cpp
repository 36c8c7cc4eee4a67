// Binary elementwise ops (NumPy broadcasting, one dtype) and where.
#include <string>

#include "ops/family.hpp"

namespace rlx::ops {

ir::TypeInfo same_dtypes_broadcast(const ir::InferArgs& a, ir::DType* common) {
  const ir::DType x = a.inputs[0].dtype, y = a.inputs[1].dtype;
  a.require(x == y, "operand dtypes differ (" + std::string(ir::dtype_name(x)) + " vs " +
                        std::string(ir::dtype_name(y)) + "); insert a cast");
  *common = x;
  return {x, ir::broadcast_shapes(a.inputs[0].shape, a.inputs[1].shape)};
}

namespace {

ir::TypeInfo arithmetic(const ir::InferArgs& a) {
  ir::DType t{};
  ir::TypeInfo r = same_dtypes_broadcast(a, &t);
  a.require(t != ir::DType::Bool, "does not take bool operands");
  return r;
}

ir::TypeInfo comparison(const ir::InferArgs& a) {
  ir::DType t{};
  return {ir::DType::Bool, same_dtypes_broadcast(a, &t).shape};
}

ir::TypeInfo logical(const ir::InferArgs& a) {
  ir::DType t{};
  ir::TypeInfo r = same_dtypes_broadcast(a, &t);
  a.require(t == ir::DType::Bool, "needs bool operands");
  return r;
}

ir::TypeInfo where_infer(const ir::InferArgs& a) {
  a.require(a.inputs[0].dtype == ir::DType::Bool, "condition must be bool");
  a.require(a.inputs[1].dtype == a.inputs[2].dtype, "branch dtypes differ");
  return {a.inputs[1].dtype,
          ir::broadcast_shapes(ir::broadcast_shapes(a.inputs[0].shape, a.inputs[1].shape), a.inputs[2].shape)};
}

}  // namespace
}  // namespace rlx::ops

RLX_OP_FAMILY(binary) {
  using namespace rlx::ops;
  auto plain = [](OpKind k, std::string_view doc) {
    const bool cmp = rlx::ir::is_comparison(k), logic = k == OpKind::And || k == OpKind::Or;
    rlx::ir::define_op({.kind = k,
                        .doc = doc,
                        .operands = {"a", "b"},
                        .infer = cmp     ? comparison
                                 : logic ? logical
                                         : arithmetic});
  };
  plain(OpKind::Add, "a + b");
  plain(OpKind::Sub, "a - b");
  plain(OpKind::Mul, "a * b");
  plain(OpKind::Div, "a / b; integers truncate, x / 0 = 0");
  plain(OpKind::Pow, "a^b");
  plain(OpKind::Max, "the larger; NaN if either is");
  plain(OpKind::Min, "the smaller; NaN if either is");
  plain(OpKind::Mod, "remainder with the divisor's sign, like numpy");
  plain(OpKind::Eq, "a == b (bool)");
  plain(OpKind::Ne, "a != b (bool)");
  plain(OpKind::Lt, "a < b (bool)");
  plain(OpKind::Le, "a <= b (bool)");
  plain(OpKind::Gt, "a > b (bool)");
  plain(OpKind::Ge, "a >= b (bool)");
  plain(OpKind::And, "logical and (bool)");
  plain(OpKind::Or, "logical or (bool)");
  rlx::ir::define_op(
      {.kind = OpKind::Where, .doc = "cond ? a : b", .operands = {"cond", "a", "b"}, .infer = where_infer});
}
