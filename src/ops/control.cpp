// Control flow: bodies are subgraphs held as attributes, one sibling node per
// result, picked by `result` (rlx/ir/control_flow.hpp).
#include <fmt/format.h>

#include "ops/family.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"

namespace rlx::ops {
namespace {

using ir::Attrs;
using ir::Dim;
using ir::DType;
using ir::Graph;
using ir::InferArgs;
using ir::Node;
using ir::Shape;
using ir::TypeInfo;

std::string type_str(DType t, const Shape& s) { return std::string(ir::dtype_name(t)) + s.str(); }
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

TypeInfo scan_infer(const InferArgs& args) {
  const Attrs& a = args.attrs;
  std::span<const TypeInfo> inputs = args.inputs;
  const Graph& body = *a.get_graph("body");
  auto in = [&](std::size_t i) { return inputs[i]; };
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

TypeInfo if_infer(const InferArgs& args) {
  const Attrs& a = args.attrs;
  std::span<const TypeInfo> inputs = args.inputs;
  const TypeInfo& c = inputs[0];
  if (c.dtype != DType::Bool || c.shape.rank() != 0)
    throw Error("the condition must be a bool scalar, got " + type_str(c.dtype, c.shape));
  const Graph &then_b = *a.get_graph("then"), &else_b = *a.get_graph("else");
  std::vector<Slot> slots;
  for (std::size_t i = 1; i < inputs.size(); ++i)
    slots.push_back({inputs[i], fmt::format("operand {}", i - 1), "the operand"});
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

TypeInfo while_infer(const InferArgs& args) {
  const Attrs& a = args.attrs;
  std::span<const TypeInfo> inputs = args.inputs;
  const std::size_t nc = count(a, "num_carries", inputs.size());
  if (a.has("max_trip_count") && a.get_int("max_trip_count") < 0)
    throw Error(fmt::format("max_trip_count is {}; it must be >= 0 (leave it out for an unbounded loop)",
                            a.get_int("max_trip_count")));
  std::vector<Slot> slots;
  std::vector<TypeInfo> carries;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const TypeInfo& t = inputs[i];
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

}  // namespace
}  // namespace rlx::ops

RLX_OP_FAMILY(control) {
  using namespace rlx::ops;
  using rlx::ir::define_op;
  define_op({.kind = OpKind::Scan,
             .doc = "jax.lax.scan over (carries, xs, consts)",
             .operands = {"carries...", "xs...", "consts..."},
             .selector_operands = {rlx::ir::kAnyOperand},  // integer and bool carries (counters, flags) steer it
             .attrs = {{"body", T::Graph, true},
                       {"length", T::Int, true},
                       {"num_carries", T::Int, true},
                       {"num_consts", T::Int, false},
                       {"reverse", T::Bool, false},
                       {"result", T::Int, true}},
             .infer = scan_infer});
  define_op({.kind = OpKind::If,
             .doc = "then(operands) if cond else else(operands)",
             .operands = {"cond", "operands..."},
             .selector_operands = {0},  // the condition picks a branch
             .attrs = {{"then", T::Graph, true}, {"else", T::Graph, true}, {"result", T::Int, true}},
             .infer = if_infer});
  define_op({.kind = OpKind::While,
             .doc = "carries = body(carries, consts) while cond(carries, consts)",
             .operands = {"carries...", "consts..."},
             .selector_operands = {rlx::ir::kAnyOperand},
             .attrs = {{"cond", T::Graph, true},
                       {"body", T::Graph, true},
                       {"num_carries", T::Int, true},
                       {"max_trip_count", T::Int, false},
                       {"result", T::Int, true}},
             .infer = while_infer});
}
