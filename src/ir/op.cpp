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

const std::vector<AttrSpec>& op_attr_schema(OpKind k) {
  using T = AttrType;
  static const std::vector<AttrSpec> none;
  static const std::vector<AttrSpec> name{{"name", T::String, true}};
  static const std::vector<AttrSpec> axis{{"axis", T::Int, true}};
  static const std::vector<AttrSpec> axes{{"axes", T::Ints, true}};
  static const std::vector<AttrSpec> reduce{{"axes", T::Ints, true}, {"keepdims", T::Bool, true}};
  static const std::vector<AttrSpec> arg{{"axis", T::Int, true}, {"keepdims", T::Bool, true}};
  static const std::vector<AttrSpec> uniform{{"seed", T::Int, true}, {"low", T::Float, true}, {"high", T::Float, true}};
  static const std::vector<AttrSpec> normal{{"seed", T::Int, true}, {"mean", T::Float, true}, {"std", T::Float, true}};
  static const std::vector<AttrSpec> cast{{"to", T::DType, true}};
  static const std::vector<AttrSpec> clamp{{"min", T::Float, true}, {"max", T::Float, true}};
  static const std::vector<AttrSpec> permute{{"perm", T::Ints, true}};
  static const std::vector<AttrSpec> slice{
      {"starts", T::Ints, true}, {"ends", T::Ints, true}, {"steps", T::Ints, true}};
  static const std::vector<AttrSpec> pad{{"pads", T::Ints, true}, {"value", T::Float, true}};
  static const std::vector<AttrSpec> layer_norm{{"axis", T::Int, true}, {"eps", T::Float, true}};
  static const std::vector<AttrSpec> rms_norm{{"eps", T::Float, true}};
  static const std::vector<AttrSpec> conv{
      {"stride", T::Ints, true}, {"padding", T::Ints, true}, {"dilation", T::Ints, true}, {"groups", T::Int, true}};
  static const std::vector<AttrSpec> pool{
      {"kernel", T::Ints, true}, {"stride", T::Ints, true}, {"padding", T::Ints, true}};
  static const std::vector<AttrSpec> attention{{"causal", T::Bool, true}, {"scale", T::Float, true}};
  // A custom op's own attributes come from its extension's schema (attr_schema_of).
  static const std::vector<AttrSpec> custom{{"op", T::String, true}};
  // Control flow: `result` picks which of the op's results a node stands for
  // (rlx/ir/control_flow.hpp).
  static const std::vector<AttrSpec> scan{{"body", T::Graph, true},      {"length", T::Int, true},
                                          {"num_carries", T::Int, true}, {"num_consts", T::Int, false},
                                          {"reverse", T::Bool, false},   {"result", T::Int, true}};
  static const std::vector<AttrSpec> if_{{"then", T::Graph, true}, {"else", T::Graph, true}, {"result", T::Int, true}};
  static const std::vector<AttrSpec> while_{{"cond", T::Graph, true},
                                            {"body", T::Graph, true},
                                            {"num_carries", T::Int, true},
                                            {"max_trip_count", T::Int, false},
                                            {"result", T::Int, true}};
  switch (k) {
    case OpKind::Input:
    case OpKind::Param: return name;
    case OpKind::Iota: return axis;
    case OpKind::RandomUniform: return uniform;
    case OpKind::RandomNormal: return normal;
    case OpKind::Cast: return cast;
    case OpKind::Clamp: return clamp;
    case OpKind::ReduceSum:
    case OpKind::ReduceMean:
    case OpKind::ReduceMax:
    case OpKind::ReduceMin:
    case OpKind::ReduceProd: return reduce;
    case OpKind::ArgMax:
    case OpKind::ArgMin: return arg;
    case OpKind::Permute: return permute;
    case OpKind::Slice: return slice;
    case OpKind::Concat:
    case OpKind::Gather:
    case OpKind::IndexSelect:
    case OpKind::ScatterAdd:
    case OpKind::Softmax:
    case OpKind::LogSoftmax:
    case OpKind::SoftmaxBackward:
    case OpKind::LogSoftmaxBackward: return axis;
    case OpKind::Pad: return pad;
    case OpKind::Squeeze:
    case OpKind::Unsqueeze:
    case OpKind::Flip: return axes;
    case OpKind::LayerNorm:
    case OpKind::LayerNormBackward: return layer_norm;
    case OpKind::RmsNorm:
    case OpKind::RmsNormBackward: return rms_norm;
    case OpKind::Conv1d:
    case OpKind::Conv2d: return conv;
    case OpKind::MaxPool2d:
    case OpKind::AvgPool2d: return pool;
    case OpKind::Attention: return attention;
    case OpKind::Custom: return custom;
    case OpKind::Scan: return scan;
    case OpKind::If: return if_;
    case OpKind::While: return while_;
    default: return none;
  }
}

}  // namespace rlx::ir
