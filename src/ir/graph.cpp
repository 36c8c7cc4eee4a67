#include "rlx/ir/graph.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "rlx/error.hpp"
#include "rlx/ir/custom_op.hpp"
#include "rlx/ir/dim_expr.hpp"
#include "rlx/ir/limits.hpp"
#include "rlx/ir/op_def.hpp"

namespace rlx::ir {

namespace {
std::vector<std::int64_t> normalize_axes(std::vector<std::int64_t> axes, std::size_t rank) {
  for (auto& a : axes) a = normalize_axis(a, rank);
  std::sort(axes.begin(), axes.end());
  return axes;
}
}  // namespace

std::string describe_node(const Graph& g, const Node& n) {
  std::string s = "node %" + std::to_string(n.id) + " (" + std::string(op_name(n.op));
  if (n.op == OpKind::Input || n.op == OpKind::Param) {
    if (n.attrs.has("name")) s += " '" + n.attrs.get_str("name") + "'";
  }
  s += ")";
  if (!n.inputs.empty()) {
    s += " inputs ";
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      if (i) s += ", ";
      if (i == limits::kMaxListedItems && n.inputs.size() > limits::kMaxListedItems + 1) {
        s += "... and " + std::to_string(n.inputs.size() - i) + " more";
        break;
      }
      if (n.inputs[i] < g.size()) {
        const Node& in = g.nodes()[n.inputs[i]];
        s += "%" + std::to_string(in.id) + ":" + std::string(dtype_name(in.dtype)) + in.shape.str();
      } else {
        s += "%" + std::to_string(n.inputs[i]) + ":<undefined>";
      }
    }
  }
  return s;
}

const Node& Graph::node(NodeId id) const {
  if (id >= nodes_.size())
    throw Error("graph '" + name_ + "': node %" + std::to_string(id) + " does not exist (graph has " +
                std::to_string(nodes_.size()) + " nodes)");
  return nodes_[id];
}

std::vector<NodeId> Graph::output_ids() const {
  std::vector<NodeId> ids;
  for (const auto& o : outputs_) ids.push_back(o.node);
  return ids;
}

std::vector<NodeId> Graph::input_ids() const {
  std::vector<NodeId> ids;
  for (const auto& n : nodes_)
    if (n.op == OpKind::Input) ids.push_back(n.id);
  return ids;
}

std::vector<NodeId> Graph::param_ids() const {
  std::vector<NodeId> ids;
  for (const auto& n : nodes_)
    if (n.op == OpKind::Param) ids.push_back(n.id);
  return ids;
}

static NodeId find_named(const Graph& g, OpKind kind, std::string_view name) {
  std::string known;
  for (const auto& n : g.nodes()) {
    if (n.op != kind) continue;
    if (n.attrs.get_str("name") == name) return n.id;
    known += (known.empty() ? "" : ", ") + n.attrs.get_str("name");
  }
  throw Error("graph '" + g.name() + "' has no " + std::string(op_name(kind)) + " named '" + std::string(name) + "' (" +
              (known.empty() ? "it has none" : "known: " + known) + ")");
}
NodeId Graph::find_input(std::string_view name) const { return find_named(*this, OpKind::Input, name); }
NodeId Graph::find_param(std::string_view name) const { return find_named(*this, OpKind::Param, name); }

// add() and add_declared() differ only in whether a declared type is checked.
static Node typed_node(const Graph& g, OpKind op, std::vector<NodeId> inputs, Attrs attrs, const TypeInfo* declared) {
  Node n;
  n.id = static_cast<NodeId>(g.size());
  fill_default_attrs(op, attrs);
  try {
    TypeInfo t = infer_type(g, op, inputs, attrs, declared);
    n.dtype = t.dtype;
    n.shape = std::move(t.shape);
  } catch (const Error& e) {
    throw Error("graph '" + g.name() + "', node %" + std::to_string(n.id) + ": " + e.what());
  }
  n.op = op;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  return n;
}

NodeId Graph::add(OpKind op, std::vector<NodeId> inputs, Attrs attrs) {
  return add_raw(typed_node(*this, op, std::move(inputs), std::move(attrs), nullptr));
}

NodeId Graph::add_declared(OpKind op, std::vector<NodeId> inputs, Attrs attrs, DType dtype, Shape shape) {
  TypeInfo declared{dtype, std::move(shape)};
  return add_raw(typed_node(*this, op, std::move(inputs), std::move(attrs), &declared));
}

