#pragma once
// The op table: one OpDef per op, registered by the op's family file under
// src/ops/ (unary, binary, reduce, movement, nn, control, custom, leaf). Every
// layer reads an op's contract from here: its attribute schema and defaults
// (ir), its shape rule (infer), its float64 reference (reference), its
// decomposition or scalar formula (compile, and every code generator through
// it), its derivative and batching rules (autodiff) and its cost (runtime).
// A field left empty falls to the general rule of the op's class, named at
// each field. The closed OpKind set itself stays in rlx/ir/op.hpp.
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "rlx/ir/batching.hpp"
#include "rlx/ir/derivative.hpp"
#include "rlx/ir/f64_value.hpp"
#include "rlx/ir/graph.hpp"

namespace rlx::ir {

// ---- scalar formulas --------------------------------------------------------
// An elementwise op's formula is written once, over Expr: a value of a graph
// being built, with arithmetic operators and the elementwise ops as functions.
// A formula op decomposes into its formula wherever a backend has no kernel of
// its own for it, so the reference, the C codegen, the GLSL generator and the
// CPU (through its kernels for the primitives) all run the same expression.
class Expr {
 public:
  Expr(Graph& g, NodeId id) : g_(&g), id_(id) {}
  Graph& graph() const { return *g_; }
  NodeId id() const { return id_; }
  DType dtype() const { return g_->node(id_).dtype; }
  // A rank-0 constant of this value's dtype.
  Expr constant(double v) const { return {*g_, g_->scalar(v, dtype())}; }

