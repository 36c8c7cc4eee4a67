// The ONNX importer: parses a ModelProto (the official onnx.proto through protobuf-lite), orders the
// nodes, binds the inputs' dims, and converts node by node through the op table (ops_*.cpp). A node
// whose inputs are all known at import is built into a scratch graph and evaluated there by the
// reference interpreter, so shape subgraphs fold with the same converters that map the rest.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>

#include "onnx/detail.hpp"
#include "onnx/proto/onnx.pb.h"
#include "rlx/error.hpp"
#include "rlx/ir/limits.hpp"
#include "rlx/onnx/onnx.hpp"
#include "rlx/reference/interpreter.hpp"

namespace rlx::onnx {

namespace {

using detail::Ctx;
using ir::NodeId;

std::string domain_name(const std::string& d) { return d.empty() ? "ai.onnx" : d; }

// A value by its ONNX name: a graph node, a value known at import, or both.
struct Value {
  std::optional<NodeId> node;
  std::shared_ptr<const ir::Tensor> value;
  bool poisoned = false;  // produced by an unsupported node (report mode)
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
    std::vector<std::int64_t> ext;
    for (int i = 0; i < tt.shape().dim_size(); ++i) {
      const auto& d = tt.shape().dim(i);
      if (d.has_dim_value()) {
        if (d.dim_value() < 0)
          throw Error(fmt::format("onnx: input '{}' dim {} is negative ({})", vi.name(), i, d.dim_value()));
        ext.push_back(d.dim_value());
      } else if (d.has_dim_param()) {
        auto b = opts_.dims.find(d.dim_param());
        if (b == opts_.dims.end())
          throw Error(
              fmt::format("onnx: input '{}' dim {} is the symbolic dim '{}': bind it (ImportOptions::dims, "
                          "`--dim {}=N`)",
                          vi.name(), i, d.dim_param(), d.dim_param()));
        ext.push_back(b->second);
      } else {
        throw Error(
            fmt::format("onnx: input '{}' dim {} has no extent or name: pass the input's shape "
                        "(ImportOptions::input_shapes)",
                        vi.name(), i));
      }
    }
    return ir::Shape(ext);
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
  // when the trip count or the first condition is not known.
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
    std::vector<Value> state;
    for (std::size_t j = 2; j < ins.size(); ++j) {
      if (!ins[j]) throw Error(where + ": a loop-carried input is missing");
      state.push_back(*ins[j]);
    }
    std::vector<std::vector<Value>> scanned(static_cast<std::size_t>(scans));
    std::vector<std::string> local;
    defined_names(*body, local);
    std::int64_t it = 0;
    for (; it < trips && cond; ++it) {
      if (it >= 4096) throw Error(where + ": loops over 4096 iterations are not unrolled");
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
      if (!c.value) throw Error(where + ": the loop's condition must be known at import (the loop is unrolled)");
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

  // A value known at import enters the graph once, as a constant or a param (the promote rule).
  NodeId materialize(const std::string& name, Value& v) {
    if (v.node) return *v.node;
    const ir::Tensor& t = *v.value;
    if (t.numel() <= opts_.max_constant_elements) {
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
    if (domain == "ai.onnx" && n.op_type() == "If" && inline_if(n, ins, m, where())) return;
    if (domain == "ai.onnx" && n.op_type() == "Loop" && unroll_loop(n, ins, m, where())) return;
    if (entry == table.end()) {
      const std::string msg = where() + ": unsupported op" +
                              (domain == "ai.onnx" ? std::string(" (docs/onnx-coverage.md lists the supported ones)")
                                                   : std::string(" (only the default domain ai.onnx is supported)"));
      if (!report_mode_) throw Error(msg);
      record(NodeReport::Fate::Unsupported, msg);
      return poison();
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
      for (std::size_t i = 0; i < ins.size(); ++i) {
        ids.push_back(ins[i] ? std::optional<NodeId>(materialize(n.input(int(i)), *ins[i])) : std::nullopt);
        vals.push_back(ins[i] ? ins[i]->value : nullptr);
      }
      Ctx c(*g_, n, domain, opset, std::move(ids), std::move(vals));
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
