// Control flow in the IR: builders, sibling helpers and the type rules that
// check bodies against what the op passes them.
#include "rlx/ir/control_flow.hpp"

#include <fmt/format.h>

#include "rlx/error.hpp"

namespace rlx::ir {

namespace {

std::string type_str(DType t, const Shape& s) { return std::string(dtype_name(t)) + s.str(); }
std::string type_str(const TypeInfo& t) { return type_str(t.dtype, t.shape); }
bool same(const Node& n, const TypeInfo& t) { return n.dtype == t.dtype && n.shape == t.shape; }

// What the op passes a body input: its type, the name the error uses
// ("carry 1") and where the value comes from.
struct Slot {
  TypeInfo type;
  std::string label;
  std::string source;
};

void check_inputs(const Graph& body, std::string_view what, const std::vector<Slot>& slots) {
  if (!body.param_ids().empty())
    throw Error(fmt::format("the {} body '{}' has params; bodies take inputs only (pass values in as inputs)", what,
                            body.name()));
  auto ids = body.input_ids();
  if (ids.size() != slots.size())
    throw Error(
        fmt::format("the {} body '{}' takes {} inputs, the op passes {}", what, body.name(), ids.size(), slots.size()));
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const Node& b = body.node(ids[i]);
    if (!same(b, slots[i].type))
      throw Error(fmt::format("{}: the {} body takes {}, but {} is {}", slots[i].label, what,
                              type_str(b.dtype, b.shape), slots[i].source, type_str(slots[i].type)));
  }
}

const Node& output(const Graph& body, std::size_t j) { return body.node(body.outputs()[j].node); }
TypeInfo type_of(const Node& n) { return {n.dtype, n.shape}; }

std::size_t count(const Attrs& a, std::string_view key, std::size_t max) {
  auto v = a.get_int(key);
  if (v < 0 || std::size_t(v) > max) throw Error(fmt::format("{} is {}, must be in [0, {}]", key, v, max));
  return std::size_t(v);
}

// Carry outputs of a loop body must keep the carries' types.
void check_carry_outputs(const Graph& body, std::string_view what, std::span<const TypeInfo> carries) {
  for (std::size_t i = 0; i < carries.size(); ++i)
    if (!same(output(body, i), carries[i]))
      throw Error(fmt::format("carry {}: the {} body returns {} for it, but the carry is {}", i, what,
                              type_str(type_of(output(body, i))), type_str(carries[i])));
}

std::size_t checked_result(const Attrs& a, std::size_t results) {
  auto r = a.get_int("result");
  if (r < 0 || std::size_t(r) >= results)
    throw Error(fmt::format("result {} is out of range (the op has {} results)", r, results));
  return std::size_t(r);
}

TypeInfo infer_scan(const Graph& g, std::span<const NodeId> inputs, const Attrs& a) {
  const Graph& body = *a.get_graph("body");
  auto in = [&](std::size_t i) { return type_of(g.node(inputs[i])); };
  const std::size_t n = inputs.size(), nc = count(a, "num_carries", n);
  const std::size_t nk = a.has("num_consts") ? count(a, "num_consts", n - nc) : 0, nx = n - nc - nk;
  const std::int64_t length = a.get_int("length");
  if (length < 0) throw Error(fmt::format("length is {}, must be >= 0", length));
  std::vector<Slot> slots;
  std::vector<TypeInfo> carries;
  for (std::size_t i = 0; i < nc; ++i) {
    carries.push_back(in(i));
    slots.push_back({in(i), fmt::format("carry {}", i), "the initial carry"});
  }
  for (std::size_t j = 0; j < nx; ++j) {
    TypeInfo x = in(nc + j);
    if (x.shape.rank() == 0 || !x.shape[0].is_static() || x.shape[0].size != length)
      throw Error(
          fmt::format("xs {} is {}; scanned inputs need a leading axis of extent length={}", j, type_str(x), length));
    Shape slice(std::vector<Dim>(x.shape.dims().begin() + 1, x.shape.dims().end()));
    slots.push_back({{x.dtype, slice}, fmt::format("xs {}", j), fmt::format("a step of xs {} ({})", j, type_str(x))});
  }
  for (std::size_t k = 0; k < nk; ++k) slots.push_back({in(nc + nx + k), fmt::format("const {}", k), "the const"});
  check_inputs(body, "scan", slots);
  if (body.outputs().size() < nc)
    throw Error(fmt::format("the scan body returns {} values, fewer than its {} carries", body.outputs().size(), nc));
  check_carry_outputs(body, "scan", carries);
  std::size_t r = checked_result(a, body.outputs().size());
  if (r < nc) return carries[r];
  TypeInfo y = type_of(output(body, r));
  std::vector<Dim> dims{Dim(length)};
  dims.insert(dims.end(), y.shape.dims().begin(), y.shape.dims().end());
  return {y.dtype, Shape(std::move(dims))};
}

TypeInfo infer_if(const Graph& g, std::span<const NodeId> inputs, const Attrs& a) {
  const Node& c = g.node(inputs[0]);
  if (c.dtype != DType::Bool || c.shape.rank() != 0)
    throw Error("the condition must be a bool scalar, got " + type_str(c.dtype, c.shape));
  const Graph &then_b = *a.get_graph("then"), &else_b = *a.get_graph("else");
  std::vector<Slot> slots;
  for (std::size_t i = 1; i < inputs.size(); ++i)
    slots.push_back({type_of(g.node(inputs[i])), fmt::format("operand {}", i - 1), "the operand"});
  check_inputs(then_b, "then", slots);
  check_inputs(else_b, "else", slots);
  if (then_b.outputs().size() != else_b.outputs().size())
    throw Error(fmt::format("the then body returns {} values, the else body {}", then_b.outputs().size(),
                            else_b.outputs().size()));
  for (std::size_t j = 0; j < then_b.outputs().size(); ++j)
    if (!same(output(else_b, j), type_of(output(then_b, j))))
      throw Error(fmt::format("result {}: the then body gives {}, the else body {}", j,
                              type_str(type_of(output(then_b, j))), type_str(type_of(output(else_b, j)))));
  return type_of(output(then_b, checked_result(a, then_b.outputs().size())));
}

TypeInfo infer_while(const Graph& g, std::span<const NodeId> inputs, const Attrs& a) {
  const std::size_t nc = count(a, "num_carries", inputs.size());
  if (a.has("max_trip_count") && a.get_int("max_trip_count") < 0)
    throw Error(fmt::format("max_trip_count is {}; it must be >= 0 (leave it out for an unbounded loop)",
                            a.get_int("max_trip_count")));
  std::vector<Slot> slots;
  std::vector<TypeInfo> carries;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    TypeInfo t = type_of(g.node(inputs[i]));
    if (i < nc) carries.push_back(t);
    slots.push_back({t, i < nc ? fmt::format("carry {}", i) : fmt::format("const {}", i - nc),
                     i < nc ? "the initial carry" : "the const"});
  }
  const Graph &cond = *a.get_graph("cond"), &body = *a.get_graph("body");
  check_inputs(cond, "cond", slots);
  check_inputs(body, "while", slots);
  if (cond.outputs().size() != 1 || output(cond, 0).dtype != DType::Bool || output(cond, 0).shape.rank() != 0)
    throw Error(fmt::format("the cond body must return one bool scalar, it returns {} values{}", cond.outputs().size(),
                            cond.outputs().empty() ? "" : " starting with " + type_str(type_of(output(cond, 0)))));
  if (body.outputs().size() != nc)
    throw Error(fmt::format("the while body returns {} values for {} carries", body.outputs().size(), nc));
  check_carry_outputs(body, "while", carries);
  return carries[checked_result(a, nc)];
}

