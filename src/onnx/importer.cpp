// The ONNX importer: parses a ModelProto (the official onnx.proto through protobuf-lite), orders the
// nodes, binds the inputs' dims, and converts node by node through the op table (ops_*.cpp). A node
// whose inputs are all known at import is built into a scratch graph and evaluated there by the
// reference interpreter, so shape subgraphs fold with the same converters that map the rest.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

#include "onnx/detail.hpp"
#include "onnx/proto/onnx.pb.h"
#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/ir/limits.hpp"
#include "rlx/onnx/onnx.hpp"
#include "rlx/reference/interpreter.hpp"

namespace rlx::onnx {

namespace {

using detail::Ctx;
using detail::I64s;
using ir::NodeId;

std::string domain_name(const std::string& d) { return d.empty() ? "ai.onnx" : d; }

// A value by its ONNX name: a graph node, a value known at import, or both.
struct Value {
  std::optional<NodeId> node;
  std::shared_ptr<const ir::Tensor> value;
  bool poisoned = false;                       // produced by an unsupported node (report mode)
  std::shared_ptr<const detail::SymInts> sym;  // a shape value with symbolic elements (detail::SymInts)
};

class Importer {
 public:
  Importer(const ::onnx::ModelProto& model, ImportOptions opts, bool report_mode)
      : model_(model), opts_(std::move(opts)), report_mode_(report_mode) {}

  Model run() {
    Model m;
    m.ir_version = model_.ir_version();
    m.producer = model_.producer_name();
    read_opsets(m);
    const auto& gp = model_.graph();
    m.graph.set_name(gp.name().empty() ? "onnx" : gp.name());
    g_ = &m.graph;
    read_initializers(gp);
    read_inputs(gp);
    for (const auto* n : topo_order(gp)) convert(*n, m);
    if (report_mode_) {
      m.report = std::move(report_);
      return m;
    }
    for (const auto& o : gp.output()) {
      auto it = values_.find(o.name());
      if (it == values_.end()) throw Error(fmt::format("onnx: graph output '{}' is produced by no node", o.name()));
      const NodeId id = materialize(o.name(), it->second);
      check_declared(o, id);
      m.graph.add_output(id, o.name());
    }
    m.graph = prune(m.graph);
    m.graph.verify();
    std::set<std::string> live;
    for (auto id : m.graph.param_ids()) live.insert(m.graph.node(id).attrs.get_str("name"));
    for (auto& p : params_)
      if (live.count(p.first)) m.params.push_back(std::move(p));
    m.report = std::move(report_);
    return m;
  }

 private:
  void read_opsets(Model& m) {
    for (const auto& os : model_.opset_import()) {
      const std::string d = domain_name(os.domain());
      if (d == "ai.onnx" && (os.version() < kMinOpset || os.version() > kMaxOpset))
        throw Error(fmt::format("onnx: unknown opset {} of domain ai.onnx (this importer reads opsets {} to {})",
                                os.version(), kMinOpset, kMaxOpset));
      m.opsets[d] = os.version();
    }
    opsets_ = m.opsets;
    if (model_.opset_import_size() == 0) throw Error("onnx: the model imports no opset (opset_import is empty)");
  }

  void read_initializers(const ::onnx::GraphProto& gp) {
    for (const auto& t : gp.initializer()) {
      if (t.name().empty()) throw Error("onnx: an initializer has no name");
      auto v = std::make_shared<const ir::Tensor>(
          detail::tensor_from_proto(t, opts_.base_dir.string(), "initializer '" + t.name() + "'"));
      values_[t.name()] = Value{std::nullopt, std::move(v)};
    }
    if (gp.sparse_initializer_size() > 0) throw Error("onnx: sparse initializers are not supported");
  }

  ir::Shape input_shape(const ::onnx::ValueInfoProto& vi) {
    if (auto it = opts_.input_shapes.find(vi.name()); it != opts_.input_shapes.end()) return ir::Shape(it->second);
    const auto& tt = vi.type().tensor_type();
    if (!tt.has_shape())
      throw Error(fmt::format("onnx: input '{}' has no shape: pass it in ImportOptions::input_shapes", vi.name()));
    std::vector<ir::Dim> dims;
    for (int i = 0; i < tt.shape().dim_size(); ++i) {
      const auto& d = tt.shape().dim(i);
      if (d.has_dim_value()) {
        if (d.dim_value() < 0)
          throw Error(fmt::format("onnx: input '{}' dim {} is negative ({})", vi.name(), i, d.dim_value()));
        dims.emplace_back(d.dim_value());
      } else if (d.has_dim_param()) {
        // A dim_param given in ImportOptions::dims is bound here; any other stays a symbolic dim, bound
        // when the graph is compiled (CompileOptions::bind) or run.
        auto b = opts_.dims.find(d.dim_param());
        if (b == opts_.dims.end()) {
          if (d.dim_param().empty() || d.dim_param().size() > 256)
            throw Error(fmt::format("onnx: input '{}' dim {} has a symbolic dim name of {} bytes", vi.name(), i,
                                    d.dim_param().size()));
          dims.push_back(ir::DimExpr::symbol(d.dim_param()).dim());
          continue;
        }
        if (b->second < 0)
          throw Error(fmt::format("onnx: dim '{}' is bound to {}, which is negative", b->first, b->second));
        dims.emplace_back(b->second);
      } else {
        throw Error(
            fmt::format("onnx: input '{}' dim {} has no extent or name: pass the input's shape "
                        "(ImportOptions::input_shapes)",
                        vi.name(), i));
      }
    }
    return ir::Shape(std::move(dims));
  }

  void read_inputs(const ::onnx::GraphProto& gp) {
    for (const auto& vi : gp.input()) {
      if (values_.count(vi.name())) continue;  // an initializer listed as an input (IR < 4): a weight
      if (!vi.type().has_tensor_type())
        throw Error(fmt::format("onnx: input '{}' is not a tensor (sequences, maps and optionals are not supported)",
                                vi.name()));
      const auto et = vi.type().tensor_type().elem_type();
      auto dt = detail::dtype_of(et);
      if (!dt)
        throw Error(fmt::format("onnx: input '{}' has element type {}, which RLX has no dtype for", vi.name(),
                                detail::onnx_type_name(et)));
      if (auto c = opts_.constant_inputs.find(vi.name()); c != opts_.constant_inputs.end()) {
        if (c->second.dtype() != *dt)
          throw Error(fmt::format("onnx: the constant given for input '{}' is {}, the input is {}", vi.name(),
                                  ir::dtype_name(c->second.dtype()), ir::dtype_name(*dt)));
        values_[vi.name()] = Value{std::nullopt, std::make_shared<const ir::Tensor>(c->second)};
        continue;
      }
      const NodeId id = g_->input(vi.name(), input_shape(vi), *dt);
      values_[vi.name()] = Value{id, nullptr};
    }
  }

