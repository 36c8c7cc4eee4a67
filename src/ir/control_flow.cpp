// Control flow in the IR: builders and sibling helpers. The type rules that
// check bodies against what the op passes them are the ops' entries in the op
// table (src/ops/control.cpp).
#include "rlx/ir/control_flow.hpp"

#include <fmt/format.h>

#include "rlx/error.hpp"

namespace rlx::ir {

namespace {

std::string type_str(DType t, const Shape& s) { return std::string(dtype_name(t)) + s.str(); }
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
