// lower_to_lir: MIR -> kernels + buffers (rlx/compile/lir.hpp). Fusion is a
// greedy pass over the graph in reverse topological order: by the time a node
// is visited every consumer already sits in a kernel, so the node either
// joins the kernel(s) computing its consumers or becomes a buffer that some
// kernel writes. Consumers-first makes reduce prologues and matmul/reduce
// epilogues fall out of the same rule as elementwise chains.
#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <functional>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <string>

#include "rlx/compile/pipeline.hpp"
#include "rlx/compile/rewrite.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"

namespace rlx::compile::passes {
namespace {

using ir::DType;
using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::OpClass;
using ir::OpKind;
using ir::Shape;
using i64 = std::int64_t;

// How much elementwise work may be recomputed to keep a value out of memory:
// a cheap producer shared by two kernels is fused into both (softmax's
// exp(x - max) feeds the sum's prologue and the final division).
constexpr std::size_t kDuplicateBudget = 8;

bool is_ew(OpKind k) { return ir::is_elementwise(k); }

// Rough relative cost of recomputing an elementwise op (transcendentals ~4x).
std::size_t op_cost(OpKind k) {
  switch (k) {
    case OpKind::Exp:
    case OpKind::Log:
    case OpKind::Tanh:
    case OpKind::Sigmoid:
    case OpKind::Gelu:
    case OpKind::GeluTanh:
    case OpKind::Silu:
    case OpKind::Softplus:
    case OpKind::Erf:
    case OpKind::Sin:
    case OpKind::Cos:
    case OpKind::Pow: return 4;
    default: return 1;
  }
}

bool is_buffer_leaf(OpKind k) { return k == OpKind::Input || k == OpKind::Param || k == OpKind::Constant; }

// Elementwise fusion keeps one iteration space per kernel: a node joins when
// it broadcasts to the kernel's shape without being smaller (a smaller node
// would be recomputed for every element it is broadcast over).
bool fits(const Shape& s, const Shape& iter) {
  if (s.rank() > iter.rank()) return false;
  std::size_t off = iter.rank() - s.rank();
  for (std::size_t i = 0; i < s.rank(); ++i)
    if (s[i].size != 1 && s[i].size != iter[off + i].size) return false;
  return s.numel() == iter.numel();
}

// Byte offset when `n` reads one contiguous range of its input's bytes
// (reshape, squeeze, unsqueeze, unit-dim permutes and expands, slices that
// narrow only their outermost non-unit axis); nullopt when it moves data.
std::optional<i64> view_offset(const Graph& g, const Node& n) {
  const Node& x = g.node(n.inputs.empty() ? n.id : n.inputs[0]);
  switch (n.op) {
    case OpKind::Reshape:
    case OpKind::Squeeze:
    case OpKind::Unsqueeze: return 0;
    case OpKind::Expand: return x.shape.numel() == n.shape.numel() ? std::optional<i64>(0) : std::nullopt;
    case OpKind::Permute: {
      const auto& perm = n.attrs.get_ints("perm");
      i64 prev = -1;
      for (auto p : perm) {
        if (x.shape[std::size_t(p)].size == 1) continue;
        if (p < prev) return std::nullopt;
        prev = p;
      }
      return 0;
    }
    case OpKind::Slice: {
      const auto &st = n.attrs.get_ints("starts"), &sp = n.attrs.get_ints("steps");
      auto in = x.shape.extents(), out = n.shape.extents();
      auto strides = ir::contiguous_strides(in);
      std::size_t r = in.size(), i = 0;
      while (i < r && out[i] == 1) ++i;  // leading single indices just move the start
      if (i < r && sp[i] != 1) return std::nullopt;
      for (std::size_t j = i + 1; j < r; ++j)
        if (out[j] != in[j]) return std::nullopt;
      i64 off = 0;
      for (std::size_t j = 0; j < r; ++j) off += st[j] * strides[j];
      return off * i64(ir::dtype_size(n.dtype));
    }
    default: return std::nullopt;
  }
}

// The shape operand `o` of an elementwise node of shape `full` takes when the
// node is recomputed in the same-size shape `flat`, broadcasting as before;
// nullopt when that would mix its dims.
std::optional<Shape> reflatten(const Shape& o, const Shape& full, const Shape& flat) {
  if (o.numel() == full.numel()) return flat;
  std::size_t k = 0;  // o's dims before its last k are all 1
  for (std::size_t i = 0; i < o.rank(); ++i)
    if (o[i].size != 1) {
      k = o.rank() - i;
      break;
    }
  if (k > flat.rank() || k > full.rank()) return std::nullopt;
  for (std::size_t j = 1; j <= k; ++j)
    if (full[full.rank() - j] != flat[flat.rank() - j]) return std::nullopt;
  std::vector<ir::Dim> dims(flat.rank() - k, ir::Dim(1));
  dims.insert(dims.end(), o.dims().end() - std::ptrdiff_t(k), o.dims().end());
  return Shape(std::move(dims));
}

// legalize_broadcast runs batched matmuls as one GEMM between reshapes
// ([B,S,K] -> [B*S,K] x [K,N] -> [B*S,N] -> [B,S,N]), so the bias and
// activation after it would read a view and end the matmul kernel. This
// rewrite recomputes such elementwise consumers in the matmul's shape (their
// operands re-viewed) and moves the reshape after them. `origin` maps every
// new node to the MIR node it stands for.
struct Sunk {
  Graph g;
  std::vector<NodeId> origin;
};

Sunk sink_reshapes(const Graph& g) {
  Rewriter r(g);
  Graph& out = r.out();
  std::vector<NodeId> origin;
  std::vector<std::optional<NodeId>> flat(g.size());  // sunk nodes, in the matmul's shape
  auto flat_of = [&](NodeId o) -> std::optional<NodeId> {
    const Node& on = g.node(o);
    if (flat[o]) return flat[o];
    if (on.op == OpKind::Reshape && g.node(on.inputs[0]).op == OpKind::MatMul) return r.map(on.inputs[0]);
    return std::nullopt;
  };
  auto sink = [&](const Node& n) -> std::optional<NodeId> {
    std::optional<Shape> target;
    for (auto in : n.inputs)
      if (auto f = flat_of(in); f && g.node(in).shape == n.shape) target = out.node(*f).shape;
    if (!target || *target == n.shape) return std::nullopt;
    std::vector<std::optional<Shape>> shapes;  // per operand: its re-viewed shape, or none when already flat
    for (auto in : n.inputs) {
      auto f = flat_of(in);
      if (f && out.node(*f).shape == *target && g.node(in).shape == n.shape) {
        shapes.emplace_back();
        continue;
      }
      auto s = reflatten(g.node(in).shape, n.shape, *target);
      if (!s) return std::nullopt;
      shapes.push_back(std::move(s));
    }
    std::vector<NodeId> ins;
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      NodeId in = n.inputs[i];
      if (!shapes[i])
        ins.push_back(*flat_of(in));
      else if (*shapes[i] == g.node(in).shape)
        ins.push_back(r.map(in));
      else
        ins.push_back(out.reshape(r.map(in), *shapes[i]));
    }
    NodeId y = out.add(n.op, std::move(ins), n.attrs);
    flat[n.id] = y;
    return out.reshape(y, n.shape);
  };
  for (const auto& n : g.nodes()) {
    std::optional<NodeId> rep;
    if (is_ew(n.op)) rep = sink(n);
    if (rep)
      r.set_map(n.id, *rep);
    else
      r.copy(n);
    origin.resize(out.size(), n.id);
  }
  return {r.finish(), std::move(origin)};
}

enum class Role : std::uint8_t { Plain, Prologue, Anchor, Epilogue };

struct Group {
  KernelKind kind = KernelKind::Elementwise;
  std::map<NodeId, Role> nodes;  // computed inside the kernel
  std::vector<NodeId> outputs;   // nodes whose buffer it writes
  std::optional<NodeId> anchor;  // the reduce/matmul/movement/native/leaf op
  Shape iter;                    // elementwise: iteration shape; reduce/matmul: anchor output
  std::set<int> succ;            // kernels reading its outputs
  std::string why_not;
};

class Lowering {
 public:
  // `g` is `mir` after sink_reshapes; reports and errors name `mir` nodes.
  Lowering(const Graph& mir, const Sunk& s, const BackendTraits& bt) : mir_(mir), g_(s.g), origin_(s.origin), bt_(bt) {}
  LirModule run(std::vector<FusionRecord>* fusion);