  // Kahn's algorithm over the node list, keeping file order among ready nodes. A name used but never
  // defined, and a cycle, each give an error naming the node.
  std::vector<const ::onnx::NodeProto*> topo_order(const ::onnx::GraphProto& gp) {
    const int n = gp.node_size();
    std::unordered_map<std::string, int> producer;
    for (int i = 0; i < n; ++i)
      for (const auto& o : gp.node(i).output()) {
        if (o.empty()) continue;
        if (values_.count(o) || !producer.emplace(o, i).second)
          throw Error(fmt::format("onnx: value '{}' is defined twice (node '{}')", o, gp.node(i).name()));
      }
    std::vector<int> pending(static_cast<std::size_t>(n), 0);
    std::vector<std::vector<int>> users(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      std::set<int> deps;
      for (const auto& in : gp.node(i).input()) {
        if (in.empty() || values_.count(in)) continue;
        auto p = producer.find(in);
        if (p == producer.end())
          throw Error(fmt::format("onnx: node '{}' ({}) reads '{}', which no input, initializer or node defines",
                                  gp.node(i).name(), gp.node(i).op_type(), in));
        deps.insert(p->second);
      }
      // A subgraph (If's branches) may read this graph's values by name: those are dependencies too.
      std::vector<std::string> captured;
      subgraph_reads(gp.node(i), captured);
      for (const auto& in : captured)
        if (auto p = producer.find(in); p != producer.end() && p->second != i) deps.insert(p->second);
      pending[std::size_t(i)] = int(deps.size());
      for (int d : deps) users[std::size_t(d)].push_back(i);
    }
    std::set<int> ready;
    for (int i = 0; i < n; ++i)
      if (pending[std::size_t(i)] == 0) ready.insert(i);
    std::vector<const ::onnx::NodeProto*> order;
    while (!ready.empty()) {
      const int i = *ready.begin();
      ready.erase(ready.begin());
      order.push_back(&gp.node(i));
      for (int u : users[std::size_t(i)])
        if (--pending[std::size_t(u)] == 0) ready.insert(u);
    }
    if (int(order.size()) != n) {
      for (int i = 0; i < n; ++i)
        if (pending[std::size_t(i)] > 0)
          throw Error(fmt::format("onnx: the graph has a cycle through node '{}' ({})", gp.node(i).name(),
                                  gp.node(i).op_type()));
    }
    return order;
  }

  // The names the nodes of `n`'s subgraphs read, nested ones included (protobuf bounds the nesting).
  static void subgraph_reads(const ::onnx::NodeProto& n, std::vector<std::string>& out) {
    for (const auto& a : n.attribute()) {
      if (!a.has_g()) continue;
      for (const auto& sn : a.g().node()) {
        out.insert(out.end(), sn.input().begin(), sn.input().end());
        subgraph_reads(sn, out);
      }
      for (const auto& o : a.g().output()) out.push_back(o.name());
    }
  }

  // If with a condition known at import: the chosen branch's nodes are imported in place, reading the
  // enclosing graph's values by name. Returns false when the condition is not known.
  bool inline_if(const ::onnx::NodeProto& n, const std::vector<Value*>& ins, Model& m, const std::string& where) {
    if (ins.size() != 1 || !ins[0] || !ins[0]->value) return false;
    const bool cond = ins[0]->value->numel() == 1 && ins[0]->value->get(0) != 0;
    const char* key = cond ? "then_branch" : "else_branch";
    const ::onnx::GraphProto* branch = nullptr;
    for (const auto& a : n.attribute())
      if (a.name() == key && a.has_g()) branch = &a.g();
    if (!branch) throw Error(fmt::format("{}: no {} graph", where, key));
    if (branch->output_size() != n.output_size())
      throw Error(
          fmt::format("{}: {} has {} outputs, the node {}", where, key, branch->output_size(), n.output_size()));
    read_initializers(*branch);
    for (const auto* sn : topo_order(*branch)) convert(*sn, m);
    for (int i = 0; i < n.output_size(); ++i) {
      if (n.output(i).empty()) continue;
      auto it = values_.find(branch->output(i).name());
      if (it == values_.end())
        throw Error(fmt::format("{}: {} output '{}' is not defined", where, key, branch->output(i).name()));
      values_[n.output(i)] = it->second;
    }
    report_.push_back({n.name(), n.op_type(), "ai.onnx", NodeReport::Fate::Folded, std::string("inlined ") + key});
    return true;
  }

  // The names a graph defines: its inputs, initializers and node outputs, nested subgraphs' included.
  static void defined_names(const ::onnx::GraphProto& g, std::vector<std::string>& out) {
    for (const auto& i : g.input()) out.push_back(i.name());
    for (const auto& t : g.initializer()) out.push_back(t.name());
    for (const auto& n : g.node()) {
      out.insert(out.end(), n.output().begin(), n.output().end());
      for (const auto& a : n.attribute())
        if (a.has_g()) defined_names(a.g(), out);
    }
  }

  // Loop with a trip count and conditions known at import, unrolled: the body is imported once per
  // iteration with its inputs bound to the iteration number, the condition and the carried values; its
  // names are dropped after each iteration. Scan outputs are stacked along a new first axis. Returns false
  // when the trip count or the first condition is not known, when the body's condition turns out not to
  // be, or past 4096 iterations: what the unrolling added is then dropped (its graph nodes are pruned),
  // and the loop becomes a run-time while (runtime_loop).
  bool unroll_loop(const ::onnx::NodeProto& n, const std::vector<Value*>& ins, Model& m, const std::string& where) {
    const bool has_m = !ins.empty() && ins[0], has_cond = ins.size() > 1 && ins[1];
    if ((has_m && !ins[0]->value) || (has_cond && !ins[1]->value)) return false;
    if (!has_m && !has_cond) throw Error(where + ": a loop without a trip count or a condition never ends");
    const ::onnx::GraphProto* body = nullptr;
    for (const auto& a : n.attribute())
      if (a.name() == "body" && a.has_g()) body = &a.g();
    if (!body) throw Error(where + ": no body graph");
    const int carried = n.input_size() - 2;
    const int scans = body->output_size() - 1 - carried;
    if (carried < 0 || scans < 0 || body->input_size() != 2 + carried || n.output_size() != carried + scans)
      throw Error(where + ": the body's inputs and outputs do not match the node's");
    if ((has_m && ins[0]->value->numel() != 1) || (has_cond && ins[1]->value->numel() != 1))
      throw Error(where + ": the trip count and the condition must hold one element each");
    // Past 4096 the unrolling stops with an error anyway; clamping first keeps the cast defined.
    const std::int64_t trips = has_m ? std::int64_t(std::clamp(ins[0]->value->get(0), -1.0, 4097.0)) : 4097;
    bool cond = !has_cond || ins[1]->value->get(0) != 0;
    // Without scan outputs, a trip count over 4096 goes straight to the while; with them the unrolling is
    // still tried, as the body's condition may end the loop sooner.
    if (scans == 0 && has_m && trips > 4096 && cond) return false;
    std::vector<Value> state;
    for (std::size_t j = 2; j < ins.size(); ++j) {
      if (!ins[j]) throw Error(where + ": a loop-carried input is missing");
      state.push_back(*ins[j]);
    }
    std::vector<std::vector<Value>> scanned(static_cast<std::size_t>(scans));
    std::vector<std::string> local;
    defined_names(*body, local);
    const std::size_t report_mark = report_.size();
    auto give_up = [&] {
      for (const auto& name : local) values_.erase(name);
      report_.resize(report_mark);
      return false;
    };
    std::int64_t it = 0;
    for (; it < trips && cond; ++it) {
      if (it >= 4096) return give_up();
      values_[body->input(0).name()] =
          Value{std::nullopt, std::make_shared<const ir::Tensor>(ir::Tensor::scalar(ir::DType::I64, double(it)))};
      values_[body->input(1).name()] =
          Value{std::nullopt, std::make_shared<const ir::Tensor>(ir::Tensor::scalar(ir::DType::Bool, 1))};
      for (int j = 0; j < carried; ++j) values_[body->input(2 + j).name()] = state[std::size_t(j)];
      read_initializers(*body);
      for (const auto* sn : topo_order(*body)) convert(*sn, m);
      auto out = [&](int i) {
        auto f = values_.find(body->output(i).name());
        if (f == values_.end())
          throw Error(fmt::format("{}: body output '{}' is not defined", where, body->output(i).name()));
        return f->second;
      };
      const Value c = out(0);
      if (!c.value) return give_up();
      cond = c.value->numel() == 1 && c.value->get(0) != 0;
      for (int j = 0; j < carried; ++j) state[std::size_t(j)] = out(1 + j);
      for (int k = 0; k < scans; ++k) scanned[std::size_t(k)].push_back(out(1 + carried + k));
      for (const auto& name : local) values_.erase(name);
    }
    for (int j = 0; j < carried; ++j)
      if (!n.output(j).empty()) values_[n.output(j)] = state[std::size_t(j)];
    for (int k = 0; k < scans; ++k) {
      if (scanned[std::size_t(k)].empty())
        throw Error(where + ": a loop that runs no iteration has scan outputs of unknown shape");
      std::vector<NodeId> parts;
      for (std::size_t i = 0; i < scanned[std::size_t(k)].size(); ++i) {
        auto& v = scanned[std::size_t(k)][i];
        parts.push_back(g_->unsqueeze(materialize(fmt::format("{}/{}", n.output(carried + k), i), v), {0}));
      }
      if (!n.output(carried + k).empty()) values_[n.output(carried + k)] = Value{g_->concat(parts, 0), nullptr};
    }
    report_.push_back(
        {n.name(), n.op_type(), "ai.onnx", NodeReport::Fate::Mapped, fmt::format("unrolled {} iterations", it)});
    return true;
  }