NodeId Graph::add_raw(Node node) {
  node.id = static_cast<NodeId>(nodes_.size());
  fill_default_attrs(node.op, node.attrs);
  if (nodes_.size() >= limits::kMaxNodes)
    throw Error("graph '" + name_ + "' would have more than " + std::to_string(limits::kMaxNodes) +
                " nodes, the limit on one graph");
  for (const auto& [key, value] : node.attrs.items()) {
    const auto* body = std::get_if<GraphRef>(&value);
    if (!body || !*body) continue;
    const std::size_t depth = (*body)->nesting_depth() + 1;
    if (depth > limits::kMaxNestingDepth)
      throw Error("graph '" + name_ + "', node %" + std::to_string(node.id) + " (" + std::string(op_name(node.op)) +
                  "): its '" + key + "' body nests control flow " + std::to_string(depth) +
                  " levels deep, more than the limit of " + std::to_string(limits::kMaxNestingDepth));
    nesting_depth_ = std::max(nesting_depth_, depth);
  }
  nodes_.push_back(std::move(node));
  return nodes_.back().id;
}

std::vector<NodeId> Graph::inline_graph(const Graph& body, std::span<const NodeId> args) {
  auto inputs = body.input_ids();
  if (inputs.size() != args.size())
    throw Error("inlining graph '" + body.name() + "': it takes " + std::to_string(inputs.size()) + " inputs, got " +
                std::to_string(args.size()));
  std::vector<NodeId> map(body.size());
  std::size_t next_arg = 0;
  for (const auto& n : body.nodes()) {
    if (n.op == OpKind::Param)
      throw Error("inlining graph '" + body.name() + "': " + describe_node(body, n) +
                  " is a param; bodies take inputs only");
    if (n.op == OpKind::Input) {
      const Node& a = node(args[next_arg]);
      if (a.dtype != n.dtype || a.shape != n.shape)
        throw Error("inlining graph '" + body.name() + "': input '" + n.attrs.get_str("name") + "' is " +
                    std::string(dtype_name(n.dtype)) + n.shape.str() + ", got " + std::string(dtype_name(a.dtype)) +
                    a.shape.str());
      map[n.id] = args[next_arg++];
      continue;
    }
    Node c = n;
    for (auto& in : c.inputs) in = map[in];
    map[n.id] = add_raw(std::move(c));
  }
  std::vector<NodeId> outs;
  for (const auto& o : body.outputs()) outs.push_back(map[o.node]);
  return outs;
}

void Graph::tag_origin(NodeId first, const std::string& origin) {
  for (auto id = first; id < nodes_.size(); ++id)
    if (nodes_[id].origin.empty()) nodes_[id].origin = origin;
}

void Graph::add_output(NodeId id, std::string name) {
  node(id);  // range check
  outputs_.push_back({id, std::move(name)});
}

void Graph::set_outputs(const std::vector<NodeId>& ids) {
  outputs_.clear();
  for (auto id : ids) add_output(id);
}

// Inputs and params share one namespace: a run binds them by name.
static NodeId add_named_leaf(Graph& g, OpKind op, std::string name, Shape shape, DType dtype) {
  for (const auto& n : g.nodes())
    if ((n.op == OpKind::Input || n.op == OpKind::Param) && n.attrs.get_str("name") == name)
      throw Error("graph '" + g.name() + "': the name '" + name + "' is already used by node %" + std::to_string(n.id));
  return g.add_declared(op, {}, {{"name", std::move(name)}}, dtype, std::move(shape));
}

NodeId Graph::input(std::string name, Shape shape, DType dtype) {
  return add_named_leaf(*this, OpKind::Input, std::move(name), std::move(shape), dtype);
}

NodeId Graph::param(std::string name, Shape shape, DType dtype) {
  return add_named_leaf(*this, OpKind::Param, std::move(name), std::move(shape), dtype);
}

NodeId Graph::constant(Tensor value) {
  Shape shape(value.shape());
  DType dtype = value.dtype();
  NodeId id = add_declared(OpKind::Constant, {}, {}, dtype, std::move(shape));
  nodes_[id].value = std::make_shared<const Tensor>(std::move(value));
  return id;
}

