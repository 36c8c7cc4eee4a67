// quant_propagate (passes_extra.hpp): keeps a quantized tensor int8 between the ops that can carry it.
//
// It reads the quantize and dequantize chains that compile::quantize writes and that ONNX's QuantizeLinear and
// DequantizeLinear import as (src/onnx/ops_nn.cpp), per tensor, to u8 or s8:
//   Q(x)   = cast<q>(clamp(round(x * inv_s + zp), lo, hi))                   compile::quantize
//          = cast<q>(clamp(round(x / s) + zp, lo, hi))                          ONNX (zp optional)
//   DQ(q)  = (cast<f32>(q) - zp) * s                                           zp optional
//   DQc(a) = (cast<f32>(a) - c) * s                                            per column, a = an i32 matmul
// where the scales and zero points are scalar constants (a zero point may be a cast constant, as ONNX's is),
// and c and s are constants of one value per column. Three rewrites:
//   1. Q(M(x)) -> M(Q(x)) for a movement op M (reshape, permute, slice, concat, squeeze, unsqueeze, flip,
//      expand): Q is elementwise, so it commutes with moving elements; and for reduce_max and reduce_min,
//      since Q never decreases (the max of the quantized values is the quantized max). M then moves bytes
//      instead of floats. Exact: Q is re-emitted as written, below M. (max_pool2d takes float inputs only in
//      RLX's IR, so a quantize stays below it.)
//   2. Q(DQ(q)) -> q when both use the same scale and zero point and the clamp is the whole range of q's type:
//      (q - zp) s / s + zp rounds back to q. Exact.
//   3. Q(relu?(DQc(a) + bias?)) -> cast<q>(clamp(round(cast<f32>(a) * m + o), lo', hi)), the requantize: the
//      dequantization, bias and quantization fold into one scale m = s inv_s and offset
//      o = (bias - c s) inv_s + zp per column, and relu into the clamp's lower end lo' = max(lo, zp)
//      (round(max(y, 0) inv_s + zp) = max(round(y inv_s + zp), zp) as zp is an integer). A bias whose values
//      are not known here (a param of the compile pipeline) stays an [N] computation, bias inv_s + (o - ...),
//      that a small kernel evaluates. The matmul's epilogue then writes the narrow type and the next int8
//      matmul reads it as stored: the activation never exists in f32. The folded constants round differently
//      from the chain they replace, so an output may move by one quantization step, rarely.
// Rewrites 1 and 2 run to a fixed point first, so a relu -> reshape -> Q chain reaches rewrite 3.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "rlx/compile/passes_extra.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/compile/rewrite.hpp"
#include "rlx/error.hpp"