 private:
  void analyze();
  void check_supported(const Node& n) const;
  void visit_view(const Node& n);
  void visit_elementwise(const Node& n);
  void visit_anchor(const Node& n);
  bool join_siblings(const Node& n);
  bool absorb_transposed_b(const Node& n);
  bool absorb_widened_operand(const Node& n);
  bool absorb_narrowed_param(const Node& n);
  bool absorb_attention_layout(const Node& n);
  bool absorb_attention_output_layout(const Node& n);
  bool join_readers_as_prologue(const Node& n, const std::function<bool(const Node& reader)>& accepts);
  std::optional<Role> absorb_role(int g, const Node& n, std::string& why) const;
  std::set<int> buffer_readers(const Node& n, const std::set<int>& inside) const;
  void new_group(KernelKind kind, const Node& n, std::string why);
  void add_edges(int from, const std::set<int>& to);
  bool reaches(int from, int to) const;
  std::size_t cone_cost(NodeId n) const;
  std::vector<int> kernel_order() const;
  BufferId buffer_of(NodeId n);
  void emit(int gid, std::size_t index, std::vector<FusionRecord>* fusion);

  const Graph& mir_;
  const Graph& g_;
  const std::vector<NodeId>& origin_;
  const BackendTraits& bt_;
  std::vector<std::vector<NodeId>> users_;  // live users, deduplicated
  std::vector<bool> live_, is_output_;
  std::vector<std::optional<i64>> view_;     // views: byte offset into their input
  std::vector<std::vector<int>> owners_;     // kernels computing the node (several when duplicated)
  std::vector<int> producer_;                // kernel writing the node's buffer
  std::vector<std::set<int>> view_readers_;  // views: kernels reading them (transitively)
  std::vector<Group> groups_;
  std::vector<BufferId> buf_;
  LirModule m_;
};

void Lowering::analyze() {
  auto n = g_.size();
  users_.assign(n, {});
  live_.assign(n, false);
  is_output_.assign(n, false);
  view_.assign(n, std::nullopt);
  owners_.assign(n, {});
  producer_.assign(n, -1);
  view_readers_.assign(n, {});
  buf_.assign(n, -1);
  for (auto id : g_.output_ids()) live_[id] = is_output_[id] = true;
  for (NodeId i = NodeId(n); i-- > 0;) {
    if (!live_[i]) continue;
    const Node& nd = g_.node(i);
    for (auto in : nd.inputs) {
      live_[in] = true;
      if (std::find(users_[in].begin(), users_[in].end(), i) == users_[in].end()) users_[in].push_back(i);
    }
  }
  for (const auto& nd : g_.nodes())
    if (live_[nd.id]) view_[nd.id] = view_offset(g_, nd);
}

void Lowering::check_supported(const Node& n) const {
  if (is_buffer_leaf(n.op) || view_[n.id] || bt_.native_ops.contains(n.op)) return;
  if (bt_.host_fallback && ir::op_info(n.op).cls != OpClass::Composite) return;
  throw Error(fmt::format("backend '{}' does not support op '{}' ({})", bt_.name, ir::op_name(n.op),
                          ir::describe_node(mir_, mir_.node(origin_[n.id]))));
}

// Kernels that read `n`'s buffer: consumers' kernels that do not compute `n`
// themselves, and readers of views of it.
std::set<int> Lowering::buffer_readers(const Node& n, const std::set<int>& inside) const {
  std::set<int> r;
  for (auto u : users_[n.id]) {
    if (view_[u]) {
      r.insert(view_readers_[u].begin(), view_readers_[u].end());
      continue;
    }
    for (int g : owners_[u])
      if (!inside.contains(g)) r.insert(g);
  }
  return r;
}

void Lowering::visit_view(const Node& n) { view_readers_[n.id] = buffer_readers(n, {}); }

bool Lowering::reaches(int from, int to) const {
  std::vector<bool> seen(groups_.size(), false);
  std::vector<int> stack{from};
  while (!stack.empty()) {
    int g = stack.back();
    stack.pop_back();
    if (g == to) return true;
    if (seen[std::size_t(g)]) continue;
    seen[std::size_t(g)] = true;
    for (int s : groups_[std::size_t(g)].succ) stack.push_back(s);
  }
  return false;
}

void Lowering::add_edges(int from, const std::set<int>& to) {
  for (int t : to)
    if (t != from) groups_[std::size_t(from)].succ.insert(t);
}

void Lowering::new_group(KernelKind kind, const Node& n, std::string why) {
  Group grp;
  grp.kind = kind;
  grp.nodes[n.id] = kind == KernelKind::Elementwise ? Role::Plain : Role::Anchor;
  if (kind != KernelKind::Elementwise) grp.anchor = n.id;
  grp.outputs = {n.id};
  grp.iter = n.shape;
  grp.why_not = std::move(why);
  groups_.push_back(std::move(grp));
  int id = int(groups_.size()) - 1;
  owners_[n.id] = {id};
  producer_[n.id] = id;
  add_edges(id, buffer_readers(n, {id}));
}

// Cost of the elementwise nodes upstream of `n` that duplicating it would
// recompute (stops counting past the budget).
std::size_t Lowering::cone_cost(NodeId n) const {
  std::set<NodeId> seen;
  std::vector<NodeId> stack{n};
  std::size_t cost = 0;
  while (!stack.empty() && cost <= kDuplicateBudget) {
    NodeId x = stack.back();
    stack.pop_back();
    if (!is_ew(g_.node(x).op) || !seen.insert(x).second) continue;
    cost += op_cost(g_.node(x).op);
    for (auto in : g_.node(x).inputs) stack.push_back(in);
  }
  return cost;
}

// The role `n` would take inside kernel `g` (which computes some consumer of
// n), or nullopt with the reason it cannot be fused there.
std::optional<Role> Lowering::absorb_role(int gid, const Node& n, std::string& why) const {
  const Group& grp = groups_[std::size_t(gid)];
  auto shape_ok = [&](const Shape& target) {
    if (fits(n.shape, target)) return true;
    why = fmt::format("shape change ({} into {})", n.shape.str(), target.str());
    return false;
  };
  switch (grp.kind) {
    case KernelKind::Elementwise:
      if (!bt_.fuse_elementwise) return why = "elementwise fusion disabled", std::nullopt;
      return shape_ok(grp.iter) ? std::optional(Role::Plain) : std::nullopt;
    case KernelKind::Reduce: {
      if (!bt_.fuse_reduce) return why = "reduce fusion disabled", std::nullopt;
      bool pro = false, epi = false;
      for (auto u : users_[n.id]) {
        auto it = grp.nodes.find(u);
        if (it == grp.nodes.end()) continue;
        (it->second == Role::Epilogue ? epi : pro) = true;
      }
      if (pro && epi) return why = "used by both the prologue and the epilogue of a reduce", std::nullopt;
      if (pro)
        return shape_ok(g_.node(g_.node(*grp.anchor).inputs[0]).shape) ? std::optional(Role::Prologue) : std::nullopt;
      return shape_ok(grp.iter) ? std::optional(Role::Epilogue) : std::nullopt;
    }
    case KernelKind::MatMul:
      if (!bt_.fuse_matmul_epilogue) return why = "matmul epilogue fusion disabled", std::nullopt;
      for (auto u : users_[n.id])
        if (u == *grp.anchor || (grp.nodes.contains(u) && grp.nodes.at(u) == Role::Prologue))
          return why = "matmul operands are buffers", std::nullopt;
      return shape_ok(grp.iter) ? std::optional(Role::Epilogue) : std::nullopt;
    default: why = fmt::format("consumer is a {} kernel", kernel_kind_name(grp.kind)); return std::nullopt;
  }
}

void Lowering::visit_elementwise(const Node& n) {
  std::string why;
  if (is_output_[n.id]) why = "graph output";
  std::map<int, Role> absorb;
  std::set<int> consumers;
  for (auto u : users_[n.id]) {
    if (view_[u]) {
      if (!why.empty()) continue;
      if (origin_[u] != origin_[n.id])
        why = fmt::format("consumer %{} is a view ({})", origin_[u], ir::op_name(g_.node(u).op));
      else
        why = is_output_[u] ? "graph output" : "reshaped back for its consumers";  // see sink_reshapes
      continue;
    }
    for (int g : owners_[u]) {
      if (!consumers.insert(g).second) continue;
      std::string reason;
      if (auto role = absorb_role(g, n, reason))
        absorb[g] = *role;
      else if (why.empty())
        why = reason;
    }
  }
  auto join = [&](int g, Role role) {
    groups_[std::size_t(g)].nodes[n.id] = role;
    owners_[n.id].push_back(g);
  };
  if (why.empty() && absorb.size() == consumers.size()) {
    if (absorb.size() == 1 || cone_cost(n.id) * (absorb.size() - 1) <= kDuplicateBudget) {
      for (auto [g, role] : absorb) join(g, role);
      return;
    }
  }
  if (why.empty()) why = fmt::format("producer has {} consumers", consumers.size());
  // Written once: preferably as one more output of an elementwise consumer
  // kernel with the same shape, unless a kernel reading it feeds that one.
  for (auto entry : absorb) {
    auto [g, role] = entry;
    const Group& grp = groups_[std::size_t(g)];
    if (grp.kind != KernelKind::Elementwise || grp.iter != n.shape) continue;
    auto readers = buffer_readers(n, {g});
    if (std::any_of(readers.begin(), readers.end(), [&](int r) { return reaches(r, entry.first); })) continue;
    join(g, role);
    groups_[std::size_t(g)].outputs.push_back(n.id);
    producer_[n.id] = g;
    add_edges(g, readers);
    return;
  }
  new_group(KernelKind::Elementwise, n, std::move(why));
}

void Lowering::visit_anchor(const Node& n) {
  auto cls = ir::op_info(n.op).cls;
  KernelKind kind = cls == OpClass::Reduce        ? KernelKind::Reduce
                    : cls == OpClass::MatMul      ? KernelKind::MatMul
                    : cls == OpClass::Leaf        ? KernelKind::Leaf
                    : cls == OpClass::Movement    ? KernelKind::Movement
                    : cls == OpClass::ControlFlow ? KernelKind::ControlFlow
                                                  : KernelKind::Native;
  if (kind == KernelKind::ControlFlow && join_siblings(n)) return;
  bool fusable =
      (kind == KernelKind::Reduce && bt_.fuse_reduce) || (kind == KernelKind::MatMul && bt_.fuse_matmul_epilogue);
  std::string why = kind == KernelKind::Reduce   ? "reduce fusion disabled"
                    : kind == KernelKind::MatMul ? "matmul epilogue fusion disabled"
                                                 : fmt::format("{} ops are not fused", kernel_kind_name(kind));
  std::set<int> consumers;
  bool view_user = false;
  for (auto u : users_[n.id]) {
    view_user |= view_[u].has_value();
    consumers.insert(owners_[u].begin(), owners_[u].end());
  }
  if (fusable) {
    if (is_output_[n.id])
      why = "graph output";
    else if (view_user)
      why = "consumer is a view";
    else if (consumers.size() != 1)
      why = fmt::format("producer has {} consumers", consumers.size());
    else {
      int gid = *consumers.begin();
      Group& e = groups_[std::size_t(gid)];
      if (e.kind != KernelKind::Elementwise)
        why = fmt::format("consumer is a {} kernel", kernel_kind_name(e.kind));
      else if (e.outputs.size() != 1 && !(kind == KernelKind::MatMul && bt_.matmul_multi_output_epilogue))
        why = "epilogue kernel has several outputs";
      else if (e.iter != n.shape)
        why = fmt::format("shape change ({} into {})", n.shape.str(), e.iter.str());
      else {
        // The elementwise consumer kernel becomes this op's epilogue.
        e.kind = kind;
        e.anchor = n.id;
        for (auto& [id, role] : e.nodes) role = Role::Epilogue;
        e.nodes[n.id] = Role::Anchor;
        owners_[n.id] = {gid};
        return;
      }
    }
  }
  if (absorb_transposed_b(n) || absorb_attention_layout(n) || absorb_attention_output_layout(n)) return;
  new_group(kind, n, std::move(why));
}

// A permute keeping the head dim last that only feeds attentions as q, k or v is read by those kernels in place
// (BackendTraits::attention_layout_views).
bool Lowering::absorb_attention_layout(const Node& n) {
  if (!bt_.attention_layout_views || !is_head_layout_permute(n) || is_output_[n.id] || users_[n.id].empty())
    return false;
  return join_readers_as_prologue(n, [&](const Node& reader) {
    if (reader.op != OpKind::Attention) return false;
    for (std::size_t i = 3; i < reader.inputs.size(); ++i)
      if (reader.inputs[i] == n.id) return false;  // the mask is read as a buffer
    return true;
  });
}

// `n` joins the kernel of each of its readers as a prologue when every reader is the anchor of a kernel of its
// own that `accepts` it (the richer operands BackendTraits lets a matmul or an attention read in place).
bool Lowering::join_readers_as_prologue(const Node& n, const std::function<bool(const Node& reader)>& accepts) {
  for (auto u : users_[n.id])
    if (view_[u] || owners_[u].size() != 1 || groups_[std::size_t(owners_[u][0])].anchor != u || !accepts(g_.node(u)))
      return false;
  for (auto u : users_[n.id]) {
    const int gid = owners_[u][0];
    groups_[std::size_t(gid)].nodes[n.id] = Role::Prologue;
    if (std::find(owners_[n.id].begin(), owners_[n.id].end(), gid) == owners_[n.id].end()) owners_[n.id].push_back(gid);
  }
  return true;
}

// An attention whose only reader is a permute keeping the head dim last (a movement kernel of its own) writes
// that permute's buffer itself: the movement kernel becomes the attention's, with the permute as its epilogue.
bool Lowering::absorb_attention_output_layout(const Node& n) {
  if (!bt_.attention_layout_views || n.op != OpKind::Attention || is_output_[n.id] || users_[n.id].size() != 1)
    return false;
  const NodeId u = users_[n.id][0];
  if (view_[u] || !is_head_layout_permute(g_.node(u)) || owners_[u].size() != 1) return false;
  const int gid = owners_[u][0];
  Group& grp = groups_[std::size_t(gid)];
  if (grp.kind != KernelKind::Movement || grp.anchor != u || grp.nodes.size() != 1) return false;
  grp.kind = KernelKind::Native;
  grp.anchor = n.id;
  grp.nodes[u] = Role::Epilogue;
  grp.nodes[n.id] = Role::Anchor;
  owners_[n.id] = {gid};
  return true;
}

// A permute that swaps the last two dims of every matmul's B it feeds is read
// by those kernels in place (BackendTraits::matmul_transposed_b).
bool Lowering::absorb_transposed_b(const Node& n) {
  if (!bt_.matmul_transposed_b || n.op != OpKind::Permute || is_output_[n.id] || users_[n.id].empty()) return false;
  if (!ir::swaps_last_two(n.attrs.get_ints("perm"))) return false;
  return join_readers_as_prologue(
      n, [&](const Node& reader) { return reader.op == OpKind::MatMul && reader.inputs[0] != n.id; });
}

// A widening cast that only feeds matmuls as an operand is read by those kernels in its narrow type
// (BackendTraits::matmul_widened_operands): the int8 and bf16 products of quantized and mixed-precision graphs.
bool Lowering::absorb_widened_operand(const Node& n) {
  if (!bt_.matmul_widened_operands || n.op != OpKind::Cast || is_output_[n.id] || users_[n.id].empty()) return false;
  const DType from = g_.node(n.inputs[0]).dtype;
  const bool widening = (n.dtype == DType::F32 && (from == DType::BF16 || from == DType::F16)) ||
                        (n.dtype == DType::I32 && (from == DType::I8 || from == DType::U8));
  if (!widening) return false;
  return join_readers_as_prologue(n, [](const Node& reader) { return reader.op == OpKind::MatMul; });
}

// A param narrowed to bf16 only to be widened back as the B of bf16 matmuls (their A widened from bf16 in the
// kernel too) joins those kernels as well (BackendTraits::matmul_narrowed_params): the kernel reads the f32 param
// and rounds it as it packs it, once per write of the param, where a cast kernel and a pack ran every run.
bool Lowering::absorb_narrowed_param(const Node& n) {
  if (!bt_.matmul_narrowed_params || n.op != OpKind::Cast || n.dtype != DType::BF16 || is_output_[n.id] ||
      users_[n.id].empty())
    return false;
  if (!is_narrowable_weight(g_.node(n.inputs[0]))) return false;
  std::vector<int> kernels;
  for (auto u : users_[n.id]) {
    const Node& widened = g_.node(u);
    if (widened.op != OpKind::Cast || widened.dtype != DType::F32 || view_[u] || owners_[u].empty()) return false;
    for (int gid : owners_[u]) {
      const Group& grp = groups_[std::size_t(gid)];
      if (!grp.anchor || grp.nodes.at(u) != Role::Prologue) return false;
      const Node& mm = g_.node(*grp.anchor);
      if (mm.op != OpKind::MatMul || mm.dtype != DType::F32 || mm.inputs[1] != u || mm.inputs[0] == u) return false;
      // The bf16 GEMM's A: widened from bf16 inside this kernel, already (a later node) or when its turn comes
      // (nodes are visited last to first, and absorb_widened_operand takes a cast that only matmuls read).
      const Node& a = g_.node(mm.inputs[0]);
      const bool a_from_bf16 =
          a.op == OpKind::Cast && a.dtype == DType::F32 && g_.node(a.inputs[0]).dtype == DType::BF16;
      const bool a_will_join = a.id < n.id && !is_output_[a.id] &&
                               std::all_of(users_[a.id].begin(), users_[a.id].end(),
                                           [&](NodeId r) { return g_.node(r).op == OpKind::MatMul; });
      if (!a_from_bf16 || !(grp.nodes.contains(a.id) || a_will_join)) return false;
      kernels.push_back(gid);
    }
  }
  for (int gid : kernels) {
    groups_[std::size_t(gid)].nodes[n.id] = Role::Prologue;
    if (std::find(owners_[n.id].begin(), owners_[n.id].end(), gid) == owners_[n.id].end()) owners_[n.id].push_back(gid);
  }
  return true;
}

// The results of one control-flow op share its kernel: one loop writes them all.
bool Lowering::join_siblings(const Node& n) {
  for (std::size_t gid = 0; gid < groups_.size(); ++gid) {
    Group& grp = groups_[gid];
    if (grp.kind != KernelKind::ControlFlow || !ir::are_siblings(g_.node(*grp.anchor), n)) continue;
    grp.nodes[n.id] = Role::Anchor;
    grp.outputs.push_back(n.id);
    owners_[n.id] = {int(gid)};
    producer_[n.id] = int(gid);
    add_edges(int(gid), buffer_readers(n, {int(gid)}));
    return true;
  }
  return false;
}

std::vector<int> Lowering::kernel_order() const {
  std::vector<int> indeg(groups_.size(), 0), order;
  for (const auto& grp : groups_)
    for (int s : grp.succ) ++indeg[std::size_t(s)];
  // Among ready kernels the one whose output comes first in the graph runs
  // first, which keeps the source order (and its short live ranges).
  auto key = [&](int g) {
    return *std::min_element(groups_[std::size_t(g)].outputs.begin(), groups_[std::size_t(g)].outputs.end());
  };
  auto later = [&](int a, int b) { return key(a) > key(b); };
  std::priority_queue<int, std::vector<int>, decltype(later)> ready(later);
  for (std::size_t g = 0; g < groups_.size(); ++g)
    if (indeg[g] == 0) ready.push(int(g));
  while (!ready.empty()) {
    int g = ready.top();
    ready.pop();
    order.push_back(g);
    for (int s : groups_[std::size_t(g)].succ)
      if (--indeg[std::size_t(s)] == 0) ready.push(s);
  }
  assert(order.size() == groups_.size() && "fusion created a cycle between kernels");
  return order;
}

BufferId Lowering::buffer_of(NodeId id) {
  if (buf_[id] >= 0) return buf_[id];
  const Node& n = g_.node(id);
  std::optional<BufferId> src_id;
  if (view_[id]) src_id = buffer_of(n.inputs[0]);  // may add buffers: ids are taken after it
  Buffer b;
  b.id = BufferId(m_.buffers.size());
  b.dtype = n.dtype;
  b.shape = n.shape.extents();
  b.root = b.id;
  b.name = fmt::format("%{}", id);
  if (src_id) {
    const Buffer& src = m_.buffer(*src_id);
    b.role = src.role;
    b.root = src.root;
    b.view_offset = src.view_offset + *view_[id];
  } else if (n.op == OpKind::Constant) {
    b.role = BufferRole::Constant;
    b.external_index = std::int32_t(m_.constants.size());
    m_.constants.push_back(b.id);
    m_.constant_values.push_back(*n.value);
  } else {
    assert(producer_[id] >= 0 && "a buffer is read before any kernel writes it");
    b.role = BufferRole::Arena;
  }
  m_.buffers.push_back(std::move(b));
  return buf_[id] = m_.buffers.back().id;
}

void Lowering::emit(int gid, std::size_t index, std::vector<FusionRecord>* fusion) {
  const Group& grp = groups_[std::size_t(gid)];
  Kernel k;
  k.kind = grp.kind;
  for (auto o : grp.outputs) buffer_of(o);  // outputs first: buffer ids follow kernel order
  // Body order: reduce prologue, the anchor, then everything else (epilogue),
  // each in graph order, so a backend can split the body at the anchor.
  std::vector<NodeId> order;
  for (Role want : {Role::Prologue, Role::Anchor, Role::Plain, Role::Epilogue})
    for (auto [id, role] : grp.nodes)
      if (role == want) order.push_back(id);
  bool inline_scalars =
      grp.kind == KernelKind::Elementwise || grp.kind == KernelKind::Reduce || grp.kind == KernelKind::MatMul;
  std::map<NodeId, NodeId> local;
  auto operand = [&](NodeId o, bool anchor_operand) -> NodeId {
    if (auto it = local.find(o); it != local.end()) return it->second;
    // Scalar constants (possibly reshaped) become body constants: backends
    // see an immediate instead of a one-element buffer.
    NodeId c = o;
    while (view_[c] && g_.node(c).op != OpKind::Slice) c = g_.node(c).inputs[0];
    const Node& cn = g_.node(c);
    NodeId id;
    if (inline_scalars && !anchor_operand && cn.op == OpKind::Constant && cn.value->numel() == 1) {
      auto& v = *cn.value;
      id = k.body.constant(ir::Tensor(v.dtype(), g_.node(o).shape.extents(), {v.data(), v.nbytes()}));
    } else {
      BufferId b = buffer_of(o);
      const Buffer& buf = m_.buffer(b);
      id = k.body.input(fmt::format("in{}", k.inputs.size()), Shape(buf.shape), buf.dtype);
      k.inputs.push_back(b);
    }
    return local[o] = id;
  };
  std::string ops;
  std::vector<OpKind> kinds;
  std::vector<std::string> origins;
  for (auto nid : order) {
    const Node& n = g_.node(nid);
    std::vector<NodeId> ins;
    // Operands of the anchor and of a matmul's or an attention's operand permute stay buffers.
    const bool buffer_operand =
        grp.nodes.at(nid) == Role::Anchor ||
        ((grp.kind == KernelKind::MatMul || grp.kind == KernelKind::Native) && grp.nodes.at(nid) == Role::Prologue);
    for (auto in : n.inputs) ins.push_back(operand(in, buffer_operand));
    auto cls = ir::op_info(n.op).cls;
    bool declared = cls == OpClass::Leaf || n.op == OpKind::Reshape || n.op == OpKind::Expand;
    local[nid] = declared ? k.body.add_declared(n.op, std::move(ins), n.attrs, n.dtype, n.shape)
                          : k.body.add(n.op, std::move(ins), n.attrs);
    if (grp.kind != KernelKind::ControlFlow || ops.empty())  // a control-flow op's results: named once
      ops += (ops.empty() ? "" : "+") + std::string(ir::op_name(n.op));
    kinds.push_back(n.op);
    k.source_nodes.push_back(origin_[nid]);
    if (!n.origin.empty() && std::find(origins.begin(), origins.end(), n.origin) == origins.end())
      origins.push_back(n.origin);
  }
  std::sort(k.source_nodes.begin(), k.source_nodes.end());
  k.source_nodes.erase(std::unique(k.source_nodes.begin(), k.source_nodes.end()), k.source_nodes.end());
  std::vector<NodeId> outs = grp.outputs;
  std::sort(outs.begin(), outs.end());
  for (auto o : outs) {
    k.body.add_output(local.at(o));
    k.outputs.push_back(buffer_of(o));
  }
  k.name = fmt::format("k{}_{}: {}", index, kernel_kind_name(grp.kind), ops);
  k.body.set_name(fmt::format("k{}", index));
  if (!origins.empty()) k.name += fmt::format(" [{}]", fmt::join(origins, ", "));
  if (fusion) fusion->push_back({k.name, k.kind, std::move(kinds), grp.why_not, std::move(origins)});
  m_.kernels.push_back(std::move(k));
}

LirModule Lowering::run(std::vector<FusionRecord>* fusion) {
  analyze();
  for (const auto& n : g_.nodes())
    if (live_[n.id]) check_supported(n);
  for (NodeId i = NodeId(g_.size()); i-- > 0;) {
    const Node& n = g_.node(i);
    if (!live_[i] || is_buffer_leaf(n.op)) continue;
    if (view_[i])
      visit_view(n);
    else if (absorb_widened_operand(n) || absorb_narrowed_param(n))
      continue;
    else if (is_ew(n.op))
      visit_elementwise(n);
    else
      visit_anchor(n);
  }
  m_.name = g_.name();
  // Every graph input and param gets its buffer, used or not: callers bind them by position.
  for (auto id : g_.input_ids()) {
    const Node& n = g_.node(id);
    m_.buffers.push_back({BufferId(m_.buffers.size()), BufferRole::Input, n.dtype, n.shape.extents(),
                          n.attrs.get_str("name"), std::int32_t(m_.inputs.size())});
    m_.buffers.back().root = m_.buffers.back().id;
    m_.inputs.push_back(buf_[id] = m_.buffers.back().id);
  }
  for (auto id : g_.param_ids()) {
    const Node& n = g_.node(id);
    m_.buffers.push_back({BufferId(m_.buffers.size()), BufferRole::Param, n.dtype, n.shape.extents(),
                          n.attrs.get_str("name"), std::int32_t(m_.params.size())});
    m_.buffers.back().root = m_.buffers.back().id;
    m_.params.push_back(buf_[id] = m_.buffers.back().id);
  }
  auto order = kernel_order();
  for (std::size_t i = 0; i < order.size(); ++i) emit(order[i], i, fusion);
  for (const auto& o : g_.outputs()) {
    m_.outputs.push_back(buffer_of(o.node));
    m_.output_names.push_back(o.name);
    Buffer& b = m_.buffers[std::size_t(m_.outputs.back())];
    if (b.role == BufferRole::Arena && b.root == b.id && !o.name.empty()) b.name = o.name;
  }
  return std::move(m_);
}

}  // namespace

LirModule lower_to_lir(const ir::Graph& mir, const BackendTraits& backend, std::vector<FusionRecord>* fusion) {
  for (const auto& n : mir.nodes())
    if (!n.shape.is_static())
      throw Error(ir::describe_node(mir, n) + ": shape " + n.shape.str() + " is not static; bind its symbols first");
  Sunk s;
  if (backend.fuse_matmul_epilogue) {
    s = sink_reshapes(mir);
  } else {
    s.g = mir;
    s.origin.resize(mir.size());
    for (NodeId i = 0; i < mir.size(); ++i) s.origin[i] = i;
  }
  return Lowering(mir, s, backend).run(fusion);
}

}  // namespace rlx::compile::passes