NodeId Graph::scalar(double value, DType dtype) { return constant(Tensor::scalar(dtype, value)); }

NodeId Graph::iota(Shape shape, std::int64_t axis, DType dtype) {
  return add_declared(OpKind::Iota, {}, {{"axis", axis}}, dtype, std::move(shape));
}

NodeId Graph::random_uniform(Shape shape, std::uint64_t seed, double low, double high, DType dtype) {
  return add_declared(OpKind::RandomUniform, {},
                      {{"seed", static_cast<std::int64_t>(seed)}, {"low", low}, {"high", high}}, dtype,
                      std::move(shape));
}

NodeId Graph::random_normal(Shape shape, std::uint64_t seed, double mean, double stddev, DType dtype) {
  return add_declared(OpKind::RandomNormal, {},
                      {{"seed", static_cast<std::int64_t>(seed)}, {"mean", mean}, {"std", stddev}}, dtype,
                      std::move(shape));
}

NodeId Graph::cast(NodeId x, DType to) { return add(OpKind::Cast, {x}, {{"to", to}}); }
NodeId Graph::clamp(NodeId x, double lo, double hi) { return add(OpKind::Clamp, {x}, {{"min", lo}, {"max", hi}}); }

NodeId Graph::reduce(OpKind op, NodeId x, std::vector<std::int64_t> axes, bool keepdims) {
  if (op_info(op).cls != OpClass::Reduce || op == OpKind::ArgMax || op == OpKind::ArgMin)
    throw Error("reduce: '" + std::string(op_name(op)) + "' is not a reduction over axes");
  axes = normalize_axes(std::move(axes), node(x).shape.rank());
  return add(op, {x}, {{"axes", std::move(axes)}, {"keepdims", keepdims}});
}

NodeId Graph::argmax(NodeId x, std::int64_t axis, bool keepdims) {
  return add(OpKind::ArgMax, {x}, {{"axis", normalize_axis(axis, node(x).shape.rank())}, {"keepdims", keepdims}});
}
NodeId Graph::argmin(NodeId x, std::int64_t axis, bool keepdims) {
  return add(OpKind::ArgMin, {x}, {{"axis", normalize_axis(axis, node(x).shape.rank())}, {"keepdims", keepdims}});
}

NodeId Graph::reshape(NodeId x, std::vector<std::int64_t> shape) {
  const Shape& in = node(x).shape;
  int infer = -1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] != -1) continue;
    if (infer >= 0) throw Error("reshape of node %" + std::to_string(x) + ": more than one -1 in the target shape");
    infer = static_cast<int>(i);
  }
  if (infer >= 0) {
    std::vector<std::int64_t> others = shape;
    others.erase(others.begin() + infer);
    // Checked like every element count: a target past 2^48 elements is an error, not a wrapped product.
    const std::int64_t known =
        checked_numel(others, "reshape of node %" + std::to_string(x) + " to " + Shape(shape).str());
    auto total = in.numel();
    if (known == 0 || total % known != 0)
      throw Error("reshape of node %" + std::to_string(x) + ": cannot infer -1 from " + in.str());
    shape[static_cast<std::size_t>(infer)] = total / known;
  }
  return reshape(x, Shape(shape));
}

NodeId Graph::reshape(NodeId x, Shape shape) {
  return add_declared(OpKind::Reshape, {x}, {}, node(x).dtype, std::move(shape));
}

NodeId Graph::permute(NodeId x, std::vector<std::int64_t> perm) {
  for (auto& p : perm) p = normalize_axis(p, node(x).shape.rank());
  return add(OpKind::Permute, {x}, {{"perm", std::move(perm)}});
}

bool swaps_last_two(std::span<const std::int64_t> perm) {
  const std::size_t r = perm.size();
  if (r < 2 || perm[r - 1] != std::int64_t(r) - 2 || perm[r - 2] != std::int64_t(r) - 1) return false;
  for (std::size_t i = 0; i + 2 < r; ++i)
    if (perm[i] != std::int64_t(i)) return false;
  return true;
}

NodeId Graph::transpose(NodeId x) {
  auto r = static_cast<std::int64_t>(node(x).shape.rank());
  if (r < 2) throw Error("transpose of node %" + std::to_string(x) + " needs rank >= 2");
  std::vector<std::int64_t> perm(static_cast<std::size_t>(r));
  for (std::int64_t i = 0; i < r; ++i) perm[static_cast<std::size_t>(i)] = i;
  std::swap(perm[static_cast<std::size_t>(r - 1)], perm[static_cast<std::size_t>(r - 2)]);
  return permute(x, perm);
}