std::vector<NodeId> add_results(Graph& g, OpKind op, const std::vector<NodeId>& inputs, Attrs attrs,
                                std::size_t results) {
  if (results == 0) throw Error(fmt::format("graph '{}': a {} needs at least one result", g.name(), op_name(op)));
  std::vector<NodeId> out;
  for (std::size_t k = 0; k < results; ++k) {
    attrs.set("result", std::int64_t(k));
    out.push_back(g.add(op, inputs, attrs));
  }
  return out;
}

GraphRef verified(GraphRef body) {
  if (!body) throw Error("control flow: a body is null");
  body->verify();
  return body;
}

}  // namespace

std::size_t num_results(const Node& n) {
  switch (n.op) {
    case OpKind::Scan: return n.attrs.get_graph("body")->outputs().size();
    case OpKind::If: return n.attrs.get_graph("then")->outputs().size();
    case OpKind::While: return std::size_t(n.attrs.get_int("num_carries"));
    default: return 1;
  }
}

Attrs with_result(const Node& n, std::int64_t k) {
  Attrs a = n.attrs;
  a.set("result", k);
  return a;
}

bool are_siblings(const Node& a, const Node& b) {
  return a.op == b.op && is_control_flow(a.op) && a.inputs == b.inputs && with_result(a, 0) == with_result(b, 0);
}

