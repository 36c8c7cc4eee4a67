#pragma once
// The graph: SSA nodes stored in topological order (every input id is smaller
// than the node's own id). Passes never mutate a graph in place; they build
// a new one (see GraphBuilder-style helpers in rlx/compile/rewrite.hpp), so
// that invariant holds by construction and the verifier checks it for graphs
// that come from text or from users.
//
// Op semantics (attributes in braces; all axes may be negative):
//   leaves: input{name} param{name} constant(value) iota{axis} random_uniform{seed,low,high}
//           random_normal{seed,mean,std}. The node's own dtype/shape is declared.
//   unary:  neg abs exp log sqrt rsqrt reciprocal tanh sigmoid relu gelu (erf form) gelu_tanh
//           silu softplus erf sin cos floor ceil round (half to even) sign not (bool)
//   binary: add sub mul div (integers truncate) pow max min mod (sign of divisor, like numpy)
//           eq ne lt le gt ge (-> bool) and or (bool). NumPy broadcasting; same dtype.
//   where(cond: bool, a, b), cast{to}, clamp{min,max}
//   reduce_{sum,mean,max,min,prod}{axes,keepdims}; argmax/argmin{axis,keepdims} -> i64
//   matmul(a, b): rank >= 2, batch dims broadcast, [..,M,K] x [..,K,N]
//   reshape (declared shape), permute{perm}, expand (declared shape, broadcast rules),
//   slice{starts,ends,steps} (full rank, steps >= 1, clamped like Python),
//   concat{axis}, pad{pads=[before..., after...], value}, flip{axes},
//   gather{axis}(x, idx): torch.gather (idx has x's rank; output has idx's shape),
//   index_select{axis}(x, idx): numpy.take (out = x[:axis] + idx.shape + x[axis+1:]),
//   scatter_add{axis}(x, idx, upd): torch.scatter_add, squeeze{axes}, unsqueeze{axes}
//   composites (HIR): linear(x, w[in,out], b?), softmax{axis}, log_softmax{axis},
//           layer_norm{axis,eps}(x, gamma?, beta?) over dims [axis..), rms_norm{eps}(x, gamma?) over the
//           last dim, group_norm{num_groups,eps}(x [N,C,..], gamma?, beta?),
//           conv1d/conv2d{stride,padding,dilation,groups}(x NC.., w [O, C/g, k..], b?),
//           max_pool2d/avg_pool2d{kernel,stride,padding} (avg counts padding),
//           embedding(table, ids), attention{causal,scale}(q [B,H,Sq,D], k,v [B,Hkv,Sk,D], mask?) where
//           a bool mask keeps True positions and a float mask is added to the scores; H a multiple of
//           Hkv (grouped-query attention: KV head h / (H / Hkv) serves query head h),
//           dynamic_update_slice{axis}(x, update, start): x with update written from the run-time
//           integer scalar start along axis, start clamped to [0, x's extent - update's] (XLA's).
//           rope{interleaved}(x [.., D], cos, sin [.., D/2]): rotary positions, pairs of the last dim rotated.
//   block-quantized storage (rlx/ir/quants.hpp): dequantize(x) -> f32, quantize{to}(x),
//           quantized_matmul{activations}(x [.., K], w [N, K] of a block type) -> [.., N], the
//           product with w's rows (as GGUF stores a linear layer); embedding reads a block table too.
//   custom{op, ...}: an op from the extension registry (rlx/ir/custom_op.hpp).
//   control flow (rlx/ir/control_flow.hpp), bodies held as graph attributes, one sibling node per
//           result {result=k}: scan{body,length,num_carries,num_consts,reverse}(carries, xs, consts)
//           (jax.lax.scan), if{then,else}(cond, operands), while{cond,body,num_carries,
//           max_trip_count?}(carries, consts).
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "rlx/error.hpp"
#include "rlx/ir/op.hpp"
#include "rlx/ir/shape.hpp"
#include "rlx/ir/tensor.hpp"