  // ---- run-time control flow: ONNX subgraphs as RLX bodies (rlx/ir/control_flow.hpp) ----

  // While a subgraph is imported into a body graph, the importer's graph and values are the body's; the
  // destructor restores the enclosing scope's.
  class BodyScope {
   public:
    BodyScope(Importer& im, ir::Graph& body)
        : im_(im), g_(std::exchange(im.g_, &body)), values_(std::exchange(im.values_, {})) {
      ++im_.body_depth_;
    }
    ~BodyScope() {
      im_.g_ = g_;
      im_.values_ = std::move(values_);
      --im_.body_depth_;
    }
    BodyScope(const BodyScope&) = delete;
    BodyScope& operator=(const BodyScope&) = delete;

   private:
    Importer& im_;
    ir::Graph* g_;
    std::unordered_map<std::string, Value> values_;
  };

  // The values of the enclosing scope that a node's subgraphs read. Those known at import and small enough
  // to be constants are copied into the bodies, where they fold; the rest are passed in as operands (`nodes`,
  // materialized here) and become body inputs after the op's own.
  struct Captures {
    std::vector<std::string> names;  // the operands', in order
    std::vector<NodeId> nodes;
    std::vector<ir::TypeInfo> types;  // the operands' types
    std::vector<std::pair<std::string, Value>> known;
    bool poisoned = false;
  };
  Captures captures_of(const ::onnx::NodeProto& n) {
    std::vector<std::string> reads, local;
    subgraph_reads(n, reads);
    for (const auto& a : n.attribute())
      if (a.has_g()) defined_names(a.g(), local);
    const std::set<std::string> own(local.begin(), local.end());
    std::set<std::string> seen;
    Captures c;
    for (const auto& name : reads) {
      if (name.empty() || own.count(name) || !seen.insert(name).second) continue;
      auto it = values_.find(name);
      if (it == values_.end()) continue;  // topo_order names what nothing defines
      Value& v = it->second;
      c.poisoned = c.poisoned || v.poisoned;
      if (v.poisoned) continue;
      if (v.value && v.value->numel() <= opts_.max_constant_elements) {
        c.known.emplace_back(name, Value{std::nullopt, v.value});
      } else {
        c.names.push_back(name);
        c.nodes.push_back(materialize(name, v));
        c.types.push_back({g_->node(c.nodes.back()).dtype, g_->node(c.nodes.back()).shape});
      }
    }
    return c;
  }

  // An ONNX subgraph imported as an RLX body: `inputs` are its own inputs (a name and the type the op
  // passes), then one input per capture operand. `finish`, when given, maps the subgraph's outputs to the
  // body's (inside the body's scope). `poisoned`: the subgraph reads an unsupported node's result (report
  // mode).
  struct Body {
    ir::GraphRef graph;
    bool poisoned = false;
  };
  using Finish = std::function<std::vector<NodeId>(std::vector<NodeId>)>;
  Body import_body(const ::onnx::GraphProto& sub, const std::string& what,
                   const std::vector<std::pair<std::string, ir::TypeInfo>>& inputs, const Captures& cap, Model& m,
                   const std::string& where, const Finish& finish = {}) {
    ir::Graph body(sub.name().empty() ? what : sub.name());
    Body out;
    {
      BodyScope scope(*this, body);
      auto bind = [&](const std::string& name, const ir::TypeInfo& t) {
        if (values_.count(name))
          throw Error(fmt::format("{}: the {} takes '{}' twice (as an input and as a value of the enclosing graph)",
                                  where, what, name));
        values_[name] = Value{g_->input(name, t.shape, t.dtype), nullptr};
      };
      for (const auto& [name, t] : inputs) bind(name, t);
      for (std::size_t i = 0; i < cap.names.size(); ++i) bind(cap.names[i], cap.types[i]);
      for (const auto& [name, v] : cap.known) values_.emplace(name, v);
      read_initializers(sub);
      for (const auto* sn : topo_order(sub)) convert(*sn, m);
      std::vector<NodeId> outs;
      for (const auto& o : sub.output()) {
        auto it = values_.find(o.name());
        if (it == values_.end()) throw Error(fmt::format("{}: {} output '{}' is not defined", where, what, o.name()));
        if (it->second.poisoned) {
          out.poisoned = true;
          return out;
        }
        outs.push_back(materialize(o.name(), it->second));
      }
      if (finish) outs = finish(std::move(outs));
      for (NodeId o : outs) g_->add_output(o);
    }
    try {
      out.graph = ir::body_ref(prune(body));
    } catch (const Error& e) {
      throw Error(fmt::format("{}: {}: {}", where, what, e.what()));
    }
    return out;
  }

  static const ::onnx::GraphProto& subgraph(const ::onnx::NodeProto& n, std::string_view key,
                                            const std::string& where) {
    for (const auto& a : n.attribute())
      if (a.name() == key && a.has_g()) return a.g();
    throw Error(fmt::format("{}: no {} graph", where, key));
  }

  // A condition as the bool scalar RLX's if and while take (ONNX allows any one-element bool tensor).
  NodeId bool_scalar(NodeId x, const std::string& where, std::string_view what) {
    const auto& node = g_->node(x);
    if (node.dtype != ir::DType::Bool || node.shape.numel() != 1)
      throw Error(fmt::format("{}: {} is {}{}; it must be a bool tensor of one element", where, what,
                              ir::dtype_name(node.dtype), node.shape.str()));
    return node.shape.rank() == 0 ? x : g_->reshape(x, ir::Shape(std::vector<std::int64_t>{}));
  }

  // If on a run-time condition: RLX's if, with both branches as bodies. The values of the enclosing graph
  // the branches read are the if's operands. Returns false when a branch reads an unsupported node's result.
  bool runtime_if(const ::onnx::NodeProto& n, const std::vector<Value*>& ins, Model& m, const std::string& where) {
    if (ins.size() != 1 || !ins[0]) throw Error(where + ": If takes one input, the condition");
    const NodeId cond = bool_scalar(materialize(n.input(0), *ins[0]), where, "the condition");
    const auto& then_g = subgraph(n, "then_branch", where);
    const auto& else_g = subgraph(n, "else_branch", where);
    for (const auto* b : {&then_g, &else_g})
      if (b->output_size() != n.output_size())
        throw Error(fmt::format("{}: {} has {} outputs, the node {}", where,
                                b == &then_g ? "then_branch" : "else_branch", b->output_size(), n.output_size()));
    const auto cap = captures_of(n);
    if (cap.poisoned) return false;
    const auto tb = import_body(then_g, "then_branch", {}, cap, m, where);
    const auto eb = import_body(else_g, "else_branch", {}, cap, m, where);
    if (tb.poisoned || eb.poisoned) return false;
    std::vector<NodeId> outs;
    try {
      outs = ir::if_else(*g_, cond, tb.graph, eb.graph, cap.nodes);
    } catch (const Error& e) {
      throw Error(fmt::format("{}: {}", where, e.what()));
    }
    for (int i = 0; i < n.output_size(); ++i)
      if (!n.output(i).empty()) values_[n.output(i)] = Value{outs[std::size_t(i)], nullptr};
    report_.push_back({n.name(), n.op_type(), "ai.onnx", NodeReport::Fate::Mapped,
                       fmt::format("if on a run-time condition ({} operands)", cap.nodes.size())});
    return true;
  }