NodeId Graph::expand(NodeId x, Shape shape) {
  return add_declared(OpKind::Expand, {x}, {}, node(x).dtype, std::move(shape));
}

NodeId Graph::slice(NodeId x, std::vector<std::int64_t> axes, std::vector<std::int64_t> starts,
                    std::vector<std::int64_t> ends, std::vector<std::int64_t> steps) {
  const Shape& s = node(x).shape;
  if (steps.empty()) steps.assign(axes.size(), 1);
  if (starts.size() != axes.size() || ends.size() != axes.size() || steps.size() != axes.size())
    throw Error("slice of node %" + std::to_string(x) + ": axes, starts, ends and steps differ in length");
  if (s.rank() == 0 && !axes.empty())
    throw Error("slice of node %" + std::to_string(x) + ": it is a scalar (rank 0), which has no axis to slice");
  std::vector<std::int64_t> st(s.rank(), 0), en(s.rank()), sp(s.rank(), 1);
  for (std::size_t i = 0; i < s.rank(); ++i)
    en[i] = s[i].is_static() ? s[i].size : std::numeric_limits<std::int64_t>::max();
  for (std::size_t i = 0; i < axes.size(); ++i) {
    auto ax = static_cast<std::size_t>(normalize_axis(axes[i], s.rank()));
    if (!s[ax].is_static())
      throw Error("slice of node %" + std::to_string(x) + ": axis " + std::to_string(ax) + " is symbolic");
    if (steps[i] < 1) throw Error("slice of node %" + std::to_string(x) + ": steps must be >= 1 (use flip)");
    std::int64_t d = s[ax].size;
    auto clampi = [d](std::int64_t v) { return std::clamp(v < 0 ? v + d : v, std::int64_t{0}, d); };
    st[ax] = clampi(starts[i]);
    en[ax] = std::max(st[ax], clampi(ends[i]));
    sp[ax] = steps[i];
  }
  return add(OpKind::Slice, {x}, {{"starts", st}, {"ends", en}, {"steps", sp}});
}

NodeId Graph::narrow(NodeId x, std::int64_t axis, std::int64_t start, std::int64_t length) {
  return slice(x, {axis}, {start}, {start + length});
}

NodeId Graph::concat(std::vector<NodeId> xs, std::int64_t axis) {
  if (xs.empty()) throw Error("concat needs at least one input");
  axis = normalize_axis(axis, node(xs[0]).shape.rank());
  return add(OpKind::Concat, std::move(xs), {{"axis", axis}});
}

std::vector<NodeId> Graph::split(NodeId x, const std::vector<std::int64_t>& sizes, std::int64_t axis) {
  std::vector<NodeId> parts;
  std::int64_t start = 0;
  for (auto sz : sizes) {
    parts.push_back(narrow(x, axis, start, sz));
    start += sz;
  }
  auto ax = static_cast<std::size_t>(normalize_axis(axis, node(x).shape.rank()));
  if (start != node(x).shape[ax].size)
    throw Error("split of node %" + std::to_string(x) + ": sizes sum to " + std::to_string(start) + ", axis has " +
                node(x).shape[ax].str());
  return parts;
}

