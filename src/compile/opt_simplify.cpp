// Local cleanups: algebraic_simplify, cse, dce.
#include <cstring>
#include <functional>
#include <string_view>
#include <unordered_map>

#include "rlx/compile/pipeline.hpp"
#include "rlx/compile/rewrite.hpp"

namespace rlx::compile::passes {

namespace {

using ir::OpKind;

// Whether every element of `id` equals v, seeing through expand/reshape of a
// Constant (the zeros this pass itself emits are an expanded scalar).
bool splat_of(const ir::Graph& g, ir::NodeId id, double v) {
  const ir::Node* n = &g.node(id);
  while (n->op == OpKind::Expand || n->op == OpKind::Reshape) n = &g.node(n->inputs[0]);
  if (n->op != OpKind::Constant) return false;
  for (std::int64_t i = 0, e = n->value->numel(); i < e; ++i)
    if (n->value->get(i) != v) return false;
  return true;
}

// The SAME-SHAPE rule: `n` with operand x and a splat constant c reduces to x
// only if x alone already has n's dtype and shape. A constant that broadcasts
// x to a bigger shape (x:[3] * ones:[2,3]) must stay, or the output would
// shrink.
std::optional<ir::NodeId> simplify_binary(Rewriter& r, const ir::Node& n) {
  const auto& out = r.out();
  auto in = [&](int k) { return r.map(n.inputs[k]); };
  auto keeps_type = [&](ir::NodeId x) { return out.node(x).shape == n.shape && out.node(x).dtype == n.dtype; };
  // x op c (and c op x for commutative ops) where c is a splat of v.
  auto identity = [&](double v, bool commutative) -> std::optional<ir::NodeId> {
    for (int k = 0; k < (commutative ? 2 : 1); ++k)
      if (keeps_type(in(k)) && splat_of(out, in(1 - k), v)) return in(k);
    return std::nullopt;
  };
  switch (n.op) {
    // x + 0 -> x also for floats, though -0 + 0 is +0: the values compare equal.
    case OpKind::Add: return identity(0, true);
    case OpKind::Sub: return identity(0, false);
    case OpKind::Div: return identity(1, false);
    case OpKind::Mul:
      if (auto x = identity(1, true)) return x;
      // x * 0 -> 0 only for integers: for floats NaN * 0 and Inf * 0 are NaN and
      // -1 * 0 is -0, so the fold would change results.
      if (ir::is_integer(n.dtype) && identity(0, true)) {
        auto zero = r.out().scalar(0, n.dtype);
        return n.shape.rank() == 0 ? zero : r.out().expand(zero, n.shape);
      }
      return std::nullopt;
    default: return std::nullopt;
  }
}

std::optional<ir::NodeId> simplify_node(Rewriter& r, const ir::Node& n) {
  if (ir::op_info(n.op).cls == ir::OpClass::Binary) return simplify_binary(r, n);
  if (n.inputs.size() != 1) return std::nullopt;
  auto x = r.map(n.inputs[0]);
  const ir::Node& xn = r.out().node(x);
  switch (n.op) {
    case OpKind::Neg:
      if (xn.op == OpKind::Neg) return xn.inputs[0];
      return std::nullopt;
    case OpKind::Cast:
      if (xn.dtype == n.dtype) return x;
      return std::nullopt;
    case OpKind::Expand:
      if (xn.shape == n.shape) return x;
      return std::nullopt;
    case OpKind::Reshape: {
      if (xn.shape == n.shape) return x;
      if (xn.op != OpKind::Reshape) return std::nullopt;
      auto y = xn.inputs[0];
      if (r.out().node(y).shape == n.shape) return y;
      return r.out().reshape(y, n.shape);
    }
    case OpKind::Permute: {
      const auto& perm = n.attrs.get_ints("perm");
      for (std::size_t i = 0; i < perm.size(); ++i)
        if (ir::normalize_axis(perm[i], perm.size()) != std::int64_t(i)) return std::nullopt;
      return x;
    }
    default: return std::nullopt;
  }
}

// Input/Param are distinct interface slots even when declared alike; random
// ops are distinct draws by intent (two dropout masks), even with one seed.
bool mergeable(OpKind op) {
  return op != OpKind::Input && op != OpKind::Param && op != OpKind::RandomUniform && op != OpKind::RandomNormal;
}

void hash_mix(std::size_t& h, std::size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); }

// Attrs are left out of the hash and compared on lookup: nodes differing only
// in attributes are rare enough that their buckets stay short.
std::size_t node_hash(const ir::Node& n) {
  std::size_t h = std::size_t(n.op);
  hash_mix(h, std::size_t(n.dtype));
  for (auto i : n.inputs) hash_mix(h, i);
  for (const auto& d : n.shape.dims())
    hash_mix(h, d.is_static() ? std::size_t(d.size) : std::hash<std::string>{}(d.sym));
  if (n.value)
    hash_mix(h, std::hash<std::string_view>{}({reinterpret_cast<const char*>(n.value->data()), n.value->nbytes()}));
  return h;
}

// Gradient checkpointing (rlx/autodiff) tags the forward values it recomputes
// in the backward pass "recompute": merging them with the forward nodes they
// copy would keep those alive after all and undo the checkpointing.
bool recomputed(const ir::Node& n) { return n.origin.starts_with("recompute"); }

bool same_node(const ir::Node& a, const ir::Node& b) {
  if (recomputed(a) != recomputed(b)) return false;
  if (a.op != b.op || a.inputs != b.inputs || a.dtype != b.dtype || a.shape != b.shape || !(a.attrs == b.attrs))
    return false;
  if (a.op != OpKind::Constant || a.value == b.value) return true;
  // Bytes, not values: 0.0 and -0.0 differ, NaN payloads match.
  return a.value->nbytes() == b.value->nbytes() &&
         (a.value->nbytes() == 0 || std::memcmp(a.value->data(), b.value->data(), a.value->nbytes()) == 0);
}

}  // namespace

ir::Graph algebraic_simplify(const ir::Graph& g) { return rewrite(g, simplify_node); }

ir::Graph cse(const ir::Graph& g) {
  std::unordered_multimap<std::size_t, ir::NodeId> seen;  // hash -> node id in the output graph
  seen.reserve(g.size());
  return rewrite(g, [&](Rewriter& r, const ir::Node& n) -> std::optional<ir::NodeId> {
    if (!mergeable(n.op)) return std::nullopt;
    ir::Node m = n;
    m.inputs = r.mapped_inputs(n);
    auto h = node_hash(m);
    auto [lo, hi] = seen.equal_range(h);
    for (auto it = lo; it != hi; ++it)
      if (same_node(r.out().node(it->second), m)) return it->second;
    auto id = r.copy(n);
    seen.emplace(h, id);
    return id;
  });
}

ir::Graph dce(const ir::Graph& g) {
  // Inputs and Params stay even when unused: they are the graph's calling
  // interface, and callers bind them by name.
  std::vector<bool> live(g.size(), false);
  for (auto id : g.output_ids()) live[id] = true;
  for (auto id = g.size(); id-- > 0;) {
    const auto& n = g.node(ir::NodeId(id));
    if (n.op == OpKind::Input || n.op == OpKind::Param) live[id] = true;
    if (live[id])
      for (auto i : n.inputs) live[i] = true;
  }
  Rewriter r(g);
  for (const auto& n : g.nodes())
    if (live[n.id]) r.copy(n);
  return r.finish();
}

}  // namespace rlx::compile::passes