  // Loop whose trip count or conditions are known only at run time: RLX's while. Its carries are the
  // iteration number, the condition and the loop-carried values; its consts the trip count (when it is
  // not known at import; a known one is the while's max_trip_count) and the values of the enclosing graph
  // the body reads. Scan outputs are refused: their extent would be known only at run time.
  bool runtime_loop(const ::onnx::NodeProto& n, const std::vector<Value*>& ins, Model& m, const std::string& where) {
    const auto& body = subgraph(n, "body", where);
    const int carried = n.input_size() - 2;
    const int scans = body.output_size() - 1 - carried;
    if (carried < 0 || scans < 0 || body.input_size() != 2 + carried || n.output_size() > carried + scans)
      throw Error(where + ": the body's inputs and outputs do not match the node's");
    if (scans > 0)
      throw Error(fmt::format(
          "{}: the loop has {} scan outputs, whose extent must be known at import: they need the trip count and "
          "every condition known at import (the loop is then unrolled, up to 4096 iterations)",
          where, scans));
    const bool has_m = !ins.empty() && ins[0], has_cond = ins.size() > 1 && ins[1];
    if (!has_m && !has_cond) throw Error(where + ": a loop without a trip count or a condition never ends");
    std::int64_t max_trips = -1;
    std::optional<NodeId> trip_count;
    if (has_m && ins[0]->value) {
      if (ins[0]->value->numel() != 1) throw Error(where + ": the trip count M must hold one element");
      max_trips = std::int64_t(std::clamp(ins[0]->value->get(0), 0.0, 9.2e18));
    } else if (has_m) {
      const NodeId mm = materialize(n.input(0), *ins[0]);
      const auto& node = g_->node(mm);
      if (node.dtype != ir::DType::I64 || node.shape.numel() != 1)
        throw Error(fmt::format("{}: the trip count M is {}{}; it must be an int64 tensor of one element", where,
                                ir::dtype_name(node.dtype), node.shape.str()));
      trip_count = node.shape.rank() == 0 ? mm : g_->reshape(mm, ir::Shape(std::vector<std::int64_t>{}));
    }
    const ir::TypeInfo i64{ir::DType::I64, ir::Shape(std::vector<std::int64_t>{})},
        flag{ir::DType::Bool, ir::Shape(std::vector<std::int64_t>{})};
    std::vector<NodeId> init{g_->scalar(0, ir::DType::I64),
                             has_cond ? bool_scalar(materialize(n.input(1), *ins[1]), where, "the condition")
                                      : g_->scalar(1, ir::DType::Bool)};
    std::vector<std::pair<std::string, ir::TypeInfo>> inputs{{body.input(0).name(), i64}, {body.input(1).name(), flag}};
    for (int j = 0; j < carried; ++j) {
      if (!ins[std::size_t(j) + 2]) throw Error(where + ": a loop-carried input is missing");
      init.push_back(materialize(n.input(2 + j), *ins[std::size_t(j) + 2]));
      inputs.emplace_back(body.input(2 + j).name(),
                          ir::TypeInfo{g_->node(init.back()).dtype, g_->node(init.back()).shape});
    }
    std::vector<NodeId> consts;
    if (trip_count) {
      consts.push_back(*trip_count);
      inputs.emplace_back("%trip_count", i64);
    }
    const auto cap = captures_of(n);
    if (cap.poisoned) return false;
    consts.insert(consts.end(), cap.nodes.begin(), cap.nodes.end());
    // The body: (iteration, condition, carried..., consts...) -> (iteration + 1, its condition, carried...).
    const std::string iter_name = body.input(0).name();
    const auto b = import_body(body, "body", inputs, cap, m, where, [&](std::vector<NodeId> outs) {
      std::vector<NodeId> next{g_->add(*values_.at(iter_name).node, g_->scalar(1, ir::DType::I64)),
                               bool_scalar(outs[0], where, "the body's condition output")};
      for (int j = 0; j < carried; ++j) {
        const auto& have = g_->node(outs[std::size_t(j) + 1]);
        const auto& want = inputs[std::size_t(j) + 2].second;
        if (have.dtype != want.dtype || have.shape != want.shape)
          throw Error(
              fmt::format("{}: loop-carried value {} ('{}'): the body gives {}{} for it, but it enters the "
                          "loop as {}{} (a run-time loop keeps each carried value's type)",
                          where, j, n.input(2 + j), ir::dtype_name(have.dtype), have.shape.str(),
                          ir::dtype_name(want.dtype), want.shape.str()));
        next.push_back(outs[std::size_t(j) + 1]);
      }
      return next;
    });
    if (b.poisoned) return false;
    // The condition: (iteration, condition, carried..., consts...) -> condition [and iteration < M].
    ir::Graph cond("loop_condition");
    const NodeId ci = cond.input("iteration", i64.shape, i64.dtype);
    NodeId keep_on = cond.input("condition", flag.shape, flag.dtype);
    for (int j = 0; j < carried; ++j) {
      const auto& t = inputs[std::size_t(j) + 2].second;
      cond.input(fmt::format("carried{}", j), t.shape, t.dtype);
    }
    if (trip_count)
      keep_on = cond.binary(ir::OpKind::And, keep_on,
                            cond.binary(ir::OpKind::Lt, ci, cond.input("trip_count", i64.shape, i64.dtype)));
    for (std::size_t k = 0; k < cap.types.size(); ++k)
      cond.input(fmt::format("capture{}", k), cap.types[k].shape, cap.types[k].dtype);
    cond.add_output(keep_on);
    std::vector<NodeId> outs;
    try {
      outs = ir::while_loop(*g_, ir::body_ref(std::move(cond)), b.graph, init, consts, max_trips);
    } catch (const Error& e) {
      throw Error(fmt::format("{}: {}", where, e.what()));
    }
    for (int j = 0; j < n.output_size(); ++j)
      if (!n.output(j).empty()) values_[n.output(j)] = Value{outs[std::size_t(j) + 2], nullptr};
    report_.push_back({n.name(), n.op_type(), "ai.onnx", NodeReport::Fate::Mapped,
                       max_trips >= 0 ? fmt::format("while (at most {} iterations)", max_trips)
                                      : std::string("while (trip count known at run time)")});
    return true;
  }

