// The precision pass (auto-mixed precision, docs/precision.md): matmuls and convolutions move to bf16 or f16
// only where the backend says that type runs faster than f32 for that op, so the mixed graph is never slower.
#include <fmt/format.h>

#include "rlx/compile/pipeline.hpp"
#include "rlx/compile/rewrite.hpp"
#include "rlx/error.hpp"

namespace rlx::compile {

std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::F32: return "f32";
    case Precision::Bf16: return "bf16";
    case Precision::F16: return "f16";
  }
  return "?";
}

Precision parse_precision(std::string_view name) {
  for (Precision p : {Precision::F32, Precision::Bf16, Precision::F16})
    if (precision_name(p) == name) return p;
  throw Error(fmt::format("unknown precision '{}': expected f32, bf16 or f16", name));
}

std::string PrecisionReport::to_text() const {
  std::string out = fmt::format("precision {}: {} ops considered\n", precision_name(policy), entries.size());
  for (const auto& e : entries)
    out += fmt::format("  %{} {}: {} ({})\n", e.node, ir::op_name(e.op), ir::dtype_name(e.dtype), e.reason);
  if (!quant_propagate.empty()) out += fmt::format("quant_propagate: {} rewrites\n", quant_propagate.size());
  for (const auto& line : quant_propagate) out += "  " + line + "\n";
  return out;
}

bool is_narrowable_weight(const ir::Node& param) {
  return param.op == ir::OpKind::Param && param.dtype == ir::DType::F32 && param.shape.is_static() &&
         param.shape.rank() == 2 && param.shape.numel() > 0;
}

namespace passes {

ir::Graph auto_mixed_precision(const ir::Graph& g, Precision policy, const BackendTraits& backend,
                               PrecisionReport* report) {
  if (report) report->policy = policy;
  if (policy == Precision::F32) return g;
  const ir::DType low = policy == Precision::Bf16 ? ir::DType::BF16 : ir::DType::F16;
  auto note = [&](const ir::Node& n, ir::DType t, std::string reason) {
    if (report) report->entries.push_back({n.id, n.op, t, std::move(reason)});
  };
  return rewrite(g, [&](Rewriter& r, const ir::Node& n) -> std::optional<ir::NodeId> {
    // The ops whose arithmetic low precision speeds up; reductions, softmax, norms and losses are not here.
    if (n.op != ir::OpKind::MatMul && n.op != ir::OpKind::Conv1d && n.op != ir::OpKind::Conv2d &&
        n.op != ir::OpKind::Attention)
      return std::nullopt;
    if (n.dtype != ir::DType::F32) {
      note(n, n.dtype, "left as written: not f32");
      return std::nullopt;
    }
    if (!backend.fast_low_precision.contains({n.op, low})) {
      note(n, ir::DType::F32,
           fmt::format("left in f32: backend '{}' has no {} {} faster than its f32 one", backend.name,
                       ir::dtype_name(low), ir::op_name(n.op)));
      return std::nullopt;
    }
    // A weight the backend rounds and packs once (matmul_narrowed_params: a static [K, N] f32 param read as B)
    // costs nothing per run, so such a matmul pays from one row; any other B is cast every run.
    const ir::Node* b = n.op == ir::OpKind::MatMul && n.inputs.size() == 2 ? &g.node(n.inputs[1]) : nullptr;
    const bool weight_packed_once =
        low == ir::DType::BF16 && backend.matmul_narrowed_params && b && is_narrowable_weight(*b);
    if (n.op == ir::OpKind::MatMul && backend.low_precision_matmul_min_rows > 0 && !weight_packed_once) {
      const auto& dims = n.shape.dims();
      std::int64_t rows = 1;
      for (std::size_t d = 0; d + 1 < dims.size(); ++d)
        rows *= dims[d].is_static() ? dims[d].size : std::int64_t(1) << 20;  // a symbolic dim: assume many rows
      if (rows < backend.low_precision_matmul_min_rows) {
        note(n, ir::DType::F32,
             fmt::format("left in f32: {} rows, below the {} at which backend '{}' gains from {}", rows,
                         backend.low_precision_matmul_min_rows, backend.name, ir::dtype_name(low)));
        return std::nullopt;
      }
    }
    auto& out = r.out();
    auto ins = r.mapped_inputs(n);
    for (auto& id : ins)
      if (out.node(id).dtype == ir::DType::F32) id = out.cast(id, low);
    const auto y = out.add(n.op, std::move(ins), n.attrs);
    note(n, low, fmt::format("{} operands, f32 accumulation, the result cast back to f32", ir::dtype_name(low)));
    return out.cast(y, ir::DType::F32);
  });
}

}  // namespace passes
}  // namespace rlx::compile
