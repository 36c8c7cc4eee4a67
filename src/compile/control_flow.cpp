// lower_control_flow: scans short enough (CompileOptions' unroll rules) become
// their body's ops, one copy per step, so they fuse and run on any backend;
// an if whose condition is a constant becomes the chosen body. Everything
// else stays a control-flow node, which lower_to_lir turns into one
// ControlFlow kernel: the backend's host loop.
#include "rlx/ir/control_flow.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "rlx/compile/pipeline.hpp"
#include "rlx/compile/rewrite.hpp"
#include "rlx/error.hpp"

namespace rlx::compile::passes {

// The most nodes one unrolled scan may add, whatever the length rule says.
constexpr std::size_t kMaxUnrolledNodes = std::size_t(1) << 16;

namespace {

using ir::Graph;
using ir::Node;
using ir::NodeId;

// Concat takes at most 64 operands: longer lists are joined in a tree.
NodeId concat_all(Graph& g, std::vector<NodeId> parts) {
  constexpr std::size_t kMax = 64;
  while (parts.size() > kMax) {
    std::vector<NodeId> joined;
    for (std::size_t i = 0; i < parts.size(); i += kMax)
      joined.push_back(g.concat(
          {parts.begin() + std::ptrdiff_t(i), parts.begin() + std::ptrdiff_t(std::min(parts.size(), i + kMax))}, 0));
    parts = std::move(joined);
  }
  return parts.size() == 1 ? parts[0] : g.concat(std::move(parts), 0);
}

// The steps' y values stacked along a new axis 0 (`y` is one step's type).
NodeId stack(Graph& g, const std::vector<NodeId>& steps, const Node& y) {
  std::vector<ir::Dim> dims{ir::Dim(std::int64_t(steps.size()))};
  dims.insert(dims.end(), y.shape.dims().begin(), y.shape.dims().end());
  if (steps.empty()) return g.expand(g.scalar(0.0, y.dtype), ir::Shape(std::move(dims)));
  dims[0] = ir::Dim(1);
  std::vector<NodeId> rows;
  for (NodeId s : steps) rows.push_back(g.reshape(s, ir::Shape(dims)));
  return concat_all(g, std::move(rows));
}

class Lowerer {
 public:
  Lowerer(const CompileOptions& o, const BackendTraits& bt, DispatchReport* report)
      : opt_(o), bt_(bt), report_(report) {}

  Graph run(const Graph& g) {
    // The results of one op, emitted once for all its sibling nodes; each
    // sibling gets the op's dispatch entry.
    struct Done {
      const Node* first;
      std::vector<NodeId> results;
      DispatchEntry entry;
    };
    std::vector<Done> done;
    return rewrite(g, [&](Rewriter& r, const Node& n) -> std::optional<NodeId> {
      if (!ir::is_control_flow(n.op)) return std::nullopt;
      const auto r_index = std::size_t(n.attrs.get_int("result"));
      auto it = std::find_if(done.begin(), done.end(), [&](const Done& d) { return ir::are_siblings(*d.first, n); });
      if (it == done.end()) {
        auto results = lower(r, g, n);
        it = done.insert(done.end(), {&n, std::move(results), last_});
      } else if (report_) {
        report_->entries.push_back(it->entry);
        report_->entries.back().hir_node = n.id;
      }
      return it->results.empty() ? std::nullopt : std::optional(it->results[r_index]);
    });
  }