  // Scan: RLX's scan over the common extent of the scan inputs' axes (static, as every shape is), with
  // the state variables as carries and the values of the enclosing graph the body reads as consts. A scan
  // input's axis moves to the front and a reversed one is flipped; each scan output's stacked axis moves to
  // its scan_output_axes entry and a reversed one is flipped. Opset 8's batch axis becomes an outer scan
  // over the batch.
  bool runtime_scan(const ::onnx::NodeProto& n, const std::vector<Value*>& ins, Model& m, std::int64_t opset,
                    const std::string& where) {
    Ctx c(*g_, n, "ai.onnx", opset, {}, {});
    const auto& body = subgraph(n, "body", where);
    const std::int64_t nscan = c.attr_int("num_scan_inputs");
    const int first = opset < 9 ? 1 : 0;  // opset 8's sequence_lens
    const std::int64_t nstate = std::int64_t(ins.size()) - first - nscan;
    const std::int64_t nout = body.output_size() - nstate;
    if (nscan < 1 || nstate < 0 || nout < 0 || body.input_size() != nstate + nscan || n.output_size() > nstate + nout)
      c.fail("the body's inputs and outputs do not match the node's (num_scan_inputs, states, scan outputs)");
    const auto dirs_in = c.attr_ints(opset < 9 ? "directions" : "scan_input_directions", I64s(std::size_t(nscan), 0));
    const auto axes_in = c.attr_ints("scan_input_axes", I64s(std::size_t(nscan), 0));
    const auto dirs_out = c.attr_ints("scan_output_directions", I64s(std::size_t(nout), 0));
    const auto axes_out = c.attr_ints("scan_output_axes", I64s(std::size_t(nout), 0));
    if (dirs_in.size() != std::size_t(nscan) || axes_in.size() != std::size_t(nscan) ||
        dirs_out.size() != std::size_t(nout) || axes_out.size() != std::size_t(nout))
      c.fail("the direction and axis lists must have one entry per scan input or scan output");
    auto operand = [&](std::size_t i) {
      if (!ins[i]) c.fail(fmt::format("input {} is missing", i));
      return materialize(n.input(int(i)), *ins[i]);
    };
    std::vector<NodeId> states, xs;
    for (std::int64_t j = 0; j < nstate; ++j) states.push_back(operand(std::size_t(first + j)));
    for (std::int64_t j = 0; j < nscan; ++j) xs.push_back(operand(std::size_t(first + nstate + j)));
    auto type = [&](NodeId x, std::size_t drop) {
      const auto e = ext(x);
      return ir::TypeInfo{g_->node(x).dtype, ir::Shape(I64s(e.begin() + std::ptrdiff_t(drop), e.end()))};
    };
    const auto cap = captures_of(n);
    if (cap.poisoned) return false;
    std::vector<NodeId> res;
    try {
      if (opset >= 9) {
        std::int64_t length = -1;
        for (std::int64_t j = 0; j < nscan; ++j) {
          auto& x = xs[std::size_t(j)];
          const auto r = g_->node(x).shape.rank();
          const auto a = detail::axis_of(c, axes_in[std::size_t(j)], r);
          if (length >= 0 && ext(x)[std::size_t(a)] != length)
            c.fail(fmt::format("scan input {} has {} steps along axis {}, the first {}", j, ext(x)[std::size_t(a)], a,
                               length));
          length = ext(x)[std::size_t(a)];
          if (a != 0) {
            I64s perm{a};
            for (std::int64_t i = 0; i < std::int64_t(r); ++i)
              if (i != a) perm.push_back(i);
            x = g_->permute(x, perm);
          }
          if (dirs_in[std::size_t(j)] != 0) x = g_->flip(x, {0});
        }
        std::vector<std::pair<std::string, ir::TypeInfo>> inputs;
        for (std::int64_t j = 0; j < nstate; ++j)
          inputs.emplace_back(body.input(int(j)).name(), type(states[std::size_t(j)], 0));
        for (std::int64_t j = 0; j < nscan; ++j)
          inputs.emplace_back(body.input(int(nstate + j)).name(), type(xs[std::size_t(j)], 1));
        const auto b = import_body(body, "body", inputs, cap, m, where);
        if (b.poisoned) return false;
        res = ir::scan(*g_, b.graph, states, xs, length, false, cap.nodes);
        for (std::int64_t k = 0; k < nout; ++k) {
          auto& y = res[std::size_t(nstate + k)];
          if (dirs_out[std::size_t(k)] != 0) y = g_->flip(y, {0});
          const auto r = g_->node(y).shape.rank();
          const auto a = detail::axis_of(c, axes_out[std::size_t(k)], r);
          if (a != 0) {  // the non-stacked axes in order, the stacked one inserted at a
            I64s perm;
            for (std::int64_t i = 1; i < std::int64_t(r); ++i) perm.push_back(i);
            perm.insert(perm.begin() + a, 0);
            y = g_->permute(y, perm);
          }
        }
      } else {
        // Opset 8: states [B, ...] and scan inputs [B, S, ...]; an outer scan over the batch runs the scan
        // over the sequence for each batch entry.
        if (!xs.empty() && g_->node(xs[0]).shape.rank() < 2) c.fail("scan inputs must be [batch, sequence, ...]");
        const std::int64_t batch = ext(xs[0])[0], seq = ext(xs[0])[1];
        for (auto x : states)
          if (g_->node(x).shape.rank() < 1 || ext(x)[0] != batch) c.fail("states must be [batch, ...]");
        for (auto x : xs)
          if (g_->node(x).shape.rank() < 2 || ext(x)[0] != batch || ext(x)[1] != seq)
            c.fail("scan inputs must be [batch, sequence, ...] with one batch and sequence length");
        if (ins[0]) {
          if (!ins[0]->value) c.fail("sequence_lens must be known at import");
          for (std::int64_t i = 0; i < ins[0]->value->numel(); ++i)
            if (ins[0]->value->get(i) != double(seq))
              c.fail("sequence_lens shorter than the sequence is not supported");
        }
        std::vector<std::pair<std::string, ir::TypeInfo>> inputs;
        for (std::int64_t j = 0; j < nstate; ++j)
          inputs.emplace_back(body.input(int(j)).name(), type(states[std::size_t(j)], 1));
        for (std::int64_t j = 0; j < nscan; ++j)
          inputs.emplace_back(body.input(int(nstate + j)).name(), type(xs[std::size_t(j)], 2));
        const auto inner = import_body(body, "body", inputs, cap, m, where);
        if (inner.poisoned) return false;
        ir::Graph outer("scan_batch_entry");
        std::vector<NodeId> st, sx, consts;
        for (auto x : states)
          st.push_back(outer.input(fmt::format("state{}", st.size()), type(x, 1).shape, g_->node(x).dtype));
        for (std::size_t j = 0; j < xs.size(); ++j) {
          NodeId x = outer.input(fmt::format("input{}", j), type(xs[j], 1).shape, g_->node(xs[j]).dtype);
          sx.push_back(dirs_in[j] != 0 ? outer.flip(x, {0}) : x);
        }
        for (std::size_t k = 0; k < cap.types.size(); ++k)
          consts.push_back(outer.input(fmt::format("capture{}", k), cap.types[k].shape, cap.types[k].dtype));
        for (NodeId o : ir::scan(outer, inner.graph, st, sx, seq, false, consts)) outer.add_output(o);
        std::vector<NodeId> batched = states;
        batched.insert(batched.end(), xs.begin(), xs.end());
        res = ir::scan(*g_, ir::body_ref(std::move(outer)), {}, batched, batch, false, cap.nodes);
      }
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.rfind("onnx: node", 0) == 0) throw;
      throw Error(fmt::format("{}: {}", where, what));
    }
    for (int i = 0; i < n.output_size(); ++i)
      if (!n.output(i).empty()) values_[n.output(i)] = Value{res[std::size_t(i)], nullptr};
    report_.push_back({n.name(), n.op_type(), "ai.onnx", NodeReport::Fate::Mapped,
                       fmt::format("scan ({} states, {} scan inputs)", nstate, nscan)});
    return true;
  }

  detail::I64s ext(NodeId x) const { return g_->node(x).shape.extents(); }

  // A value known at import enters the graph once, as a constant or a param (the promote rule); a shape
  // value with symbolic elements as the run-time data detail::dims_value builds.
  NodeId materialize(const std::string& name, Value& v) {
    if (v.node) return *v.node;
    if (v.sym) {
      const auto& s = *v.sym;
      ir::Shape shape = s.scalar ? ir::Shape() : ir::Shape{std::int64_t(s.elems.size())};
      NodeId id = detail::dims_value(*g_, s.elems, shape);
      v.node = s.dtype == ir::DType::I64 ? id : g_->cast(id, s.dtype);
      return *v.node;
    }
    const ir::Tensor& t = *v.value;
    if (t.numel() <= opts_.max_constant_elements || body_depth_ > 0) {  // bodies take no params
      v.node = g_->constant(t);
    } else {
      v.node = g_->param(name, ir::Shape(t.shape()), t.dtype());
      params_.emplace_back(name, t);
    }
    return *v.node;
  }

