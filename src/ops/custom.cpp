// The open seam: a custom op names its extension (rlx/ir/custom_op.hpp), whose
// own schema types its other attributes (attr_schema_of).
#include "ops/family.hpp"

RLX_OP_FAMILY(custom) {
  using namespace rlx::ops;
  rlx::ir::define_op({.kind = OpKind::Custom,
                      .doc = "an op from the extension registry, by name",
                      .operands = {"inputs..."},
                      .attrs = {{"op", T::String, true}}});
}
