#pragma once
// The closed op set. One X-macro row per op keeps its text name, class and
// arity; everything else about an op (attributes, inference, reference,
// formula or decomposition, cost) is its entry in the op table
// (rlx/ir/op_def.hpp), registered by its family file under src/ops/
// (docs/architecture.md, "Adding an op").
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "rlx/ir/dtype.hpp"

namespace rlx::ir {

// Op categories, used by fusion and legalization.
enum class OpClass : std::uint8_t {
  Leaf,         // input, param, constant, iota, random
  Unary,        // elementwise, one input
  Binary,       // elementwise, two inputs, NumPy broadcasting
  Elementwise,  // other elementwise: where, cast, clamp
  Reduce,       // reductions over axes
  MatMul,
  Movement,     // reshape, permute, slice, ...
  Composite,    // HIR-only: decomposed to primitives unless a backend claims it
  Custom,       // an op from the extension registry (rlx/ir/custom_op.hpp), by name
  ControlFlow,  // scan, if, while: bodies are subgraphs held as attributes (rlx/ir/control_flow.hpp)
  Quant,        // block-quantized storage (rlx/ir/quants.hpp): dequantize, quantize; a backend runs them natively
};

// X(Enum, "text name", OpClass, min_inputs, max_inputs)
#define RLX_OPS(X)                                               \
  X(Input, "input", Leaf, 0, 0)                                  \
  X(Param, "param", Leaf, 0, 0)                                  \
  X(Constant, "constant", Leaf, 0, 0)                            \
  X(Iota, "iota", Leaf, 0, 0)                                    \
  X(RandomUniform, "random_uniform", Leaf, 0, 0)                 \
  X(RandomNormal, "random_normal", Leaf, 0, 0)                   \
  X(Neg, "neg", Unary, 1, 1)                                     \
  X(Abs, "abs", Unary, 1, 1)                                     \
  X(Exp, "exp", Unary, 1, 1)                                     \
  X(Log, "log", Unary, 1, 1)                                     \
  X(Sqrt, "sqrt", Unary, 1, 1)                                   \
  X(Rsqrt, "rsqrt", Unary, 1, 1)                                 \
  X(Reciprocal, "reciprocal", Unary, 1, 1)                       \
  X(Tanh, "tanh", Unary, 1, 1)                                   \
  X(Sigmoid, "sigmoid", Unary, 1, 1)                             \
  X(Relu, "relu", Unary, 1, 1)                                   \
  X(Gelu, "gelu", Unary, 1, 1)                                   \
  X(GeluTanh, "gelu_tanh", Unary, 1, 1)                          \
  X(Silu, "silu", Unary, 1, 1)                                   \
  X(Softplus, "softplus", Unary, 1, 1)                           \
  X(Mish, "mish", Unary, 1, 1)                                   \
  X(Erf, "erf", Unary, 1, 1)                                     \
  X(Sin, "sin", Unary, 1, 1)                                     \
  X(Cos, "cos", Unary, 1, 1)                                     \
  X(Floor, "floor", Unary, 1, 1)                                 \
  X(Ceil, "ceil", Unary, 1, 1)                                   \
  X(Round, "round", Unary, 1, 1)                                 \
  X(Sign, "sign", Unary, 1, 1)                                   \
  X(Not, "not", Unary, 1, 1)                                     \
  X(Add, "add", Binary, 2, 2)                                    \
  X(Sub, "sub", Binary, 2, 2)                                    \
  X(Mul, "mul", Binary, 2, 2)                                    \
  X(Div, "div", Binary, 2, 2)                                    \
  X(Pow, "pow", Binary, 2, 2)                                    \
  X(Max, "max", Binary, 2, 2)                                    \
  X(Min, "min", Binary, 2, 2)                                    \
  X(Mod, "mod", Binary, 2, 2)                                    \
  X(Eq, "eq", Binary, 2, 2)                                      \
  X(Ne, "ne", Binary, 2, 2)                                      \
  X(Lt, "lt", Binary, 2, 2)                                      \
  X(Le, "le", Binary, 2, 2)                                      \
  X(Gt, "gt", Binary, 2, 2)                                      \
  X(Ge, "ge", Binary, 2, 2)                                      \
  X(And, "and", Binary, 2, 2)                                    \
  X(Or, "or", Binary, 2, 2)                                      \
  X(Where, "where", Elementwise, 3, 3)                           \
  X(Cast, "cast", Elementwise, 1, 1)                             \
  X(Clamp, "clamp", Elementwise, 1, 1)                           \
  X(ReduceSum, "reduce_sum", Reduce, 1, 1)                       \
  X(ReduceMean, "reduce_mean", Reduce, 1, 1)                     \
  X(ReduceMax, "reduce_max", Reduce, 1, 1)                       \
  X(ReduceMin, "reduce_min", Reduce, 1, 1)                       \
  X(ReduceProd, "reduce_prod", Reduce, 1, 1)                     \
  X(ArgMax, "argmax", Reduce, 1, 1)                              \
  X(ArgMin, "argmin", Reduce, 1, 1)                              \
  X(MatMul, "matmul", MatMul, 2, 2)                              \
  X(Reshape, "reshape", Movement, 1, 1)                          \
  X(Permute, "permute", Movement, 1, 1)                          \
  X(Expand, "expand", Movement, 1, 1)                            \
  X(Slice, "slice", Movement, 1, 1)                              \
  X(Concat, "concat", Movement, 1, 64)                           \
  X(Pad, "pad", Movement, 1, 1)                                  \
  X(Gather, "gather", Movement, 2, 2)                            \
  X(IndexSelect, "index_select", Movement, 2, 2)                 \
  X(ScatterAdd, "scatter_add", Movement, 3, 3)                   \
  X(Squeeze, "squeeze", Movement, 1, 1)                          \
  X(Unsqueeze, "unsqueeze", Movement, 1, 1)                      \
  X(Flip, "flip", Movement, 1, 1)                                \
  X(Linear, "linear", Composite, 2, 3)                           \
  X(Softmax, "softmax", Composite, 1, 1)                         \
  X(LogSoftmax, "log_softmax", Composite, 1, 1)                  \
  X(LayerNorm, "layer_norm", Composite, 1, 3)                    \
  X(RmsNorm, "rms_norm", Composite, 1, 2)                        \
  X(GroupNorm, "group_norm", Composite, 1, 3)                    \
  X(Conv1d, "conv1d", Composite, 2, 3)                           \
  X(Conv2d, "conv2d", Composite, 2, 3)                           \
  X(MaxPool2d, "max_pool2d", Composite, 1, 1)                    \
  X(AvgPool2d, "avg_pool2d", Composite, 1, 1)                    \
  X(Embedding, "embedding", Composite, 2, 2)                     \
  X(DynamicUpdateSlice, "dynamic_update_slice", Composite, 3, 3) \
  X(QuantizedMatmul, "quantized_matmul", Composite, 2, 2)        \
  X(Dequantize, "dequantize", Quant, 1, 1)                       \
  X(Quantize, "quantize", Quant, 1, 1)                           \
  X(Attention, "attention", Composite, 3, 4)                     \
  X(SoftmaxBackward, "softmax_backward", Composite, 2, 2)        \
  X(LogSoftmaxBackward, "log_softmax_backward", Composite, 2, 2) \
  X(LayerNormBackward, "layer_norm_backward", Composite, 2, 3)   \
  X(RmsNormBackward, "rms_norm_backward", Composite, 2, 3)       \
  X(Rope, "rope", Composite, 3, 3)                               \
  X(Custom, "custom", Custom, 0, 64)                             \
  X(Scan, "scan", ControlFlow, 0, 64)                            \
  X(If, "if", ControlFlow, 1, 64)                                \
  X(While, "while", ControlFlow, 0, 64)

enum class OpKind : std::uint8_t {
#define RLX_OP_ENUM(e, s, c, lo, hi) e,
  RLX_OPS(RLX_OP_ENUM)
#undef RLX_OP_ENUM
};

inline constexpr OpKind kAllOps[] = {
#define RLX_OP_LIST(e, s, c, lo, hi) OpKind::e,
    RLX_OPS(RLX_OP_LIST)
#undef RLX_OP_LIST
};

struct OpInfo {
  OpKind kind;
  std::string_view name;
  OpClass cls;
  int min_inputs;
  int max_inputs;
};

const OpInfo& op_info(OpKind k);
std::string_view op_class_name(OpClass c);  // "unary", "composite", "control_flow", ...
std::string_view op_name(OpKind k);
std::optional<OpKind> parse_op(std::string_view name);
inline bool is_elementwise(OpKind k) {
  auto c = op_info(k).cls;
  return c == OpClass::Unary || c == OpClass::Binary || c == OpClass::Elementwise;
}
bool is_comparison(OpKind k);  // eq ne lt le gt ge: output bool

// ---- attributes ----------------------------------------------------------
// Typed attribute values. Each op's schema (see op_attr_schema) says which
// keys it takes and their types; the verifier enforces it. A Graph value is a
// control-flow body: immutable and shared, so equal attributes mean the same body.
class Graph;
using GraphRef = std::shared_ptr<const Graph>;
using AttrValue = std::variant<std::int64_t, double, bool, std::string, std::vector<std::int64_t>, DType, GraphRef>;

enum class AttrType : std::uint8_t { Int, Float, Bool, String, Ints, DType, Graph };

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<const std::string, AttrValue>> kv) : map_(kv) {}

  bool has(std::string_view k) const { return map_.find(k) != map_.end(); }
  void set(std::string k, AttrValue v) { map_[std::move(k)] = std::move(v); }
  using Map = std::map<std::string, AttrValue, std::less<>>;
  const Map& items() const { return map_; }

  // Typed getters throw rlx::Error naming the key if absent or mistyped.
  std::int64_t get_int(std::string_view k) const;
  double get_float(std::string_view k) const;  // also accepts an int value
  bool get_bool(std::string_view k) const;
  const std::string& get_str(std::string_view k) const;
  const std::vector<std::int64_t>& get_ints(std::string_view k) const;
  DType get_dtype(std::string_view k) const;
  const GraphRef& get_graph(std::string_view k) const;  // never null
  // Getters with a default when the key is absent.
  std::int64_t int_or(std::string_view k, std::int64_t d) const { return has(k) ? get_int(k) : d; }
  double float_or(std::string_view k, double d) const { return has(k) ? get_float(k) : d; }
  bool bool_or(std::string_view k, bool d) const { return has(k) ? get_bool(k) : d; }

  bool operator==(const Attrs& o) const { return map_ == o.map_; }

 private:
  Map map_;
};

struct AttrSpec {
  std::string_view key;
  AttrType type;
  bool required;
  // Filled into a node that omits the key (only for optional keys).
  std::optional<AttrValue> default_value = std::nullopt;
};
// The attribute schema of an op (keys, types, required-ness, defaults): its
// entry in the op table (rlx/ir/op_def.hpp).
const std::vector<AttrSpec>& op_attr_schema(OpKind k);

}  // namespace rlx::ir
