// Shape and dtype inference: the checks every op shares (the operand count, the
// operands' existence, the required attributes), then the op's own rule, from
// its entry in the op table (rlx/ir/op_def.hpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <string>

#include "rlx/error.hpp"
#include "rlx/ir/graph.hpp"
#include "rlx/ir/limits.hpp"
#include "rlx/ir/op_def.hpp"

namespace rlx::ir {

namespace {

[[noreturn]] void fail(const Graph& g, OpKind op, std::span<const NodeId> inputs, const std::string& what) {
  std::string s = std::string(op_name(op)) + " with inputs (";
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (i) s += ", ";
    if (i == limits::kMaxListedItems && inputs.size() > limits::kMaxListedItems + 1) {
      s += "... and " + std::to_string(inputs.size() - i) + " more";
      break;
    }
    if (inputs[i] < g.size()) {
      const Node& n = g.nodes()[inputs[i]];
      s += "%" + std::to_string(n.id) + ": " + std::string(dtype_name(n.dtype)) + n.shape.str();
    } else {
      s += "%" + std::to_string(inputs[i]) + ": <undefined>";
    }
  }
  throw Error(s + "): " + what);
}

}  // namespace

namespace {

TypeInfo infer_unchecked(const Graph& g, OpKind op, std::span<const NodeId> inputs, const Attrs& attrs,
                         const TypeInfo* declared) {
  const OpInfo& info = op_info(op);
  auto n_in = static_cast<int>(inputs.size());
  if (n_in < info.min_inputs || n_in > info.max_inputs)
    fail(g, op, inputs,
         "expects " +
             (info.min_inputs == info.max_inputs
                  ? std::to_string(info.min_inputs)
                  : std::to_string(info.min_inputs) + " to " + std::to_string(info.max_inputs)) +
             " inputs, got " + std::to_string(n_in));
  for (auto id : inputs)
    if (id >= g.size()) fail(g, op, inputs, "input %" + std::to_string(id) + " does not exist");
  auto in = [&](int i) -> const Node& { return g.nodes()[inputs[static_cast<std::size_t>(i)]]; };
  auto require = [&](bool ok, const std::string& what) {
    if (!ok) fail(g, op, inputs, what);
  };
  try {
    for (const auto& spec : op_attr_schema(op))
      if (spec.required && !attrs.has(spec.key)) require(false, "missing attribute '" + std::string(spec.key) + "'");

    const OpDef& def = op_def(op);
    for (int i = 0; i < n_in; ++i) {
      const DType t = in(i).dtype;
      if (!is_block_quantized(t) && !is_storage_only(t)) continue;
      const auto& ops = def.storage_operands;
      const bool listed = std::find(ops.begin(), ops.end(), std::size_t(i)) != ops.end() ||
                          std::find(ops.begin(), ops.end(), kAnyOperand) != ops.end();
      const StorageKind kind = is_block_quantized(t) ? StorageKind::Block : StorageKind::Element;
      if (listed && def.storage == kind) continue;
      if (kind == StorageKind::Block)
        require(false, "operand " + std::to_string(i) + " is " + std::string(dtype_name(t)) +
                           ", a block-quantized type: only dequantize, quantized_matmul and embedding read one");
      require(false, "operand " + std::to_string(i) + " is " + std::string(dtype_name(t)) +
                         ", a storage-only type: only cast and the movement ops take one (cast it to a type " +
                         op_name(op).data() + " computes with)");
    }
    const auto& rule = def.infer;
    require(bool(rule), "has no inference rule in the op table");
    std::vector<TypeInfo> ins;
    for (int i = 0; i < n_in; ++i) ins.push_back({in(i).dtype, in(i).shape});
    return rule(InferArgs{ins, attrs, declared});
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.rfind(std::string(op_name(op)) + " with inputs", 0) == 0) throw;
    fail(g, op, inputs, msg);
  }
}

}  // namespace

TypeInfo infer_type(const Graph& g, OpKind op, std::span<const NodeId> inputs, const Attrs& attrs,
                    const TypeInfo* declared) {
  TypeInfo t = infer_unchecked(g, op, inputs, attrs, declared);
  // The one gate every node's shape passes: custom ops' infer rules, declared
  // leaves and inferred results alike.
  try {
    check_shape(t.shape, "the result");
  } catch (const Error& e) {
    fail(g, op, inputs, e.what());
  }
  // A block-typed result (a declared leaf, quantize) needs whole blocks in each row.
  if (is_block_quantized(t.dtype) && t.shape.is_static()) {
    try {
      (void)storage_bytes(t.dtype, t.shape.extents());
    } catch (const Error& e) {
      fail(g, op, inputs, e.what());
    }
  }
  // A declaration that inference contradicts is an error, whichever op it is on (never silently replaced).
  if (declared && (declared->dtype != t.dtype || declared->shape != t.shape))
    fail(g, op, inputs,
         "declared " + std::string(dtype_name(declared->dtype)) + declared->shape.str() + " but inference gives " +
             std::string(dtype_name(t.dtype)) + t.shape.str());
  return t;
}

}  // namespace rlx::ir