namespace rlx::ir {

using NodeId = std::uint32_t;

struct Node {
  NodeId id = 0;
  OpKind op = OpKind::Input;
  std::vector<NodeId> inputs;
  Attrs attrs;
  DType dtype = DType::F32;
  Shape shape;
  std::shared_ptr<const Tensor> value;  // Constant only; shared, immutable
  // Where the node came from when a pass made it on behalf of another op (e.g.
  // "custom:my_op" for a custom op's inlined lowering), for reports; not printed.
  std::string origin;
};

struct GraphOutput {
  NodeId node;
  std::string name;
};

class Graph {
 public:
  explicit Graph(std::string name = "graph") : name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  void set_name(std::string n) { name_ = std::move(n); }
  std::size_t size() const { return nodes_.size(); }
  const Node& node(NodeId id) const;  // throws rlx::Error on a dangling id
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<GraphOutput>& outputs() const { return outputs_; }
  std::vector<NodeId> output_ids() const;
  std::vector<NodeId> input_ids() const;  // Input nodes, in creation order
  std::vector<NodeId> param_ids() const;
  // Finds an Input or Param by name; throws rlx::Error listing the names.
  NodeId find_input(std::string_view name) const;
  NodeId find_param(std::string_view name) const;

  // ---- generic construction ----
  // Adds a node, infers its dtype and shape, and throws rlx::Error naming the
  // new node id, the op and the input shapes when the inputs do not fit.
  NodeId add(OpKind op, std::vector<NodeId> inputs, Attrs attrs = {});
  // Adds a node whose dtype/shape are declared (leaves, reshape, expand);
  // inference still validates the declaration.
  NodeId add_declared(OpKind op, std::vector<NodeId> inputs, Attrs attrs, DType dtype, Shape shape);
  // Appends a node exactly as given, without inference (text parser and
  // verifier tests). Call verify() afterwards.
  NodeId add_raw(Node node);

  // Tags nodes [first, size()) without an origin with `origin` (passes use it
  // to mark what a rewritten op became).
  void tag_origin(NodeId first, const std::string& origin);

  void add_output(NodeId id, std::string name = {});
  void set_outputs(const std::vector<NodeId>& ids);
  void clear_outputs() { outputs_.clear(); }

  // ---- builders: leaves ----
  NodeId input(std::string name, Shape shape, DType dtype = DType::F32);
  NodeId param(std::string name, Shape shape, DType dtype = DType::F32);
  NodeId constant(Tensor value);
  NodeId scalar(double value, DType dtype = DType::F32);  // rank-0 constant
  NodeId iota(Shape shape, std::int64_t axis, DType dtype = DType::I64);
  NodeId random_uniform(Shape shape, std::uint64_t seed, double low = 0, double high = 1, DType dtype = DType::F32);
  NodeId random_normal(Shape shape, std::uint64_t seed, double mean = 0, double stddev = 1, DType dtype = DType::F32);

  // ---- builders: elementwise ----
  NodeId unary(OpKind op, NodeId x) { return add(op, {x}); }
  NodeId binary(OpKind op, NodeId a, NodeId b) { return add(op, {a, b}); }
  NodeId add(NodeId a, NodeId b) { return binary(OpKind::Add, a, b); }
  NodeId sub(NodeId a, NodeId b) { return binary(OpKind::Sub, a, b); }
  NodeId mul(NodeId a, NodeId b) { return binary(OpKind::Mul, a, b); }
  NodeId div(NodeId a, NodeId b) { return binary(OpKind::Div, a, b); }
  NodeId relu(NodeId x) { return unary(OpKind::Relu, x); }
  NodeId exp(NodeId x) { return unary(OpKind::Exp, x); }
  NodeId where(NodeId cond, NodeId a, NodeId b) { return add(OpKind::Where, {cond, a, b}); }
  NodeId cast(NodeId x, DType to);
  NodeId clamp(NodeId x, double lo, double hi);