NodeId Graph::pad(NodeId x, std::vector<std::int64_t> pads, double value) {
  return add(OpKind::Pad, {x}, {{"pads", std::move(pads)}, {"value", value}});
}
NodeId Graph::gather(NodeId x, NodeId idx, std::int64_t axis) {
  return add(OpKind::Gather, {x, idx}, {{"axis", normalize_axis(axis, node(x).shape.rank())}});
}
NodeId Graph::index_select(NodeId x, NodeId idx, std::int64_t axis) {
  return add(OpKind::IndexSelect, {x, idx}, {{"axis", normalize_axis(axis, node(x).shape.rank())}});
}
NodeId Graph::scatter_add(NodeId x, NodeId idx, NodeId upd, std::int64_t axis) {
  return add(OpKind::ScatterAdd, {x, idx, upd}, {{"axis", normalize_axis(axis, node(x).shape.rank())}});
}
NodeId Graph::dynamic_update_slice(NodeId x, NodeId update, NodeId start, std::int64_t axis) {
  return add(OpKind::DynamicUpdateSlice, {x, update, start}, {{"axis", normalize_axis(axis, node(x).shape.rank())}});
}
NodeId Graph::squeeze(NodeId x, std::vector<std::int64_t> axes) {
  return add(OpKind::Squeeze, {x}, {{"axes", normalize_axes(std::move(axes), node(x).shape.rank())}});
}
NodeId Graph::unsqueeze(NodeId x, std::vector<std::int64_t> axes) {
  // The output rank is read before axes is moved from: argument evaluation order is unspecified.
  const std::size_t out_rank = node(x).shape.rank() + axes.size();
  return add(OpKind::Unsqueeze, {x}, {{"axes", normalize_axes(std::move(axes), out_rank)}});
}
NodeId Graph::flip(NodeId x, std::vector<std::int64_t> axes) {
  return add(OpKind::Flip, {x}, {{"axes", normalize_axes(std::move(axes), node(x).shape.rank())}});
}

NodeId Graph::linear(NodeId x, NodeId w, std::optional<NodeId> bias) {
  std::vector<NodeId> ins{x, w};
  if (bias) ins.push_back(*bias);
  return add(OpKind::Linear, std::move(ins));
}
NodeId Graph::softmax(NodeId x, std::int64_t axis) {
  return add(OpKind::Softmax, {x}, {{"axis", normalize_axis(axis, node(x).shape.rank())}});
}
NodeId Graph::log_softmax(NodeId x, std::int64_t axis) {
  return add(OpKind::LogSoftmax, {x}, {{"axis", normalize_axis(axis, node(x).shape.rank())}});
}
NodeId Graph::layer_norm(NodeId x, std::optional<NodeId> gamma, std::optional<NodeId> beta, std::optional<double> eps,
                         std::int64_t axis) {
  std::vector<NodeId> ins{x};
  if (gamma) ins.push_back(*gamma);
  if (beta) {
    if (!gamma) throw Error("layer_norm: beta needs gamma");
    ins.push_back(*beta);
  }
  Attrs a{{"axis", normalize_axis(axis, node(x).shape.rank())}};
  if (eps) a.set("eps", *eps);
  return add(OpKind::LayerNorm, std::move(ins), std::move(a));
}
NodeId Graph::rms_norm(NodeId x, std::optional<NodeId> gamma, std::optional<double> eps) {
  std::vector<NodeId> ins{x};
  if (gamma) ins.push_back(*gamma);
  Attrs a;
  if (eps) a.set("eps", *eps);
  return add(OpKind::RmsNorm, std::move(ins), std::move(a));
}
NodeId Graph::conv1d(NodeId x, NodeId w, std::optional<NodeId> bias, std::int64_t stride, std::int64_t padding,
                     std::int64_t dilation, std::int64_t groups) {
  std::vector<NodeId> ins{x, w};
  if (bias) ins.push_back(*bias);
  return add(OpKind::Conv1d, std::move(ins),
             {{"stride", std::vector<std::int64_t>{stride}},
              {"padding", std::vector<std::int64_t>{padding}},
              {"dilation", std::vector<std::int64_t>{dilation}},
              {"groups", groups}});
}
NodeId Graph::conv2d(NodeId x, NodeId w, std::optional<NodeId> bias, std::vector<std::int64_t> stride,
                     std::vector<std::int64_t> padding, std::vector<std::int64_t> dilation, std::int64_t groups) {
  std::vector<NodeId> ins{x, w};
  if (bias) ins.push_back(*bias);
  return add(OpKind::Conv2d, std::move(ins),
             {{"stride", std::move(stride)},
              {"padding", std::move(padding)},
              {"dilation", std::move(dilation)},
              {"groups", groups}});
}
NodeId Graph::max_pool2d(NodeId x, std::vector<std::int64_t> kernel, std::vector<std::int64_t> stride,
                         std::vector<std::int64_t> padding) {
  return add(OpKind::MaxPool2d, {x},
             {{"kernel", std::move(kernel)}, {"stride", std::move(stride)}, {"padding", std::move(padding)}});
}
NodeId Graph::avg_pool2d(NodeId x, std::vector<std::int64_t> kernel, std::vector<std::int64_t> stride,
                         std::vector<std::int64_t> padding) {
  return add(OpKind::AvgPool2d, {x},
             {{"kernel", std::move(kernel)}, {"stride", std::move(stride)}, {"padding", std::move(padding)}});
}
NodeId Graph::embedding(NodeId table, NodeId ids) { return add(OpKind::Embedding, {table, ids}); }
NodeId Graph::attention(NodeId q, NodeId k, NodeId v, std::optional<NodeId> mask, bool causal, double scale) {
  std::vector<NodeId> ins{q, k, v};
  if (mask) ins.push_back(*mask);
  return add(OpKind::Attention, std::move(ins), {{"causal", causal}, {"scale", scale}});
}

