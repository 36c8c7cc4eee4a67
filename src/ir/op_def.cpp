#include "rlx/ir/op_def.hpp"

#include <array>
#include <cassert>
#include <string>

#include "rlx/error.hpp"

namespace rlx::ir {

namespace {

constexpr std::size_t kNumOps = std::size(kAllOps);

struct Table {
  std::array<OpDef, kNumOps> defs;
  std::array<bool, kNumOps> defined{};
};

// Filled by the families' static initializers (src/ops/), which run when
// librlx loads; constructed on first use so their order does not matter.
Table& table() {
  static Table t;
  return t;
}

DType compute_dtype(DType t) { return t == DType::F16 || t == DType::BF16 ? DType::F32 : t; }

}  // namespace

void InferArgs::fail(const std::string& why) const { throw Error(why); }

const OpDef& op_def(OpKind k) {
  const auto i = static_cast<std::size_t>(k);
  // Reached before src/ops/ registered the op: a static initializer elsewhere
  // used the table too early, or a family file is not linked in.
  if (i >= kNumOps || !table().defined[i])
    throw Error("op #" + std::to_string(i) + " has no entry in the op table (src/ops/ registers every op)");
  return table().defs[i];
}

void define_op(OpDef def) {
  const auto i = static_cast<std::size_t>(def.kind);
  Table& t = table();
  if (t.defined[i]) throw Error("op '" + std::string(op_name(def.kind)) + "' is defined twice in the op table");
  for (const AttrSpec& s : def.attrs)
    if (s.default_value && s.required)
      throw Error("op '" + std::string(op_name(def.kind)) + "': attribute '" + std::string(s.key) +
                  "' is required and has a default");
  t.defs[i] = std::move(def);
  t.defined[i] = true;
}

const std::vector<AttrSpec>& op_attr_schema(OpKind k) { return op_def(k).attrs; }

double estimated_numel(const Shape& s) {
  double e = 1;
  for (const auto& d : s.dims()) e *= d.is_static() ? double(d.size) : 1.0;
  return e;
}

double op_flops(OpKind k, std::span<const TypeInfo> in, const TypeInfo& out) {
  const OpDef& def = op_def(k);
  return def.flops ? def.flops(in, out) : estimated_numel(out.shape) * def.flops_per_element;
}

void fill_default_attrs(OpKind k, Attrs& attrs) {
  for (const AttrSpec& s : op_def(k).attrs)
    if (s.default_value && !attrs.has(s.key)) attrs.set(std::string(s.key), *s.default_value);
}

Expr apply(OpKind op, Expr x) { return {x.graph(), x.graph().unary(op, x.id())}; }
Expr apply(OpKind op, Expr a, Expr b) {
  assert(&a.graph() == &b.graph());
  return {a.graph(), a.graph().binary(op, a.id(), b.id())};
}
Expr where(Expr cond, Expr a, Expr b) { return {a.graph(), a.graph().where(cond.id(), a.id(), b.id())}; }

// For t > -1 finite; softplus, its one user, passes t in (0, 1].
Expr log1p(Expr t) {
  Expr u = t + 1.0;
  Expr u_minus_1 = u - 1.0;
  Expr exact = apply(OpKind::Eq, u_minus_1, t.constant(0.0));
  // The branch not taken still gets a derivative (0 times its own): a divisor
  // of 1 there keeps it finite, so the gradient is never 0 * inf = NaN.
  Expr divisor = where(exact, t.constant(1.0), u_minus_1);
  return where(exact, t, log(u) * t / divisor);
}

NodeId expand_op(Graph& g, const Node& n, std::span<const NodeId> in) {
  const OpDef& def = op_def(n.op);
  if (def.decompose) return def.decompose(DecomposeArgs{g, in, n});
  if (!def.formula) throw Error(std::string(op_name(n.op)) + " has no decomposition");
  // The formula runs in the compute dtype, so a narrow result is rounded once, as a fused kernel would.
  std::vector<Expr> x;
  for (NodeId id : in) {
    const DType t = g.node(id).dtype, ct = compute_dtype(t);
    x.emplace_back(g, ct == t ? id : g.cast(id, ct));
  }
  NodeId r = def.formula(x).id();
  return g.node(r).dtype == n.dtype ? r : g.cast(r, n.dtype);
}

CastMode cast_mode(const Attrs& attrs) {
  CastMode m;
  m.saturate = attrs.bool_or("saturate", true);
  if (attrs.has("round_mode")) m.round = parse_e8m0_round(attrs.get_str("round_mode"));
  return m;
}

}  // namespace rlx::ir