  void check_declared(const ::onnx::ValueInfoProto& vi, NodeId id) {
    if (!vi.type().has_tensor_type()) return;
    const auto& tt = vi.type().tensor_type();
    const auto& n = g_->node(id);
    if (auto dt = detail::dtype_of(tt.elem_type()); dt && tt.elem_type() != 0 && *dt != n.dtype)
      throw Error(fmt::format("onnx: output '{}' is declared {} but computes to {}", vi.name(),
                              detail::onnx_type_name(tt.elem_type()), ir::dtype_name(n.dtype)));
    if (!tt.has_shape()) return;
    if (tt.shape().dim_size() != int(n.shape.rank()))
      throw Error(fmt::format("onnx: output '{}' is declared with rank {} but computes to shape {}", vi.name(),
                              tt.shape().dim_size(), n.shape.str()));
    for (int i = 0; i < tt.shape().dim_size(); ++i) {
      const auto& d = tt.shape().dim(i);
      if (d.has_dim_value() && n.shape[std::size_t(i)].is_static() && d.dim_value() != n.shape[std::size_t(i)].size)
        throw Error(
            fmt::format("onnx: mismatched shapes: output '{}' is declared with dim {} = {} but computes to "
                        "shape {}",
                        vi.name(), i, d.dim_value(), n.shape.str()));
    }
  }

  void convert(const ::onnx::NodeProto& n, Model& m) {
    const std::string domain = domain_name(n.domain());
    auto os = opsets_.find(domain);
    const std::int64_t opset = os == opsets_.end() ? -1 : os->second;
    auto where = [&] {
      return fmt::format("onnx: node '{}' ({}, domain {}, opset {})", n.name(), n.op_type(), domain, opset);
    };
    const auto& table = detail::op_table();
    auto entry = domain == "ai.onnx" ? table.find(n.op_type()) : table.end();
    std::vector<Value*> ins;
    bool poisoned = false;
    for (const auto& name : n.input()) {
      if (name.empty()) {
        ins.push_back(nullptr);
        continue;
      }
      Value& v = values_.at(name);  // topo_order checked every name
      poisoned = poisoned || v.poisoned;
      ins.push_back(&v);
    }
    auto record = [&](NodeReport::Fate fate, std::string detail) {
      report_.push_back({n.name(), n.op_type(), domain, fate, std::move(detail)});
    };
    auto poison = [&] {
      for (const auto& o : n.output())
        if (!o.empty()) values_[o].poisoned = true;
    };
    if (poisoned) {
      record(NodeReport::Fate::Unsupported, "reads the result of an unsupported node");
      return poison();
    }
    if (opset < 0) throw Error(where() + ": the model imports no opset for this domain");
    if (domain == "ai.onnx" && (n.op_type() == "If" || n.op_type() == "Loop" || n.op_type() == "Scan")) {
      // Resolved at import when the condition or trip count is known; otherwise RLX's if, while or scan.
      if (n.op_type() == "If" && (inline_if(n, ins, m, where()) || runtime_if(n, ins, m, where()))) return;
      if (n.op_type() == "Loop" && (unroll_loop(n, ins, m, where()) || runtime_loop(n, ins, m, where()))) return;
      if (n.op_type() == "Scan" && runtime_scan(n, ins, m, opset, where())) return;
      record(NodeReport::Fate::Unsupported, "a subgraph reads the result of an unsupported node");
      return poison();
    }
    if (entry == table.end()) {
      const std::string msg = where() + ": unsupported op" +
                              (domain == "ai.onnx" ? std::string(" (docs/onnx-coverage.md lists the supported ones)")
                                                   : std::string(" (only the default domain ai.onnx is supported)"));
      if (!report_mode_) throw Error(msg);
      record(NodeReport::Fate::Unsupported, msg);
      return poison();
    }

    if (domain == "ai.onnx" && shape_op(n, ins)) {
      record(NodeReport::Fate::Folded, "a shape value with symbolic dims");
      return;
    }
    bool all_known = entry->second.foldable;
    for (auto* v : ins) all_known = all_known && (v == nullptr || v->value != nullptr);
    std::vector<std::optional<NodeId>> outs;
    try {
      if (all_known) {
        fold(n, domain, opset, ins, entry->second);
        record(NodeReport::Fate::Folded, "");
        return;
      }
      const std::size_t first = g_->size();
      std::vector<std::optional<NodeId>> ids;
      std::vector<std::shared_ptr<const ir::Tensor>> vals;
      std::vector<std::shared_ptr<const detail::SymInts>> syms;
      for (std::size_t i = 0; i < ins.size(); ++i) {
        ids.push_back(ins[i] ? std::optional<NodeId>(materialize(n.input(int(i)), *ins[i])) : std::nullopt);
        vals.push_back(ins[i] ? ins[i]->value : nullptr);
        syms.push_back(ins[i] ? ins[i]->sym : nullptr);
      }
      Ctx c(*g_, n, domain, opset, std::move(ids), std::move(vals), std::move(syms));
      outs = entry->second.convert(c);
      std::string made;
      std::set<std::string> kinds;
      for (std::size_t i = first; i < g_->size(); ++i) {
        const auto op = g_->nodes()[i].op;
        if (op != ir::OpKind::Constant) kinds.insert(std::string(ir::op_name(op)));
      }
      for (const auto& k : kinds) made += (made.empty() ? "" : ", ") + k;
      bool constant = !outs.empty();
      for (const auto& o : outs) constant = constant && o && g_->node(*o).op == ir::OpKind::Constant;
      if (constant)
        record(NodeReport::Fate::Folded, "");
      else
        record(NodeReport::Fate::Mapped, made.empty() ? "(an existing value)" : made);
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.rfind("onnx: node", 0) == 0) throw;
      throw Error(where() + ": " + what);
    }
    if (outs.size() > std::size_t(n.output_size())) outs.resize(std::size_t(n.output_size()));
    for (int i = 0; i < n.output_size(); ++i) {
      const auto& name = n.output(i);
      if (name.empty()) continue;
      if (std::size_t(i) >= outs.size() || !outs[std::size_t(i)])
        throw Error(fmt::format("{}: output {} ('{}') is not supported", where(), i, name));
      // A converter that computes its result at import (Shape of a static input) hands back a constant:
      // its value feeds later folding.
      const auto& made_node = g_->node(*outs[std::size_t(i)]);
      values_[name] = Value{outs[std::size_t(i)], made_node.op == ir::OpKind::Constant ? made_node.value : nullptr};
    }
  }

  // ---- shape values with symbolic dims (detail::SymInts) ----

