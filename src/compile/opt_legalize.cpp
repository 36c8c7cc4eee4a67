// Legalization toward what kernels expect: explicit broadcasting ranks and
// batch dims, and dtypes the backend computes in.
#include <algorithm>
#include <functional>

#include "rlx/compile/passes_extra.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/compile/rewrite.hpp"

namespace rlx::compile::passes {

namespace {

using ir::Dim;
using ir::NodeId;
using ir::OpKind;
using ir::Shape;

std::vector<Dim> dims_of(const Shape& s, std::size_t from, std::size_t to) {
  return {s.dims().begin() + std::ptrdiff_t(from), s.dims().begin() + std::ptrdiff_t(to)};
}
std::vector<Dim> batch_of(const Shape& s) { return dims_of(s, 0, s.rank() - 2); }

// Elementwise kernels index every operand with the output's rank.
std::optional<NodeId> lift_ranks(Rewriter& r, const ir::Node& n) {
  auto& out = r.out();
  auto ins = r.mapped_inputs(n);
  bool changed = false;
  for (auto& id : ins) {
    Shape s = out.node(id).shape;
    if (s.rank() >= n.shape.rank()) continue;
    std::vector<Dim> dims(n.shape.rank() - s.rank(), Dim(1));
    dims.insert(dims.end(), s.dims().begin(), s.dims().end());
    id = out.reshape(id, Shape(std::move(dims)));
    changed = true;
  }
  if (!changed) return std::nullopt;
  return out.add(n.op, std::move(ins), n.attrs);
}

// Leaves matmul kernels with equal batch dims on both sides, or a plain 2-D GEMM.
std::optional<NodeId> legalize_matmul(Rewriter& r, const ir::Node& n) {
  auto& out = r.out();
  NodeId a = r.map(n.inputs[0]), b = r.map(n.inputs[1]);
  Shape sa = out.node(a).shape, sb = out.node(b).shape;
  auto bb = batch_of(sb);
  bool b_is_matrix = std::all_of(bb.begin(), bb.end(), [](const Dim& d) { return d == Dim(1); });
  auto rows = dims_of(sa, 0, sa.rank() - 1);
  // A shared weight: fold a's batch into M for one big GEMM. Needs static
  // batch and M dims, since a product of symbols is not a Dim.
  if (sa.rank() > 2 && b_is_matrix &&
      std::all_of(rows.begin(), rows.end(), [](const Dim& d) { return d.is_static(); })) {
    std::int64_t m = 1;
    for (const auto& d : rows) m *= d.size;
    // A cast stays next to the matmul (the reshape goes under it): a backend that reads widened operands as
    // stored (BackendTraits::matmul_widened_operands) finds the cast as the matmul's operand.
    auto reshape = [&](NodeId x, Shape s) {
      const ir::Node& xn = out.node(x);
      if (xn.op != OpKind::Cast) return out.reshape(x, std::move(s));
      const ir::DType to = xn.dtype;
      return out.cast(out.reshape(xn.inputs[0], std::move(s)), to);
    };
    if (sb.rank() > 2) b = reshape(b, Shape(dims_of(sb, sb.rank() - 2, sb.rank())));
    auto a2 = reshape(a, Shape(std::vector<Dim>{Dim(m), sa[sa.rank() - 1]}));
    return out.reshape(out.matmul(a2, b), n.shape);
  }
  auto ob = batch_of(n.shape);
  auto widen = [&](NodeId x, const Shape& s) {
    if (batch_of(s) == ob) return x;
    auto dims = ob;
    dims.push_back(s[s.rank() - 2]);
    dims.push_back(s[s.rank() - 1]);
    return out.expand(x, Shape(std::move(dims)));
  };
  auto a2 = widen(a, sa), b2 = widen(b, sb);
  if (a2 == a && b2 == b) return std::nullopt;
  return out.matmul(a2, b2);
}

// The dtype the op's arithmetic runs in, which is not the result dtype for
// comparisons, argmax/argmin (inputs) and where (its value operands).
ir::DType compute_dtype(const ir::Graph& g, const ir::Node& n) {
  if (ir::is_comparison(n.op) || n.op == OpKind::ArgMax || n.op == OpKind::ArgMin) return g.node(n.inputs[0]).dtype;
  if (n.op == OpKind::Where) return g.node(n.inputs[1]).dtype;
  return n.dtype;
}

// Rewrites nodes for which `needs(n, compute dtype)` holds to compute in f32:
// their operands of the compute dtype are cast to f32 and the result is cast
// back. Casts are exempt: they are how every other op is legalized, so
// backends must provide them for all dtypes.
ir::Graph compute_in_f32(const ir::Graph& g, const std::function<bool(const ir::Node&, ir::DType)>& needs) {
  return rewrite(g, [&](Rewriter& r, const ir::Node& n) -> std::optional<NodeId> {
    if (ir::op_info(n.op).cls == ir::OpClass::Leaf || n.op == OpKind::Cast) return std::nullopt;
    auto t = compute_dtype(g, n);
    if (!needs(n, t)) return std::nullopt;
    auto& out = r.out();
    auto ins = r.mapped_inputs(n);
    for (auto& id : ins)
      if (out.node(id).dtype == t) id = out.cast(id, ir::DType::F32);
    auto y = n.op == OpKind::Reshape || n.op == OpKind::Expand
                 ? out.add_declared(n.op, std::move(ins), n.attrs, ir::DType::F32, n.shape)
                 : out.add(n.op, std::move(ins), n.attrs);
    return out.node(y).dtype == n.dtype ? y : out.cast(y, n.dtype);
  });
}

}  // namespace

ir::Graph legalize_broadcast(const ir::Graph& g) {
  return rewrite(g, [](Rewriter& r, const ir::Node& n) -> std::optional<NodeId> {
    if (ir::op_info(n.op).cls == ir::OpClass::Binary || n.op == OpKind::Where) return lift_ranks(r, n);
    if (n.op == OpKind::MatMul) return legalize_matmul(r, n);
    return std::nullopt;
  });
}

// Only float compute dtypes are legalized: an integer op moved to f32 would
// lose exactness past 2^24 and change division/modulo semantics, so an
// unsupported integer dtype is left for the backend to reject by name.
ir::Graph legalize_dtypes(const ir::Graph& g, const std::set<ir::DType>& native) {
  return compute_in_f32(
      g, [&](const ir::Node&, ir::DType t) { return ir::is_float(t) && t != ir::DType::F32 && !native.contains(t); });
}

ir::Graph legalize_f32_compute(const ir::Graph& g, const std::set<ir::OpKind>& f32_ops) {
  return compute_in_f32(g, [&](const ir::Node& n, ir::DType t) {
    return (t == ir::DType::F16 || t == ir::DType::BF16) && f32_ops.contains(n.op);
  });
}

}  // namespace rlx::compile::passes
