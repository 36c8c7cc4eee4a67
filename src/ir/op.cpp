#include "rlx/ir/op.hpp"

#include <string>
#include <unordered_map>

#include "rlx/error.hpp"

namespace rlx::ir {

namespace {
constexpr OpInfo kInfos[] = {
#define RLX_OP_INFO(e, s, c, lo, hi) {OpKind::e, s, OpClass::c, lo, hi},
    RLX_OPS(RLX_OP_INFO)
#undef RLX_OP_INFO
};

std::string_view attr_type_name(AttrType t) {
  switch (t) {
    case AttrType::Int: return "int";
    case AttrType::Float: return "float";
    case AttrType::Bool: return "bool";
    case AttrType::String: return "string";
    case AttrType::Ints: return "int list";
    case AttrType::DType: return "dtype";
    case AttrType::Graph: return "graph";
  }
  return "?";
}

template <class T>
const T& get_typed(const Attrs::Map& m, std::string_view k, AttrType t) {
  auto it = m.find(k);
  if (it == m.end()) throw Error("missing attribute '" + std::string(k) + "'");
  if (const T* v = std::get_if<T>(&it->second)) return *v;
  throw Error("attribute '" + std::string(k) + "' is not of type " + std::string(attr_type_name(t)));
}
}  // namespace

// A switch, so that a new OpClass fails the build (-Wswitch) instead of reading past a table.
std::string_view op_class_name(OpClass c) {
  switch (c) {
    case OpClass::Leaf: return "leaf";
    case OpClass::Unary: return "unary";
    case OpClass::Binary: return "binary";
    case OpClass::Elementwise: return "elementwise";
    case OpClass::Reduce: return "reduce";
    case OpClass::MatMul: return "matmul";
    case OpClass::Movement: return "movement";
    case OpClass::Composite: return "composite";
    case OpClass::Custom: return "custom";
    case OpClass::ControlFlow: return "control_flow";
    case OpClass::Quant: return "quant";
  }
  return "?";
}

const OpInfo& op_info(OpKind k) { return kInfos[static_cast<std::size_t>(k)]; }
std::string_view op_name(OpKind k) { return op_info(k).name; }

std::optional<OpKind> parse_op(std::string_view name) {
  static const auto* table = [] {
    auto* t = new std::unordered_map<std::string_view, OpKind>;
    for (const auto& info : kInfos) (*t)[info.name] = info.kind;
    return t;
  }();
  auto it = table->find(name);
  if (it == table->end()) return std::nullopt;
  return it->second;
}

bool is_comparison(OpKind k) {
  switch (k) {
    case OpKind::Eq:
    case OpKind::Ne:
    case OpKind::Lt:
    case OpKind::Le:
    case OpKind::Gt:
    case OpKind::Ge: return true;
    default: return false;
  }
}

std::int64_t Attrs::get_int(std::string_view k) const { return get_typed<std::int64_t>(map_, k, AttrType::Int); }
double Attrs::get_float(std::string_view k) const {
  auto it = map_.find(k);
  if (it != map_.end())
    if (const auto* i = std::get_if<std::int64_t>(&it->second)) return static_cast<double>(*i);
  return get_typed<double>(map_, k, AttrType::Float);
}
bool Attrs::get_bool(std::string_view k) const { return get_typed<bool>(map_, k, AttrType::Bool); }
const std::string& Attrs::get_str(std::string_view k) const {
  return get_typed<std::string>(map_, k, AttrType::String);
}
const std::vector<std::int64_t>& Attrs::get_ints(std::string_view k) const {
  return get_typed<std::vector<std::int64_t>>(map_, k, AttrType::Ints);
}
DType Attrs::get_dtype(std::string_view k) const { return get_typed<DType>(map_, k, AttrType::DType); }
const GraphRef& Attrs::get_graph(std::string_view k) const {
  const auto& g = get_typed<GraphRef>(map_, k, AttrType::Graph);
  if (!g) throw Error("attribute '" + std::string(k) + "' holds no graph");
  return g;
}

}  // namespace rlx::ir