  // A value as integers that may be symbolic: a shape value, or a small integer tensor of rank <= 1 known
  // at import; nullopt otherwise.
  static std::optional<detail::SymInts> sym_ints(const Value* v) {
    if (!v) return std::nullopt;
    if (v->sym) return *v->sym;
    const ir::Tensor* t = v->value.get();
    if (!t || t->shape().size() > 1 || t->numel() > 64 || !ir::is_integer(t->dtype())) return std::nullopt;
    detail::SymInts out{t->dtype(), t->shape().empty(), {}};
    for (std::int64_t i = 0; i < t->numel(); ++i) {
      if (t->dtype() == ir::DType::U64) {
        // A u64 past i64's range is no dim, index or shape: not a shape value (the op converts as usual).
        const std::uint64_t u = t->data_as<std::uint64_t>()[i];
        if (u > std::uint64_t(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
        out.elems.emplace_back(std::int64_t(u));
      } else {
        // Every other integer type's values are i64's (i64 read as is: a double would round it).
        out.elems.emplace_back(t->dtype() == ir::DType::I64 ? t->data_as<std::int64_t>()[i] : std::int64_t(t->get(i)));
      }
    }
    return out;
  }

  // Shape subgraph ops on shape values, evaluated on dim expressions at import: Shape and Size of a tensor
  // with symbolic dims, and Identity, Cast, Squeeze, Unsqueeze, Reshape, Gather, Concat, Slice and integer
  // Add/Sub/Mul/Div/Mod on shape values. A result whose elements are all integers becomes an ordinary
  // known value. Returns false when the node is none of these (or its operands are not shape values); it is
  // then converted as usual, with its shape-value inputs readable through Ctx::dim_ints.
  bool shape_op(const ::onnx::NodeProto& n, const std::vector<Value*>& ins) {
    const std::string& op = n.op_type();
    auto symbolic_node = [&](const Value* v) {
      return v && v->node && !v->value && !g_->node(*v->node).shape.is_static();
    };
    bool any_sym = false;
    for (auto* v : ins) any_sym = any_sym || (v && v->sym);
    if (!any_sym && !((op == "Shape" || op == "Size") && !ins.empty() && symbolic_node(ins[0]))) return false;
    if (n.output_size() != 1 || n.output(0).empty()) return false;
    Ctx c(*g_, n, "ai.onnx", opsets_.at("ai.onnx"), {}, {});
    auto attr_axes = [&](std::size_t input) -> std::optional<I64s> {
      if (c.has_attr("axes")) return c.attr_ints("axes");
      if (input < ins.size() && ins[input]) {
        auto a = sym_ints(ins[input]);
        if (!a) return std::nullopt;
        I64s out;
        for (const auto& e : a->elems) {
          if (!e.constant()) return std::nullopt;
          out.push_back(*e.constant());
        }
        return out;
      }
      return I64s{};
    };
    std::optional<detail::SymInts> r;
    if (op == "Shape") {
      const auto& dims = g_->node(*ins[0]->node).shape.dims();
      const auto rank = std::int64_t(dims.size());
      auto clampi = [rank](std::int64_t v) { return std::clamp(v < 0 ? v + rank : v, std::int64_t{0}, rank); };
      const std::int64_t b = clampi(c.attr_int("start", 0)), e = std::max(b, clampi(c.attr_int("end", rank)));
      r = detail::SymInts{ir::DType::I64, false, {}};
      for (std::int64_t i = b; i < e; ++i) r->elems.push_back(ir::DimExpr::of(dims[std::size_t(i)]));
    } else if (op == "Size") {
      r = detail::SymInts{ir::DType::I64, true, {ir::shape_numel(g_->node(*ins[0]->node).shape)}};
    } else {
      std::vector<std::optional<detail::SymInts>> a;
      for (auto* v : ins) a.push_back(sym_ints(v));
      auto all = [&](std::size_t from) {
        for (std::size_t i = from; i < a.size(); ++i)
          if (ins[i] && !a[i]) return false;
        return !a.empty() && a[0].has_value();
      };
      auto ints_of = [&](std::size_t i) -> std::optional<I64s> {
        if (i >= a.size() || !a[i]) return std::nullopt;
        I64s out;
        for (const auto& e : a[i]->elems) {
          if (!e.constant()) return std::nullopt;
          out.push_back(*e.constant());
        }
        return out;
      };
      if ((op == "Identity" || op == "Cast") && all(0)) {
        r = a[0];
        if (op == "Cast") {
          auto to = detail::dtype_of(c.attr_int("to"));
          if (!to || !ir::is_integer(*to)) return false;
          r->dtype = *to;
        }
      } else if (op == "Squeeze" && all(0) && !a[0]->scalar && a[0]->elems.size() == 1) {
        auto axes = attr_axes(1);
        if (!axes || axes->size() > 1 || (axes->size() == 1 && (*axes)[0] != 0 && (*axes)[0] != -1)) return false;
        r = a[0];
        r->scalar = true;
      } else if (op == "Unsqueeze" && all(0) && a[0]->scalar) {
        auto axes = attr_axes(1);
        if (!axes || axes->size() != 1 || ((*axes)[0] != 0 && (*axes)[0] != -1)) return false;
        r = a[0];
        r->scalar = false;
      } else if (op == "Reshape" && all(0) && a[0]->elems.size() == 1) {
        auto target = ints_of(1);
        if (!target || target->size() > 1 || (target->size() == 1 && (*target)[0] != 1 && (*target)[0] != -1))
          return false;
        r = a[0];
        r->scalar = target->empty();
      } else if (op == "Gather" && all(0) && !a[0]->scalar) {
        auto idx = ints_of(1);
        if (!idx || c.attr_int("axis", 0) != 0 || !a[1] || a[1]->elems.size() != idx->size()) return false;
        const auto len = std::int64_t(a[0]->elems.size());
        r = detail::SymInts{a[0]->dtype, a[1]->scalar, {}};
        for (auto i : *idx) {
          if (i < -len || i >= len) c.fail(fmt::format("index {} is out of range for a shape of {} dims", i, len));
          r->elems.push_back(a[0]->elems[std::size_t(i < 0 ? i + len : i)]);
        }
      } else if (op == "Concat" && all(0)) {
        r = detail::SymInts{a[0]->dtype, false, {}};
        for (std::size_t i = 0; i < a.size(); ++i) {
          if (!a[i]) continue;
          if (a[i]->scalar) return false;
          r->elems.insert(r->elems.end(), a[i]->elems.begin(), a[i]->elems.end());
        }
      } else if (op == "Slice" && c.opset() >= 10 && all(0) && !a[0]->scalar) {
        auto st = ints_of(1), en = ints_of(2);
        auto axes = ins.size() > 3 && ins[3] ? ints_of(3) : std::optional<I64s>(I64s{0});
        auto steps = ins.size() > 4 && ins[4] ? ints_of(4) : std::optional<I64s>(I64s{1});
        if (!st || !en || !axes || !steps || st->size() != 1 || en->size() != 1 || axes->size() != 1 ||
            steps->size() != 1 || ((*axes)[0] != 0 && (*axes)[0] != -1) || (*steps)[0] == 0)
          return false;
        const auto d = std::int64_t(a[0]->elems.size()), step = (*steps)[0];
        // ONNX's clamping: into [0, d] forward, [-1, d-1] backward.
        auto norm = [&](std::int64_t v, bool fwd) {
          if (v < 0) v = v < -d ? (fwd ? 0 : -1) : v + d;
          return fwd ? std::clamp(v, std::int64_t{0}, d) : std::clamp(v, std::int64_t{-1}, d - 1);
        };
        const bool fwd = step > 0;
        r = detail::SymInts{a[0]->dtype, false, {}};
        for (std::int64_t i = norm((*st)[0], fwd), e = norm((*en)[0], fwd); fwd ? i < e : i > e; i += step)
          r->elems.push_back(a[0]->elems[std::size_t(i)]);
      } else if ((op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Mod") && all(0) && a.size() == 2) {
        const auto &x = *a[0], &y = *a[1];
        const std::size_t len = std::max(x.elems.size(), y.elems.size());
        if ((x.elems.size() != len && x.elems.size() != 1) || (y.elems.size() != len && y.elems.size() != 1))
          return false;
        r = detail::SymInts{x.dtype, x.scalar && y.scalar, {}};
        for (std::size_t i = 0; i < len; ++i) {
          const auto& p = x.elems[x.elems.size() == 1 ? 0 : i];
          const auto& q = y.elems[y.elems.size() == 1 ? 0 : i];
          if (op == "Add") {
            r->elems.push_back(p + q);
          } else if (op == "Sub") {
            r->elems.push_back(p - q);
          } else if (op == "Mul") {
            r->elems.push_back(p * q);
          } else {
            // Two integers divide as ONNX does: Div truncates, Mod takes the divisor's sign (fmod=1: the
            // dividend's). A symbolic dividend is a dim, non-negative, so truncation is floor division there
            // and both Mods agree; a symbolic divisor divides only when it does so exactly (B*S / S).
            const auto pk = p.constant(), qk = q.constant();
            if (pk && qk) {
              if (*qk == 0) c.fail("division by zero in a shape value");
              if (op == "Div" || c.attr_int("fmod", 0) != 0) {
                if (*pk == std::numeric_limits<std::int64_t>::min() && *qk == -1) return false;
                r->elems.emplace_back(op == "Div" ? *pk / *qk : *pk % *qk);
              } else {
                const std::int64_t m = *pk % *qk;
                r->elems.emplace_back(m != 0 && ((m < 0) != (*qk < 0)) ? m + *qk : m);
              }
            } else {
              std::optional<ir::DimExpr> v;
              if (qk && *qk > 0)
                v = op == "Div" ? p.floordiv(*qk) : p.mod(*qk);
              else if (op == "Div")
                v = p.exact_div(q);
              if (!v) return false;
              r->elems.push_back(*v);
            }
          }
        }
      } else {
        return false;
      }
    }
    bool known = true;
    for (const auto& e : r->elems) known = known && e.constant().has_value();
    Value out;
    if (known) {
      ir::Tensor t(r->dtype, r->scalar ? std::vector<std::int64_t>{} : I64s{std::int64_t(r->elems.size())});
      for (std::size_t i = 0; i < r->elems.size(); ++i) t.set(std::int64_t(i), double(*r->elems[i].constant()));
      out.value = std::make_shared<const ir::Tensor>(std::move(t));
    } else {
      out.sym = std::make_shared<const detail::SymInts>(std::move(*r));
    }
    values_[n.output(0)] = std::move(out);
    return true;
  }

  // Builds the node into a scratch graph of constants and evaluates it with the reference interpreter.
  void fold(const ::onnx::NodeProto& n, const std::string& domain, std::int64_t opset, const std::vector<Value*>& ins,
            const detail::OpEntry& entry) {
    ir::Graph scratch("fold");
    std::vector<std::optional<NodeId>> ids;
    std::vector<std::shared_ptr<const ir::Tensor>> vals;
    for (auto* v : ins) {
      ids.push_back(v ? std::optional<NodeId>(scratch.constant(*v->value)) : std::nullopt);
      vals.push_back(v ? v->value : nullptr);
    }
    Ctx c(scratch, n, domain, opset, std::move(ids), std::move(vals));
    auto outs = entry.convert(c);
    std::int64_t bytes = 0;
    for (const auto& node : scratch.nodes())
      bytes = ir::limits::checked_add(bytes, ir::limits::checked_mul(node.shape.numel(), 8, "a folded value"),
                                      "the folded values");
    ir::limits::check_allocation(bytes, "folding node '" + n.name() + "'");
    std::vector<std::pair<int, NodeId>> wanted;
    for (int i = 0; i < n.output_size(); ++i) {
      if (n.output(i).empty()) continue;
      if (std::size_t(i) >= outs.size() || !outs[std::size_t(i)])
        c.fail(fmt::format("output {} ('{}') is not supported", i, n.output(i)));
      wanted.emplace_back(i, *outs[std::size_t(i)]);
    }
    std::vector<NodeId> out_ids;
    for (const auto& w : wanted) out_ids.push_back(w.second);
    scratch.set_outputs(out_ids);
    auto results = reference::run(scratch, {}, {});
    for (std::size_t k = 0; k < wanted.size(); ++k)
      values_[n.output(wanted[k].first)] =
          Value{std::nullopt, std::make_shared<const ir::Tensor>(std::move(results[k]))};
  }

  // The graph without the nodes no output reads (values materialized for a node that then folded, the
  // Shape of an input). Inputs stay, even unread ones: they are the model's signature.
  static ir::Graph prune(const ir::Graph& g) {
    std::vector<bool> live(g.size(), false);
    for (const auto& o : g.outputs()) live[o.node] = true;
    for (std::size_t i = g.size(); i-- > 0;) {
      const auto& n = g.nodes()[i];
      if (n.op == ir::OpKind::Input) live[i] = true;
      if (live[i])
        for (auto in : n.inputs) live[in] = true;
    }
    ir::Graph out(g.name());
    std::vector<NodeId> remap(g.size(), 0);
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (!live[i]) continue;
      ir::Node n = g.nodes()[i];
      for (auto& in : n.inputs) in = remap[in];
      remap[i] = out.add_raw(std::move(n));
    }
    for (const auto& o : g.outputs()) out.add_output(remap[o.node], o.name);
    return out;
  }

  const ::onnx::ModelProto& model_;
  ImportOptions opts_;
  bool report_mode_;
  ir::Graph* g_ = nullptr;
  std::map<std::string, std::int64_t, std::less<>> opsets_;
  std::unordered_map<std::string, Value> values_;
  int body_depth_ = 0;  // > 0 while a subgraph is imported into a body (BodyScope)
  std::vector<std::pair<std::string, ir::Tensor>> params_;
  std::vector<NodeReport> report_;
};

::onnx::ModelProto parse_model(std::span<const std::byte> bytes) {
  if (bytes.size() > std::size_t(std::numeric_limits<int>::max()))
    throw Error(fmt::format("onnx: the model is {} bytes; protobuf reads at most 2 GiB (keep weights in external data)",
                            bytes.size()));
  ::onnx::ModelProto m;
  if (!m.ParseFromArray(bytes.data(), int(bytes.size())))
    throw Error(fmt::format("onnx: the {} bytes are not a ModelProto (truncated or malformed protobuf)", bytes.size()));
  if (!m.has_graph()) throw Error("onnx: the model has no graph");
  return m;
}

std::vector<std::byte> read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(fmt::format("onnx: cannot open '{}'", path.string()));
  std::vector<char> buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(buf.size());
  std::transform(buf.begin(), buf.end(), out.begin(), [](char ch) { return std::byte(ch); });
  return out;
}

ImportOptions with_base(ImportOptions o, const std::filesystem::path& path) {
  if (o.base_dir.empty()) o.base_dir = path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
  return o;
}

}  // namespace