namespace {

// Bodies are shared (GraphRef), so one body may sit under many nodes and
// levels: each distinct body is verified once per call, which keeps
// verification linear where a naive walk is exponential in the nesting.
void verify_graph(const Graph& g, std::set<const Graph*>& verified) {
  if (!verified.insert(&g).second) return;
  const auto& nodes = g.nodes();
  const std::string& gname = g.name();
  const Graph& self = g;
  std::map<std::string, NodeId> names;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    auto where = [&] { return "graph '" + gname + "', " + describe_node(self, n) + ": "; };
    if (n.id != i) throw Error(where() + "id does not match its position " + std::to_string(i));
    for (auto in : n.inputs) {
      if (in >= nodes.size()) throw Error(where() + "input %" + std::to_string(in) + " is dangling (no such node)");
      if (in >= n.id)
        throw Error(where() + "input %" + std::to_string(in) +
                    " is not defined before its use (cycle or forward reference)");
    }
    std::vector<AttrSpec> schema;
    try {
      schema = attr_schema_of(n.op, n.attrs);
    } catch (const Error& e) {
      throw Error(where() + e.what());
    }
    for (const auto& item : n.attrs.items()) {
      const auto& [key, value] = item;
      auto it = std::find_if(schema.begin(), schema.end(), [&](const AttrSpec& s) { return s.key == item.first; });
      if (it == schema.end()) throw Error(where() + "unknown attribute '" + key + "'");
      bool ok = false;
      switch (it->type) {
        case AttrType::Int: ok = std::holds_alternative<std::int64_t>(value); break;
        case AttrType::Float:
          ok = std::holds_alternative<double>(value) || std::holds_alternative<std::int64_t>(value);
          break;
        case AttrType::Bool: ok = std::holds_alternative<bool>(value); break;
        case AttrType::String: ok = std::holds_alternative<std::string>(value); break;
        case AttrType::Ints: ok = std::holds_alternative<std::vector<std::int64_t>>(value); break;
        case AttrType::DType: ok = std::holds_alternative<DType>(value); break;
        case AttrType::Graph: {
          const auto* body = std::get_if<GraphRef>(&value);
          ok = body && *body;
          if (!ok) break;
          try {
            verify_graph(**body, verified);
          } catch (const Error& e) {
            throw Error(where() + "in its '" + key + "' body: " + e.what());
          }
          break;
        }
      }
      if (!ok) throw Error(where() + "attribute '" + key + "' has the wrong type");
    }
    if (n.op == OpKind::Input || n.op == OpKind::Param) {
      const auto& nm = n.attrs.get_str("name");
      auto [it, fresh] = names.emplace(nm, n.id);
      if (!fresh) throw Error(where() + "name '" + nm + "' is already used by node %" + std::to_string(it->second));
    }
    if (n.op == OpKind::Constant) {
      if (!n.value) throw Error(where() + "constant has no value");
      if (n.value->dtype() != n.dtype || Shape(n.value->shape()) != n.shape)
        throw Error(where() + "constant value does not match its declared type");
    }
    TypeInfo declared{n.dtype, n.shape};
    TypeInfo t;
    try {
      t = infer_type(self, n.op, n.inputs, n.attrs, &declared);
    } catch (const Error& e) {
      throw Error(where() + e.what());
    }
    if (t.dtype != n.dtype || t.shape != n.shape)
      throw Error(where() + "declared " + std::string(dtype_name(n.dtype)) + n.shape.str() + " but inference gives " +
                  std::string(dtype_name(t.dtype)) + t.shape.str());
  }
  for (const auto& o : g.outputs())
    if (o.node >= nodes.size())
      throw Error("graph '" + gname + "': output %" + std::to_string(o.node) + " is dangling");
}

}  // namespace