  // ---- builders: reductions, matmul, movement ----
  NodeId reduce(OpKind op, NodeId x, std::vector<std::int64_t> axes, bool keepdims = false);
  NodeId sum(NodeId x, std::vector<std::int64_t> axes, bool keepdims = false) {
    return reduce(OpKind::ReduceSum, x, std::move(axes), keepdims);
  }
  NodeId mean(NodeId x, std::vector<std::int64_t> axes, bool keepdims = false) {
    return reduce(OpKind::ReduceMean, x, std::move(axes), keepdims);
  }
  NodeId argmax(NodeId x, std::int64_t axis, bool keepdims = false);
  NodeId argmin(NodeId x, std::int64_t axis, bool keepdims = false);
  NodeId matmul(NodeId a, NodeId b) { return add(OpKind::MatMul, {a, b}); }
  NodeId reshape(NodeId x, std::vector<std::int64_t> shape);  // one -1 allowed
  NodeId reshape(NodeId x, Shape shape);
  NodeId permute(NodeId x, std::vector<std::int64_t> perm);
  NodeId transpose(NodeId x);  // swaps the last two axes
  NodeId expand(NodeId x, Shape shape);
  // starts/ends/steps per axis listed in `axes` (others are taken whole).
  NodeId slice(NodeId x, std::vector<std::int64_t> axes, std::vector<std::int64_t> starts,
               std::vector<std::int64_t> ends, std::vector<std::int64_t> steps = {});
  NodeId narrow(NodeId x, std::int64_t axis, std::int64_t start, std::int64_t length);
  NodeId concat(std::vector<NodeId> xs, std::int64_t axis);
  std::vector<NodeId> split(NodeId x, const std::vector<std::int64_t>& sizes, std::int64_t axis);
  NodeId pad(NodeId x, std::vector<std::int64_t> pads, double value = 0);
  NodeId gather(NodeId x, NodeId idx, std::int64_t axis);
  NodeId index_select(NodeId x, NodeId idx, std::int64_t axis);
  NodeId scatter_add(NodeId x, NodeId idx, NodeId upd, std::int64_t axis);
  // x with `update` written at index `start` (an integer scalar, read at run time) along `axis`, start
  // clamped to [0, x's extent - update's] as XLA's DynamicUpdateSlice: a KV cache's append.
  NodeId dynamic_update_slice(NodeId x, NodeId update, NodeId start, std::int64_t axis);
  NodeId squeeze(NodeId x, std::vector<std::int64_t> axes);
  NodeId unsqueeze(NodeId x, std::vector<std::int64_t> axes);
  NodeId flip(NodeId x, std::vector<std::int64_t> axes);

  // ---- builders: composites (HIR) ----
  NodeId linear(NodeId x, NodeId w, std::optional<NodeId> bias = std::nullopt);
  NodeId softmax(NodeId x, std::int64_t axis = -1);
  NodeId log_softmax(NodeId x, std::int64_t axis = -1);
  // eps defaults to the op table's (src/ops/nn.cpp), as for every builder taking an optional attribute.
  NodeId layer_norm(NodeId x, std::optional<NodeId> gamma, std::optional<NodeId> beta,
                    std::optional<double> eps = std::nullopt, std::int64_t axis = -1);
  NodeId rms_norm(NodeId x, std::optional<NodeId> gamma, std::optional<double> eps = std::nullopt);
  // x [N, C, ...] normalized per sample over each of num_groups channel groups (torch's group_norm); eps
  // defaults to the op table's (src/ops/nn.cpp). beta needs gamma, as the operands are positional.
  NodeId group_norm(NodeId x, std::int64_t num_groups, std::optional<NodeId> gamma = std::nullopt,
                    std::optional<NodeId> beta = std::nullopt, std::optional<double> eps = std::nullopt) {
    Attrs a{{"num_groups", num_groups}};
    if (eps) a.set("eps", *eps);
    std::vector<NodeId> in{x};
    if (gamma) in.push_back(*gamma);
    if (beta && !gamma) throw Error("group_norm: beta without gamma; pass gamma (ones) too");
    if (beta) in.push_back(*beta);
    return add(OpKind::GroupNorm, std::move(in), std::move(a));
  }
  NodeId conv1d(NodeId x, NodeId w, std::optional<NodeId> bias, std::int64_t stride = 1, std::int64_t padding = 0,
                std::int64_t dilation = 1, std::int64_t groups = 1);
  NodeId conv2d(NodeId x, NodeId w, std::optional<NodeId> bias, std::vector<std::int64_t> stride = {1, 1},
                std::vector<std::int64_t> padding = {0, 0}, std::vector<std::int64_t> dilation = {1, 1},
                std::int64_t groups = 1);
  NodeId max_pool2d(NodeId x, std::vector<std::int64_t> kernel, std::vector<std::int64_t> stride,
                    std::vector<std::int64_t> padding = {0, 0});
  NodeId avg_pool2d(NodeId x, std::vector<std::int64_t> kernel, std::vector<std::int64_t> stride,
                    std::vector<std::int64_t> padding = {0, 0});
  NodeId embedding(NodeId table, NodeId ids);
  NodeId dequantize(NodeId x) { return add(OpKind::Dequantize, {x}); }
  NodeId quantize(NodeId x, DType to) { return add(OpKind::Quantize, {x}, {{"to", to}}); }
  // activations: "f32" (exact) or "q8" (each row of x rounded per block to 8 bits first, as llama.cpp).
  NodeId quantized_matmul(NodeId x, NodeId w, std::string activations = "f32") {
    return add(OpKind::QuantizedMatmul, {x, w}, {{"activations", std::move(activations)}});
  }
  NodeId attention(NodeId q, NodeId k, NodeId v, std::optional<NodeId> mask = std::nullopt, bool causal = false,
                   double scale = 0.0);
  // Rotary positions: the pairs of x's last dim (2i, 2i+1 when interleaved, as llama.cpp's GGUF Llama; i, i + D/2
  // otherwise, as NeoX and Hugging Face's rotate_half) rotated by cos[..., i], sin[..., i], which broadcast to x's
  // leading dims and D/2.
  NodeId rope(NodeId x, NodeId cos, NodeId sin, bool interleaved = true) {
    return add(OpKind::Rope, {x, cos, sin}, {{"interleaved", interleaved}});
  }