Model import_bytes(std::span<const std::byte> bytes, ImportOptions options) {
  const auto proto = parse_model(bytes);
  return Importer(proto, std::move(options), false).run();
}

Model import(const std::filesystem::path& path, ImportOptions options) {
  return import_bytes(read_file(path), with_base(std::move(options), path));
}

std::vector<NodeReport> import_report(const std::filesystem::path& path, ImportOptions options) {
  const auto proto = parse_model(read_file(path));
  return Importer(proto, with_base(std::move(options), path), true).run().report;
}

std::string report_text(const std::vector<NodeReport>& report) {
  std::map<std::string, std::array<int, 3>> per_op;
  std::string out;
  for (const auto& r : report) per_op[r.op_type][std::size_t(r.fate)]++;
  out += fmt::format("{:<28} {:>7} {:>7} {:>12}\n", "op", "mapped", "folded", "unsupported");
  std::array<int, 3> total{};
  for (const auto& [op, n] : per_op) {
    out += fmt::format("{:<28} {:>7} {:>7} {:>12}\n", op, n[0], n[1], n[2]);
    for (std::size_t i = 0; i < 3; ++i) total[i] += n[i];
  }
  out += fmt::format("{:<28} {:>7} {:>7} {:>12}\n", "total", total[0], total[1], total[2]);
  bool header = false;
  for (const auto& r : report) {
    if (r.fate != NodeReport::Fate::Unsupported || r.detail.rfind("reads the result", 0) == 0) continue;
    if (!header) out += "\nunsupported:\n";
    header = true;
    out += "  " + r.detail + "\n";
  }
  return out;
}

std::pair<std::string, ir::Tensor> read_tensor_proto(std::span<const std::byte> bytes) {
  if (bytes.size() > std::size_t(std::numeric_limits<int>::max())) throw Error("onnx: a TensorProto over 2 GiB");
  ::onnx::TensorProto t;
  if (!t.ParseFromArray(bytes.data(), int(bytes.size())))
    throw Error("onnx: the bytes are not a TensorProto (truncated or malformed protobuf)");
  return {t.name(), detail::tensor_from_proto(t, "", "tensor '" + t.name() + "'")};
}

std::vector<std::string> supported_ops() {
  std::vector<std::string> out;
  for (const auto& [name, e] : detail::op_table()) out.push_back(name);
  return out;
}

}  // namespace rlx::onnx
