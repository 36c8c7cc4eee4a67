// decompose: HIR -> MIR. Every composite the backend does not claim becomes
// primitives, and so does every elementwise op with a formula: both are the
// op's entry in the op table (rlx/ir/op_def.hpp, src/ops/). squeeze and
// unsqueeze become reshape so MIR has a single reshape op.
#include <string>

#include "rlx/compile/pipeline.hpp"
#include "rlx/compile/rewrite.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/op_def.hpp"

namespace rlx::compile::passes {
namespace {

using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::OpKind;

// A table decomposition may use ops that decompose themselves (mish's formula
// uses softplus): it is built in a graph of its own, decomposed in turn, and
// inlined. Nesting is bounded, so a formula that uses its own op is an error.
NodeId expand_nested(Graph& out, const Node& n, const std::vector<NodeId>& in, const NativeOps& keep) {
  thread_local int depth = 0;
  constexpr int kMaxDepth = 16;
  if (depth >= kMaxDepth)
    throw Error(std::string(ir::op_name(n.op)) + ": its decomposition nests more than " + std::to_string(kMaxDepth) +
                " levels deep (does it use its own op?)");
  struct Nest {
    Nest() { ++depth; }
    ~Nest() { --depth; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;
  } nest;
  Graph one(std::string(ir::op_name(n.op)));
  std::vector<NodeId> args;
  for (std::size_t i = 0; i < in.size(); ++i)
    args.push_back(one.input("operand" + std::to_string(i), out.node(in[i]).shape, out.node(in[i]).dtype));
  one.add_output(ir::expand_op(one, n, args));
  return out.inline_graph(decompose(one, keep), in)[0];
}

}  // namespace

}  // namespace rlx::compile::passes

namespace rlx::compile {

bool NativeOps::keeps(const ir::Node& n) const {
  if (!ops.contains(n.op)) return false;
  auto it = only_at.find(n.op);
  return it == only_at.end() || it->second.contains(n.dtype);
}

}  // namespace rlx::compile

namespace rlx::compile::passes {

ir::Graph decompose(const ir::Graph& g, const NativeOps& keep, DispatchReport* report) {
  return rewrite(g, [&](Rewriter& r, const Node& n) -> std::optional<NodeId> {
    if (n.op == OpKind::Squeeze || n.op == OpKind::Unsqueeze) return r.out().reshape(r.map(n.inputs[0]), n.shape);
    const bool composite = ir::op_info(n.op).cls == ir::OpClass::Composite;
    const ir::OpDef& def = ir::op_def(n.op);
    if (!def.has_decomposition()) {
      if (composite) throw Error(ir::describe_node(g, n) + ": the op table has no decomposition for this composite");
      return std::nullopt;
    }
    if (keep.keeps(n)) {
      if (report && composite)
        report->entries.push_back({n.id, n.op, DispatchTier::Native,
                                   report->backend + " claims " + std::string(ir::op_name(n.op)) + " natively"});
      return std::nullopt;
    }
    std::size_t before = r.out().size();
    NodeId id;
    try {
      id = expand_nested(r.out(), n, r.mapped_inputs(n), keep);
    } catch (const Error& e) {
      throw Error(ir::describe_node(g, n) + ": " + e.what());
    }
    const Node& res = r.out().node(id);
    if (res.dtype != n.dtype || res.shape != n.shape)
      throw Error(ir::describe_node(g, n) + ": decomposition yields " + std::string(ir::dtype_name(res.dtype)) +
                  res.shape.str() + ", expected " + std::string(ir::dtype_name(n.dtype)) + n.shape.str());
    if (report)
      report->entries.push_back({n.id, n.op, DispatchTier::Decomposed,
                                 "decomposed into " + std::to_string(r.out().size() - before) +
                                     (def.formula ? " primitives (its formula)" : " primitives")});
    return id;
  });
}

}  // namespace rlx::compile::passes