  // ---- builders: custom ops (rlx/ir/custom_op.hpp) ----
  // Adds an op from the extension registry; throws rlx::Error for an
  // unregistered name, a wrong input count or inputs the extension rejects.
  NodeId custom_op(std::string_view name, Attrs attrs, std::vector<NodeId> inputs);
  // The same, returning nullopt (and the message in *error) instead of throwing.
  std::optional<NodeId> try_custom_op(std::string_view name, Attrs attrs, std::vector<NodeId> inputs,
                                      std::string* error = nullptr);

  // Copies `body`'s nodes into this graph with its Input nodes (in order)
  // replaced by `args`; returns the ids its outputs became. The body's
  // inputs must match the args' dtypes and shapes; it may not hold params.
  std::vector<NodeId> inline_graph(const Graph& body, std::span<const NodeId> args);

  // Structural checks: ids in range, topological order (no cycles), arity,
  // attribute schema, and that every node's dtype/shape matches inference.
  // Throws rlx::Error naming the node, the op and the shapes.
  void verify() const;

  // How deep control-flow bodies nest under this graph: 0 without bodies, 1
  // when its bodies have none, and so on. add_raw refuses a node that would
  // pass limits::kMaxNestingDepth, so every recursive walk over bodies is
  // bounded.
  std::size_t nesting_depth() const { return nesting_depth_; }

  // Number of uses of each node (outputs count as a use).
  std::vector<std::uint32_t> use_counts() const;

 private:
  std::string name_;
  std::vector<Node> nodes_;
  std::vector<GraphOutput> outputs_;
  std::size_t nesting_depth_ = 0;
};

// Infers (dtype, shape) of `op` applied to `inputs` of graph `g`. For ops with
// a declared result (`declared` non-null), checks the declaration instead.
// Throws rlx::Error naming the op and input shapes.
struct TypeInfo {
  DType dtype;
  Shape shape;
};
TypeInfo infer_type(const Graph& g, OpKind op, std::span<const NodeId> inputs, const Attrs& attrs,
                    const TypeInfo* declared);

// "node %7 (matmul) inputs f32[2,3], f32[4,5]": the prefix every error about
// a node carries.
std::string describe_node(const Graph& g, const Node& n);

// Substitutes symbolic dims by extents and verifies the result; symbols not
// in `bindings` stay symbolic.
Graph bind_symbols(const Graph& g, const std::vector<std::pair<std::string, std::int64_t>>& bindings);

// Whether a permute's `perm` swaps the last two dims and keeps the others (Graph::transpose's).
bool swaps_last_two(std::span<const std::int64_t> perm);

}  // namespace rlx::ir
