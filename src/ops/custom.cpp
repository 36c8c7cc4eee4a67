// The open seam: a custom op names its extension (rlx/ir/custom_op.hpp), whose
// own schema types its other attributes (attr_schema_of) and whose own rule
// infers its result.
#include <string>

#include "ops/family.hpp"
#include "rlx/ir/custom_op.hpp"

namespace rlx::ops {
namespace {

ir::TypeInfo custom_infer(const ir::InferArgs& a) {
  auto ext = ir::find_op_extension(a.attrs.get_str("op"));
  for (const auto& spec : ext->attr_schema())
    a.require(!spec.required || a.attrs.has(spec.key), "missing attribute '" + std::string(spec.key) + "'");
  const auto n = static_cast<int>(a.inputs.size());
  a.require(ext->num_inputs() < 0 || n == ext->num_inputs(), "custom op '" + std::string(ext->name()) + "' takes " +
                                                                 std::to_string(ext->num_inputs()) + " inputs, got " +
                                                                 std::to_string(n));
  return ext->infer(a.inputs, a.attrs);
}

}  // namespace
}  // namespace rlx::ops

RLX_OP_FAMILY(custom) {
  using namespace rlx::ops;
  rlx::ir::define_op({.kind = OpKind::Custom,
                      .doc = "an op from the extension registry, by name",
                      .operands = {"inputs..."},
                      .attrs = {{"op", T::String, true}},
                      .infer = custom_infer});
}