 private:
  Graph* g_;
  NodeId id_;
};

Expr apply(OpKind op, Expr x);
Expr apply(OpKind op, Expr a, Expr b);
Expr where(Expr cond, Expr a, Expr b);
// A double operand becomes a constant of the other operand's dtype.
#define RLX_EXPR_BINARY(sym, op)                                                             \
  inline Expr operator sym(Expr a, Expr b) { return apply(OpKind::op, a, b); }               \
  inline Expr operator sym(Expr a, double b) { return apply(OpKind::op, a, a.constant(b)); } \
  inline Expr operator sym(double a, Expr b) { return apply(OpKind::op, b.constant(a), b); }
RLX_EXPR_BINARY(+, Add)
RLX_EXPR_BINARY(-, Sub)
RLX_EXPR_BINARY(*, Mul)
RLX_EXPR_BINARY(/, Div)
RLX_EXPR_BINARY(<, Lt)
RLX_EXPR_BINARY(<=, Le)
RLX_EXPR_BINARY(>, Gt)
RLX_EXPR_BINARY(>=, Ge)
#undef RLX_EXPR_BINARY
inline Expr operator-(Expr x) { return apply(OpKind::Neg, x); }
inline Expr max(Expr a, double b) { return apply(OpKind::Max, a, a.constant(b)); }
inline Expr exp(Expr x) { return apply(OpKind::Exp, x); }
inline Expr log(Expr x) { return apply(OpKind::Log, x); }
inline Expr abs(Expr x) { return apply(OpKind::Abs, x); }
inline Expr tanh(Expr x) { return apply(OpKind::Tanh, x); }
inline Expr erf(Expr x) { return apply(OpKind::Erf, x); }
// log(1 + t), accurate for small t: log(u) t / (u - 1) with u = 1 + t rounded
// (Goldberg's trick; exact when u == 1).
Expr log1p(Expr t);

// ---- the table ----------------------------------------------------------------

// What an infer rule sees: the inputs' types, the node's attributes, and the
// type the node declares (leaves, reshape and expand read it; null if none).
struct InferArgs {
  std::span<const TypeInfo> inputs;
  const Attrs& attrs;
  const TypeInfo* declared = nullptr;
  const TypeInfo& need_declared() const {
    require(declared != nullptr, "needs a declared dtype and shape");
    return *declared;
  }
  // Throws rlx::Error; the caller prefixes the op and the input types.
  [[noreturn]] void fail(const std::string& why) const;
  void require(bool ok, const std::string& why) const {
    if (!ok) fail(why);
  }
};

// What a decomposition sees: the graph receiving the new nodes, the op's
// operands already in it, and the node being replaced (attributes, result type).
struct DecomposeArgs {
  Graph& g;
  std::span<const NodeId> in;
  const Node& node;
  const Attrs& attrs() const { return node.attrs; }
  std::optional<NodeId> optional_in(std::size_t i) const {
    return i < in.size() ? std::optional<NodeId>(in[i]) : std::nullopt;
  }
  NodeId scalar(double v) const { return g.scalar(v, node.dtype); }
};

// OpDef::selector_operands: every operand.
inline constexpr std::size_t kAnyOperand = std::size_t(-1);

// The storage types an op's storage_operands take.
enum class StorageKind : std::uint8_t { Block, Element };

struct OpDef {
  OpKind kind = OpKind::Input;
  // One line of semantics, for docs/op-coverage.md and error messages.
  std::string_view doc;
  // Operand names in order; a trailing '?' marks an optional one (docs, pyrlx's generated builders).
  std::vector<std::string_view> operands;
  // The operands that may hold a storage type (rlx/ir/dtype.hpp) of the kinds `storage` names: GGUF's
  // block-quantized types (dequantize, quantized_matmul, embedding) or the storage-only element types
  // (float8, float4, int4, int2: cast, the movement ops). infer refuses a storage type anywhere else.
  // kAnyOperand stands for every operand.
  std::vector<std::size_t> storage_operands;
  StorageKind storage = StorageKind::Block;
  // Operands that choose elements or steer control rather than compute with their values: indices, conditions,
  // a start, a bool mask, a loop's counters. Autodiff sends no derivative into such an operand when its dtype is
  // not a float one, whatever it depends on (elsewhere, a float value that became an integer is an error: its
  // derivative is lost there). kAnyOperand stands for every operand.
  std::vector<std::size_t> selector_operands;
  // Attribute keys, types and defaults: a default lives here and nowhere else,
  // and Graph fills it into every node that omits the key.
  std::vector<AttrSpec> attrs;
  // Shape and dtype. Every op has one; infer_type checks the operand count
  // and the required attributes before it runs.
  std::function<TypeInfo(const InferArgs&)> infer;
  // An elementwise op's scalar formula over its operands (in their compute
  // dtype: f32 for f16 and bf16). It is also the op's decomposition, its float64
  // reference (evaluated in f64), and, through that, its derivative and batching.
  std::function<Expr(std::span<const Expr>)> formula;
  // A composite's decomposition into primitives; empty for primitives.
  std::function<NodeId(const DecomposeArgs&)> decompose;
  // The float64 reference, independent of the decomposition (rounding to the
  // node's dtype is the interpreter's, once). Empty: the formula evaluated in
  // float64; custom and control-flow ops, whose bodies the interpreter runs
  // itself (src/reference/), and run-time inputs have none.
  std::function<F64Value(const ReferenceArgs&)> reference;
  // Derivatives (rlx::autodiff reads them; rlx/ir/derivative.hpp). An
  // elementwise op gives `partial`: v times d y / d operand k, in the broadcast
  // shape, from which both modes follow (reverse: unbroadcast to the operand;
  // forward: the sum over the operands' tangents). Other ops give `vjp` (the
  // operands' cotangents from the result's; operands not in `want` may get
  // nullopt) and `jvp` (the result's tangent from the operands'). Empty: the
  // op is differentiated through its formula or decomposition; a custom op
  // through its extension's rules or lowering, a control-flow op through its
  // bodies (src/autodiff/control_flow.cpp).
  std::function<NodeId(const DerivativeArgs&, std::size_t k, NodeId v)> partial;
  std::function<std::vector<Tangent>(const DerivativeArgs&, NodeId ct, const std::vector<bool>& want)> vjp;
  std::function<Tangent(const DerivativeArgs&, std::span<const Tangent> t)> jvp;
  // The batching rule of vmap (rlx/ir/batching.hpp), for a node with a batched
  // operand. Empty: batched through the formula or decomposition; a custom op
  // through its extension's hook or lowering, a control-flow op through its
  // bodies (src/autodiff/vmap.cpp).
  std::function<BatchedValue(const BatchArgs&)> vmap;
  // The cost model's FLOPs (src/runtime/calibration.cpp, which counts the
  // primitives of the decomposed graph): `flops` of the operand and result
  // types, else flops_per_element per result element.
  double flops_per_element = 1;
  std::function<double(std::span<const TypeInfo> in, const TypeInfo& out)> flops;

  bool has_decomposition() const { return bool(formula) || bool(decompose); }
};

// A cast node's rounding mode from its optional `saturate` and `round_mode` attributes (absent: ONNX's
// defaults, saturating and rounding float8e8m0 up); rlx::Error for an unknown round mode.
CastMode cast_mode(const Attrs& attrs);

// The registered definition of `k`. Every OpKind has one (the families under
// src/ops/ register them at load time; a test checks none is missing).
const OpDef& op_def(OpKind k);
// Registers a definition (from src/ops/); throws rlx::Error for a second one.
void define_op(OpDef def);
// The element count with symbolic dims taken as 1, for cost estimates.
double estimated_numel(const Shape& s);
// FLOPs of one node of op `k` with these operand and result types (OpDef::flops).
double op_flops(OpKind k, std::span<const TypeInfo> in, const TypeInfo& out);
// Fills the defaults of op `k`'s schema into `attrs` for keys it lacks.
void fill_default_attrs(OpKind k, Attrs& attrs);
// The decomposition of node `n` (formula or composite rule) into `g`, whose
// operands are already there as `in`; throws rlx::Error when it has none.
NodeId expand_op(Graph& g, const Node& n, std::span<const NodeId> in);

}  // namespace rlx::ir