void Graph::verify() const {
  std::set<const Graph*> verified;
  verify_graph(*this, verified);
}

std::vector<std::uint32_t> Graph::use_counts() const {
  std::vector<std::uint32_t> uses(nodes_.size(), 0);
  for (const auto& n : nodes_)
    for (auto in : n.inputs) ++uses[in];
  for (const auto& o : outputs_) ++uses[o.node];
  return uses;
}

namespace {
// Shared bodies are walked once (see verify_graph).
void collect_symbols(const Graph& g, std::set<std::string, std::less<>>& out, std::set<const Graph*>& seen) {
  if (!seen.insert(&g).second) return;
  for (const auto& n : g.nodes()) {
    for (const auto& d : n.shape.dims())
      if (!d.is_static()) DimExpr::of(d).symbols(out);
    for (const auto& [key, value] : n.attrs.items())
      if (const auto* body = std::get_if<GraphRef>(&value); body && *body) collect_symbols(**body, out, seen);
  }
}

using BoundBodies = std::map<const Graph*, GraphRef>;

Graph bind_graph(const Graph& g, const std::vector<std::pair<std::string, std::int64_t>>& bindings, BoundBodies& bound);
}  // namespace

Graph bind_symbols(const Graph& g, const std::vector<std::pair<std::string, std::int64_t>>& bindings) {
  std::set<std::string, std::less<>> symbols;
  std::set<const Graph*> seen;
  collect_symbols(g, symbols, seen);
  for (const auto& [name, value] : bindings) {
    if (!symbols.contains(name)) {
      std::string known;
      for (const auto& s : symbols) known += (known.empty() ? "" : ", ") + s;
      throw Error("graph '" + g.name() + "': cannot bind the symbol '" + name + "': the graph has " +
                  (symbols.empty() ? std::string("no symbolic dims") : "the symbols " + known));
    }
    if (value < 0 || value > limits::kMaxElements)
      throw Error("graph '" + g.name() + "': symbol '" + name + "' bound to " + std::to_string(value) +
                  ", an extent must be in [0, 2^48]");
    // Bound twice: the first binding would win silently, and the other size is then a wrong answer.
    for (const auto& [other, v] : bindings)
      if (other == name && v != value)
        throw Error("graph '" + g.name() + "': symbol '" + name + "' bound to both " + std::to_string(value) + " and " +
                    std::to_string(v));
  }
  BoundBodies bound;
  return bind_graph(g, bindings, bound);
}

namespace {
Graph bind_graph(const Graph& g, const std::vector<std::pair<std::string, std::int64_t>>& bindings,
                 BoundBodies& bound) {
  // A dim expression (B*S) is evaluated as far as the bindings go; verify() below then checks the
  // extents it gives (a negative one, an element count that a reshape changes) against every node.
  auto bind = [&](Shape s) {
    for (auto& d : s.dims())
      if (!d.is_static()) d = DimExpr::of(d).substitute(bindings).dim();
    return s;
  };
  Graph out(g.name());
  for (const auto& n : g.nodes()) {
    Node c = n;
    c.shape = bind(n.shape);
    auto& attrs = c.attrs;
    for (const auto& [key, value] : n.attrs.items())  // control-flow bodies see the same bindings
      if (const auto* body = std::get_if<GraphRef>(&value); body && *body) {
        auto [it, fresh] = bound.try_emplace(body->get());  // a shared body is bound once
        if (fresh) it->second = std::make_shared<const Graph>(bind_graph(**body, bindings, bound));
        attrs.set(key, it->second);
      }
    if (n.op == OpKind::Slice) {  // symbolic axes were taken whole
      auto ends = attrs.get_ints("ends");
      for (std::size_t i = 0; i < ends.size(); ++i)
        if (ends[i] == std::numeric_limits<std::int64_t>::max() && c.shape[i].is_static())
          ends[i] = out.node(c.inputs[0]).shape[i].size;
      attrs.set("ends", ends);
    }
    out.add_raw(std::move(c));
  }
  for (const auto& o : g.outputs()) out.add_output(o.node, o.name);
  out.verify();
  return out;
}
}  // namespace

}  // namespace rlx::ir
