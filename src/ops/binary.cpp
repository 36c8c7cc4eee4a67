// Binary elementwise ops (NumPy broadcasting, one dtype) and where.
#include "ops/family.hpp"

RLX_OP_FAMILY(binary) {
  using namespace rlx::ops;
  auto plain = [](OpKind k, std::string_view doc) {
    rlx::ir::define_op({.kind = k, .doc = doc, .operands = {"a", "b"}});
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
  rlx::ir::define_op({.kind = OpKind::Where, .doc = "cond ? a : b", .operands = {"cond", "a", "b"}});
}
