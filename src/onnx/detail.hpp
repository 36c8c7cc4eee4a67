#pragma once
// The importer's inside: what an op converter sees of its ONNX node, and the converter table.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rlx/error.hpp"
#include "rlx/ir/dim_expr.hpp"
#include "rlx/ir/graph.hpp"
#include "rlx/ir/tensor.hpp"

namespace onnx {
class NodeProto;
class AttributeProto;
class TensorProto;
}  // namespace onnx

namespace rlx::onnx::detail {

using ir::NodeId;

// ONNX's TensorProto.DataType codes RLX has element types for; nullopt for the others.
std::optional<ir::DType> dtype_of(std::int64_t onnx_type);
std::string onnx_type_name(std::int64_t onnx_type);
// A TensorProto's value; external data is read from `base_dir` with its offset and length checked.
// `what` names the tensor in errors.
ir::Tensor tensor_from_proto(const ::onnx::TensorProto& t, const std::string& base_dir, const std::string& what);

// A shape value: an integer tensor of rank 0 or 1 that is known at import up to symbolic dims, its
// elements dim expressions (Shape of an input [batch, sequence], and the arithmetic exporters do on it:
// Gather, Concat, Slice, Mul, ...). The importer propagates these through shape subgraphs (importer.cpp,
// shape_op), and the converters that take shape data (Reshape, Expand, ConstantOfShape, Range, Slice) read
// them with Ctx::dim_ints, so their results get symbolic dims that binding resolves.
struct SymInts {
  ir::DType dtype = ir::DType::I64;
  bool scalar = false;  // rank 0, else rank 1
  std::vector<ir::DimExpr> elems;
};

// One ONNX node being converted. Inputs are graph nodes; those known at import also carry their value.
class Ctx {
 public:
  Ctx(ir::Graph& g, const ::onnx::NodeProto& node, std::string_view domain, std::int64_t opset,
      std::vector<std::optional<NodeId>> inputs, std::vector<std::shared_ptr<const ir::Tensor>> values,
      std::vector<std::shared_ptr<const SymInts>> syms = {})
      : g(g),
        node_(node),
        domain_(domain),
        opset_(opset),
        inputs_(std::move(inputs)),
        values_(std::move(values)),
        syms_(std::move(syms)) {}

  ir::Graph& g;
  std::int64_t opset() const { return opset_; }
  const std::string& op_type() const;
  std::size_t num_outputs() const;

  // ---- inputs ----
  std::size_t num_inputs() const { return inputs_.size(); }
  bool has(std::size_t i) const { return i < inputs_.size() && inputs_[i].has_value(); }
  NodeId in(std::size_t i) const;  // rlx::Error naming the input when it is absent
  const ir::Node& info(NodeId id) const { return g.node(id); }
  ir::DType dtype(std::size_t i) const { return g.node(in(i)).dtype; }
  // Input i's static extents; rlx::Error naming the input and its symbolic dims when it has any (the
  // converter needs extents there: bind the dims at import).
  std::vector<std::int64_t> shape(std::size_t i) const;
  // Input i's dims, static or symbolic (a copy: adding nodes moves the graph's).
  ir::Shape dims(std::size_t i) const { return g.node(in(i)).shape; }
  std::size_t rank(std::size_t i) const { return g.node(in(i)).shape.rank(); }
  // The value of input i when it is known at import, else null.
  const ir::Tensor* value(std::size_t i) const { return i < values_.size() ? values_[i].get() : nullptr; }
  // Input i's value as integers; rlx::Error naming the input unless it is known at import.
  std::vector<std::int64_t> ints(std::size_t i, std::string_view what) const;
  std::optional<std::vector<std::int64_t>> ints_or(std::size_t i) const;
  double scalar(std::size_t i, std::string_view what) const;
  // Input i as integers that may be symbolic (a shape value), else as ints(); rlx::Error like ints().
  std::vector<ir::DimExpr> dim_ints(std::size_t i, std::string_view what) const;
  const SymInts* sym(std::size_t i) const { return i < syms_.size() ? syms_[i].get() : nullptr; }

  // ---- attributes ----
  const ::onnx::AttributeProto* attr(std::string_view name) const;
  bool has_attr(std::string_view name) const { return attr(name) != nullptr; }
  std::int64_t attr_int(std::string_view name, std::int64_t def) const;
  std::int64_t attr_int(std::string_view name) const;  // required
  double attr_float(std::string_view name, double def) const;
  std::string attr_str(std::string_view name, const std::string& def) const;
  std::vector<std::int64_t> attr_ints(std::string_view name, std::vector<std::int64_t> def = {}) const;
  std::vector<double> attr_floats(std::string_view name) const;
  std::optional<ir::Tensor> attr_tensor(std::string_view name) const;

  // ---- building ----
  NodeId constant(const ir::Tensor& t) { return g.constant(t); }
  NodeId scalar_like(double v, ir::DType dt) { return g.scalar(v, dt); }
  NodeId i64s(const std::vector<std::int64_t>& v);  // a 1-D i64 constant

  // rlx::Error "onnx: node 'n' (Op, domain d, opset k): msg".
  [[noreturn]] void fail(const std::string& msg) const;
  std::string where() const;

 private:
  const ::onnx::NodeProto& node_;
  std::string_view domain_;
  std::int64_t opset_;
  std::vector<std::optional<NodeId>> inputs_;
  std::vector<std::shared_ptr<const ir::Tensor>> values_;
  std::vector<std::shared_ptr<const SymInts>> syms_;
};

// A converter maps one ONNX node onto RLX ops; it returns one graph node per ONNX output (nullopt for an
// output it does not produce).
using Outs = std::vector<std::optional<NodeId>>;
using Converter = std::function<Outs(Ctx&)>;
struct OpEntry {
  Converter convert;
  bool foldable = true;  // random ops are not evaluated at import
};
// op_type -> entry, for the default domain; each ops_*.cpp adds its family.
using Table = std::map<std::string, OpEntry, std::less<>>;
const Table& op_table();
void register_elementwise(Table& t);
void register_tensor(Table& t);
void register_nn(Table& t);
void register_misc(Table& t);

// Shared helpers for converters.
using I64s = std::vector<std::int64_t>;
// A scalar constant of `like`'s dtype.
inline NodeId k(Ctx& c, double v, NodeId like) { return c.g.scalar(v, c.g.node(like).dtype); }
// A node's static extents.
inline I64s ext(Ctx& c, NodeId x) { return c.g.node(x).shape.extents(); }
NodeId cast_to(Ctx& c, NodeId x, ir::DType to);
// Dims as run-time i64 data of shape `shape` (one element per dim): a constant when all are static. A
// symbolic dim d becomes the sum of d ones, which const_fold turns into its extent once d is bound, so
// index arithmetic on a symbolic shape (GatherND's strides, a shape value read as data) needs no
// dedicated op.
NodeId dims_value(Ctx& c, const std::vector<ir::DimExpr>& dims, const ir::Shape& shape);
NodeId dims_value(ir::Graph& g, const std::vector<ir::DimExpr>& dims, const ir::Shape& shape);
// Normalizes a possibly negative axis, failing with the node's context.
std::int64_t axis_of(Ctx& c, std::int64_t axis, std::size_t rank);

}  // namespace rlx::onnx::detail