 private:
  // The op's results in r.out(), or none when it stays a control-flow node.
  std::vector<NodeId> lower(Rewriter& r, const Graph& g, const Node& n) {
    Graph& out = r.out();
    auto ins = r.mapped_inputs(n);
    const auto first = NodeId(out.size());
    std::vector<NodeId> results;
    if (n.op == ir::OpKind::Scan) {
      const Graph& body = lowered(n.attrs.get_graph("body"));
      const std::int64_t length = n.attrs.get_int("length");
      const auto steps = std::size_t(length) * body.size();
      // The length rule alone would let nested scans multiply (64 x 64 x ... body nodes): it holds only while
      // the unrolled loop stays under kMaxUnrolledNodes, past which a scan is always a host loop.
      const bool by_length =
          opt_.scan_unroll_max_length > 0 && length <= opt_.scan_unroll_max_length && steps <= kMaxUnrolledNodes;
      const bool by_budget = opt_.scan_unroll_budget > 0 && steps <= std::size_t(opt_.scan_unroll_budget);
      if (by_length || by_budget) {
        results = unroll_scan(out, n, body, ins);
        record(n, DispatchTier::Decomposed,
               fmt::format("unrolled (length {}, {} body nodes: {})", length, body.size(),
                           by_length
                               ? fmt::format("length <= scan_unroll_max_length {}", opt_.scan_unroll_max_length)
                               : fmt::format("length x body nodes <= scan_unroll_budget {}", opt_.scan_unroll_budget)));
      } else {
        host(n, fmt::format("host loop (length {}, {} body nodes; unrolling would exceed scan_unroll_max_length {} "
                            "and scan_unroll_budget {})",
                            length, body.size(), opt_.scan_unroll_max_length, opt_.scan_unroll_budget));
      }
    } else if (n.op == ir::OpKind::If && g.node(n.inputs[0]).op == ir::OpKind::Constant) {
      bool taken = g.node(n.inputs[0]).value->get(0) != 0;
      const Graph& body = lowered(n.attrs.get_graph(taken ? "then" : "else"));
      results = out.inline_graph(body, std::span(ins).subspan(1));
      record(n, DispatchTier::Decomposed, fmt::format("resolved: the condition is the constant {}", taken));
    } else {
      host(n, n.op == ir::OpKind::If ? "host branch: the condition is known only at run time"
                                     : "host loop: the trip count is known only at run time");
    }
    if (!results.empty()) out.tag_origin(first, fmt::format("{}:%{}", ir::op_name(n.op), n.id));
    return results;
  }

  std::vector<NodeId> unroll_scan(Graph& out, const Node& n, const Graph& body, const std::vector<NodeId>& ins) {
    const auto nc = std::size_t(n.attrs.get_int("num_carries"));
    const auto nk = std::size_t(n.attrs.int_or("num_consts", 0));
    const std::size_t nx = ins.size() - nc - nk, ny = body.outputs().size() - nc;
    const std::int64_t length = n.attrs.get_int("length");
    std::vector<NodeId> args(ins.begin(), ins.end());
    std::vector<std::vector<NodeId>> ys(ny, std::vector<NodeId>(std::size_t(length)));
    for (std::int64_t s = 0; s < length; ++s) {
      std::int64_t t = n.attrs.bool_or("reverse", false) ? length - 1 - s : s;
      for (std::size_t j = 0; j < nx; ++j) {
        // The step's shape is copied before narrow adds a node: a reference into `out` would dangle.
        const auto& xs = out.node(ins[nc + j]).shape.dims();
        ir::Shape step_shape(std::vector<ir::Dim>(xs.begin() + 1, xs.end()));
        args[nc + j] = out.reshape(out.narrow(ins[nc + j], 0, t, 1), std::move(step_shape));
      }
      auto step = out.inline_graph(body, args);
      std::copy_n(step.begin(), nc, args.begin());
      for (std::size_t j = 0; j < ny; ++j) ys[j][std::size_t(t)] = step[nc + j];
    }
    std::vector<NodeId> results(args.begin(), args.begin() + std::ptrdiff_t(nc));
    for (std::size_t j = 0; j < ny; ++j) results.push_back(stack(out, ys[j], body.node(body.outputs()[nc + j].node)));
    return results;
  }

  // Bodies get the same treatment, so nested short scans unroll too.
  const Graph& lowered(const ir::GraphRef& body) {
    auto it = bodies_.find(body.get());
    if (it == bodies_.end()) {
      Lowerer inner(opt_, bt_, nullptr);
      it = bodies_.emplace(body.get(), inner.run(*body)).first;
    }
    return it->second;
  }

  void host(const Node& n, std::string why) {
    record(n,
           bt_.native_ops.contains(n.op) ? DispatchTier::Native
           : bt_.host_fallback           ? DispatchTier::HostFallback
                                         : DispatchTier::Unsupported,
           std::move(why));
  }

  void record(const Node& n, DispatchTier tier, std::string why) {
    last_ = {n.id, n.op, tier, std::move(why)};
    if (report_) report_->entries.push_back(last_);
  }

  const CompileOptions& opt_;
  const BackendTraits& bt_;
  DispatchReport* report_;
  std::map<const Graph*, Graph> bodies_;
  DispatchEntry last_{};
};

}  // namespace

Graph lower_control_flow(const Graph& g, const CompileOptions& options, const BackendTraits& backend,
                         DispatchReport* report) {
  return Lowerer(options, backend, report).run(g);
}

}  // namespace rlx::compile::passes