std::vector<std::pair<std::string_view, const GraphRef*>> bodies_of(const Node& n) {
  std::vector<std::pair<std::string_view, const GraphRef*>> out;
  for (const auto& [key, value] : n.attrs.items())
    if (const auto* b = std::get_if<GraphRef>(&value)) out.emplace_back(key, b);
  return out;
}

GraphRef body_ref(Graph body) { return verified(std::make_shared<const Graph>(std::move(body))); }

TypeInfo infer_control_flow(const Graph& g, OpKind op, std::span<const NodeId> inputs, const Attrs& attrs) {
  switch (op) {
    case OpKind::Scan: return infer_scan(g, inputs, attrs);
    case OpKind::If: return infer_if(g, inputs, attrs);
    case OpKind::While: return infer_while(g, inputs, attrs);
    default: throw Error(std::string(op_name(op)) + " is not a control-flow op");
  }
}

std::vector<NodeId> scan(Graph& g, GraphRef body, std::vector<NodeId> init, std::vector<NodeId> xs, std::int64_t length,
                         bool reverse, std::vector<NodeId> consts) {
  body = verified(std::move(body));
  if (length < 0) {
    if (xs.empty()) throw Error(fmt::format("graph '{}': a scan without xs needs its length", g.name()));
    const Shape& s = g.node(xs[0]).shape;
    if (s.rank() == 0 || !s[0].is_static())
      throw Error(fmt::format("graph '{}': scan xs %{} is {}; it needs a static leading axis", g.name(), xs[0],
                              type_str(g.node(xs[0]).dtype, s)));
    length = s[0].size;
  }
  Attrs a{{"body", body},
          {"length", length},
          {"num_carries", std::int64_t(init.size())},
          {"num_consts", std::int64_t(consts.size())},
          {"reverse", reverse}};
  std::vector<NodeId> inputs = std::move(init);
  inputs.insert(inputs.end(), xs.begin(), xs.end());
  inputs.insert(inputs.end(), consts.begin(), consts.end());
  return add_results(g, OpKind::Scan, inputs, std::move(a), body->outputs().size());
}

std::vector<NodeId> if_else(Graph& g, NodeId cond, GraphRef then_body, GraphRef else_body,
                            std::vector<NodeId> operands) {
  then_body = verified(std::move(then_body));
  else_body = verified(std::move(else_body));
  std::size_t results = then_body->outputs().size();
  operands.insert(operands.begin(), cond);
  return add_results(g, OpKind::If, operands, {{"then", std::move(then_body)}, {"else", std::move(else_body)}},
                     results);
}

std::vector<NodeId> while_loop(Graph& g, GraphRef cond, GraphRef body, std::vector<NodeId> init,
                               std::vector<NodeId> consts, std::int64_t max_trip_count) {
  Attrs a{{"cond", verified(std::move(cond))},
          {"body", verified(std::move(body))},
          {"num_carries", std::int64_t(init.size())}};
  if (max_trip_count < -1)
    throw Error(fmt::format("graph '{}': while_loop max_trip_count is {}; it must be >= 0, or -1 for unbounded",
                            g.name(), max_trip_count));
  if (max_trip_count >= 0) a.set("max_trip_count", max_trip_count);
  std::size_t results = init.size();
  init.insert(init.end(), consts.begin(), consts.end());
  return add_results(g, OpKind::While, init, std::move(a), results);
}

}  // namespace rlx::ir