namespace rlx::compile::passes {

namespace {

using ir::DType;
using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::OpKind;

// The single value of a constant of one element, or of a cast of one (ONNX's zero points).
std::optional<double> scalar_value(const Graph& g, NodeId id) {
  const Node* n = &g.node(id);
  if (n->op == OpKind::Cast && ir::is_float(n->dtype)) n = &g.node(n->inputs[0]);
  if (n->op != OpKind::Constant || !n->value || n->value->numel() != 1) return std::nullopt;
  return n->value->get(0);
}

// For a binary op with one scalar-constant operand: the other operand and the scalar.
std::optional<std::pair<NodeId, double>> with_scalar(const Graph& g, const Node& n, bool commutes) {
  if (n.inputs.size() != 2) return std::nullopt;
  if (auto v = scalar_value(g, n.inputs[1])) return std::pair{n.inputs[0], *v};
  if (commutes)
    if (auto v = scalar_value(g, n.inputs[0])) return std::pair{n.inputs[1], *v};
  return std::nullopt;
}

// The range of a quantized type, or nullopt for a type this pass does not carry.
std::optional<std::pair<double, double>> quantized_range(DType t) {
  if (t == DType::U8) return std::pair{0.0, 255.0};
  if (t == DType::I8) return std::pair{-128.0, 127.0};
  return std::nullopt;
}

struct Quantize {
  NodeId x;                   // the float value quantized
  std::vector<NodeId> chain;  // the chain's nodes, from the one reading x to the cast
  DType dtype;                // u8 or s8
  double inv_scale, zero, lo, hi;
};

std::vector<int> user_counts(const Graph& g) {
  std::vector<int> users(g.size(), 0);
  for (const auto& n : g.nodes())
    for (auto i : n.inputs) ++users[i];
  for (auto id : g.output_ids()) ++users[id];
  return users;
}

// n = cast<u8 or s8>(clamp(...)) of one of the forms above, each inner node read by the next alone.
std::optional<Quantize> match_quantize(const Graph& g, const Node& n, const std::vector<int>& users) {
  const auto range = quantized_range(n.dtype);
  if (n.op != OpKind::Cast || !range) return std::nullopt;
  std::vector<NodeId> chain{n.id};
  auto inner = [&](NodeId id, OpKind op) -> const Node* {
    const Node& m = g.node(id);
    if (m.op != op || users[id] != 1) return nullptr;
    chain.push_back(id);
    return &m;
  };
  const Node* clamp = inner(n.inputs[0], OpKind::Clamp);
  if (!clamp) return std::nullopt;
  double zero = 0;
  NodeId at = clamp->inputs[0];
  // compile::quantize's round(x * inv_s + zp), or ONNX's round(x / s) + zp, or round(x / s).
  if (const Node& m = g.node(at); m.op == OpKind::Add) {
    const auto zp = with_scalar(g, m, true);
    if (!zp || !inner(at, OpKind::Add)) return std::nullopt;
    zero = zp->second + 0.0;  // -0 (an all-positive range's zero point) reads as 0
    const Node* round = inner(zp->first, OpKind::Round);
    if (!round) return std::nullopt;
    at = round->inputs[0];
  } else {
    const Node* round = inner(at, OpKind::Round);
    if (!round) return std::nullopt;
    at = round->inputs[0];
    if (const Node& a = g.node(at); a.op == OpKind::Add) {
      const auto zp = with_scalar(g, a, true);
      if (!zp || !inner(at, OpKind::Add)) return std::nullopt;
      zero = zp->second + 0.0;
      at = zp->first;
    }
  }
  const Node& scale = g.node(at);
  if ((scale.op != OpKind::Mul && scale.op != OpKind::Div) || users[at] != 1) return std::nullopt;
  const auto s = with_scalar(g, scale, scale.op == OpKind::Mul);
  if (!s || !(s->second > 0) || !std::isfinite(s->second) || !ir::is_float(g.node(s->first).dtype)) return std::nullopt;
  chain.push_back(at);
  const double lo = clamp->attrs.get_float("min"), hi = clamp->attrs.get_float("max");
  if (zero != std::nearbyint(zero) || lo < range->first || hi > range->second || lo > hi) return std::nullopt;
  std::reverse(chain.begin(), chain.end());
  return Quantize{s->first, std::move(chain), n.dtype, scale.op == OpKind::Mul ? s->second : 1 / s->second, zero, lo,
                  hi};
}

// n = (cast<f32>(q) - zp) * s, or cast<f32>(q) * s, with q u8 or s8 (per tensor).
struct Dequantize {
  NodeId q;
  double scale, zero;
};
std::optional<Dequantize> match_dequantize(const Graph& g, const Node& n) {
  if (n.op != OpKind::Mul) return std::nullopt;
  const auto s = with_scalar(g, n, true);
  if (!s) return std::nullopt;
  NodeId at = s->first;
  double zero = 0;
  if (const Node& sub = g.node(at); sub.op == OpKind::Sub) {
    const auto zp = with_scalar(g, sub, false);
    if (!zp) return std::nullopt;
    zero = zp->second + 0.0;
    at = zp->first;
  }
  const Node& cast = g.node(at);
  if (cast.op != OpKind::Cast || !ir::is_float(cast.dtype) || !quantized_range(g.node(cast.inputs[0]).dtype))
    return std::nullopt;
  return Dequantize{cast.inputs[0], s->second, zero};
}

bool carries_quantized(OpKind op) {
  switch (op) {
    case OpKind::Reshape:
    case OpKind::Permute:
    case OpKind::Slice:
    case OpKind::Concat:
    case OpKind::Squeeze:
    case OpKind::Unsqueeze:
    case OpKind::Flip:
    case OpKind::Expand:
    case OpKind::ReduceMax:  // Q never decreases: the max (min) of quantized values is the quantized max (min)
    case OpKind::ReduceMin: return true;
    default: return false;
  }
}

// Q re-emitted as written, on `x` (a node of the output graph): each chain node copied with the one before it
// (x for the first) in place of the operand it read, its other operands (the scalars) mapped.
NodeId emit_quantize(Rewriter& r, const Graph& g, const Quantize& q, NodeId x) {
  NodeId prev_src = q.x, prev = x;
  for (const NodeId id : q.chain) {
    const Node& c = g.node(id);
    std::vector<NodeId> ins;
    for (const NodeId i : c.inputs) ins.push_back(i == prev_src ? prev : r.map(i));
    prev = r.out().add(c.op, std::move(ins), c.attrs);
    prev_src = id;
  }
  return prev;
}

// One sweep of rewrites 1 and 2; `changed` says whether any applied.
Graph move_through(const Graph& g, std::vector<std::string>* report, bool& changed) {
  const auto users = user_counts(g);
  return rewrite(g, [&](Rewriter& r, const Node& n) -> std::optional<NodeId> {
    const auto q = match_quantize(g, n, users);
    if (!q) return std::nullopt;
    const Node& x = g.node(q->x);
    if (users[x.id] == 1 && carries_quantized(x.op) && !x.inputs.empty() &&
        std::all_of(x.inputs.begin(), x.inputs.end(), [&](NodeId i) { return ir::is_float(g.node(i).dtype); })) {
      std::vector<NodeId> ins;
      for (auto i : x.inputs) ins.push_back(emit_quantize(r, g, *q, r.map(i)));
      changed = true;
      if (report)
        report->push_back(fmt::format("%{} {}: moves {} (the quantize of %{} moved above it)", x.id, ir::op_name(x.op),
                                      ir::dtype_name(q->dtype), n.id));
      return r.out().add_declared(x.op, std::move(ins), x.attrs, q->dtype, x.shape);
    }
    const auto full = quantized_range(q->dtype);
    if (const auto dq = match_dequantize(g, x);
        dq && g.node(dq->q).dtype == q->dtype && dq->zero == q->zero && q->lo == full->first && q->hi == full->second &&
        std::abs(dq->scale * q->inv_scale - 1) < 1e-6 && g.node(dq->q).shape == n.shape) {
      changed = true;
      if (report)
        report->push_back(fmt::format("%{} quantize of a dequantize (%{}) with the same scale: removed", n.id, x.id));
      return r.map(dq->q);
    }
    return std::nullopt;
  });
}

// The per-column values of an [N] (or one-element) operand: a constant's, or a param's from `params`.
std::optional<std::vector<double>> column_values(const Graph& g, NodeId id, std::int64_t cols,
                                                 const std::map<std::string, ir::Tensor, std::less<>>& params) {
  const Node& n = g.node(id);
  const ir::Tensor* t = nullptr;
  if (n.op == OpKind::Constant && n.value) t = n.value.get();
  if (n.op == OpKind::Param)
    if (auto it = params.find(n.attrs.get_str("name")); it != params.end()) t = &it->second;
  if (!t || !(t->numel() == cols || t->numel() == 1) || n.shape.rank() > 1) return std::nullopt;
  std::vector<double> v(static_cast<std::size_t>(cols));
  for (std::int64_t j = 0; j < cols; ++j) v[std::size_t(j)] = t->get(t->numel() == 1 ? 0 : j);
  return v;
}

// Rewrite 3 over `s` (after rewrites 1 and 2).
Graph requantize(const Graph& s, const std::map<std::string, ir::Tensor, std::less<>>& params,
                 std::vector<std::string>* report) {
  const auto users = user_counts(s);
  return rewrite(s, [&](Rewriter& r, const Node& n) -> std::optional<NodeId> {
    const auto q = match_quantize(s, n, users);
    if (!q) return std::nullopt;
    NodeId at = q->x;
    const bool relu = s.node(at).op == OpKind::Relu;
    if (relu) {
      if (users[at] != 1) return std::nullopt;
      at = s.node(at).inputs[0];
    }
    std::optional<NodeId> bias;
    if (const Node& a = s.node(at); a.op == OpKind::Add && users[at] == 1 && a.shape.rank() == 2) {
      const Node& l = s.node(a.inputs[0]);
      const Node& rr = s.node(a.inputs[1]);
      // The bias is the operand of at most one dim, of the sum's dtype; the dequantization the other.
      const bool left = l.op == OpKind::Mul && rr.shape.rank() <= 1 && rr.dtype == a.dtype;
      const bool right = rr.op == OpKind::Mul && l.shape.rank() <= 1 && l.dtype == a.dtype;
      if (!left && !right) return std::nullopt;
      bias = left ? a.inputs[1] : a.inputs[0];
      at = left ? a.inputs[0] : a.inputs[1];
    }
    // DQc: mul(sub(cast<f32>(acc), c), s) over [M, N], acc an i32 matmul, each read only by the next.
    const Node& mul = s.node(at);
    if (mul.op != OpKind::Mul || users[at] != 1 || mul.shape.rank() != 2 || mul.dtype != DType::F32)
      return std::nullopt;
    const Node& sub = s.node(mul.inputs[0]);
    if (sub.op != OpKind::Sub || users[sub.id] != 1) return std::nullopt;
    const Node& cast = s.node(sub.inputs[0]);
    if (cast.op != OpKind::Cast || cast.dtype != DType::F32 || users[cast.id] != 1) return std::nullopt;
    const Node& acc = s.node(cast.inputs[0]);
    if (acc.op != OpKind::MatMul || acc.dtype != DType::I32 || acc.shape != mul.shape) return std::nullopt;
    const std::int64_t cols = mul.shape[1].size;
    const auto c = column_values(s, sub.inputs[1], cols, params);
    const auto sc = column_values(s, mul.inputs[1], cols, params);
    if (!c || !sc) return std::nullopt;
    std::optional<std::vector<double>> b;
    if (bias) b = column_values(s, *bias, cols, params);
    // o without the bias when its values are unknown: the bias then adds bias * inv_s at run time.
    ir::Tensor m(DType::F32, {cols}), o(DType::F32, {cols});
    for (std::int64_t j = 0; j < cols; ++j) {
      const auto i = std::size_t(j);
      m.set(j, (*sc)[i] * q->inv_scale);
      o.set(j, ((b ? (*b)[i] : 0.0) - (*c)[i] * (*sc)[i]) * q->inv_scale + q->zero);
    }
    auto& out = r.out();
    NodeId offset = out.constant(o);
    if (bias && !b) offset = out.add(out.mul(r.map(*bias), out.scalar(q->inv_scale)), offset);
    auto v = out.unary(OpKind::Round, out.add(out.mul(out.cast(r.map(acc.id), DType::F32), out.constant(m)), offset));
    const double lo = relu ? std::max(q->lo, q->zero) : q->lo;
    if (report)
      report->push_back(fmt::format(
          "%{} matmul: requantized to {} in its epilogue (dequantize{}{} and quantize folded into one scale and "
          "offset per column{})",
          acc.id, ir::dtype_name(q->dtype), bias ? (b ? ", bias" : ", bias (a run-time [N] offset)") : "",
          relu ? ", relu" : "", relu ? fmt::format("; relu as the clamp at the zero point {}", q->zero) : ""));
    return out.cast(out.clamp(v, lo, q->hi), q->dtype);
  });
}

}  // namespace

bool has_quantize(const Graph& g) {
  return std::any_of(g.nodes().begin(), g.nodes().end(), [&](const Node& n) {
    return n.op == OpKind::Cast && quantized_range(n.dtype) && g.node(n.inputs[0]).op == OpKind::Clamp;
  });
}

Graph quant_propagate(const Graph& g, const std::map<std::string, ir::Tensor, std::less<>>& params,
                      std::vector<std::string>* report) {
  Graph cur = g;
  for (int sweep = 0; sweep < 64; ++sweep) {
    bool changed = false;
    cur = dce(move_through(cur, report, changed));  // the chains left behind would count as users
    if (!changed) break;
  }
  return dce(requantize(cur, params, report));
}

}  // namespace rlx::compile::passes
