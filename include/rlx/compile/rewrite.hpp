#pragma once
// The one mechanism every pass uses to build its output graph: walk the
// source in order, copy or replace each node, remap ids, keep outputs.
#include <functional>
#include <optional>
#include <vector>

#include "rlx/ir/graph.hpp"

namespace rlx::compile {

class Rewriter {
 public:
  explicit Rewriter(const ir::Graph& src);
  const ir::Graph& src() const { return src_; }
  ir::Graph& out() { return out_; }
  // The new id of a source node (must already be emitted).
  ir::NodeId map(ir::NodeId old) const;
  void set_map(ir::NodeId old, ir::NodeId neu) { map_[old] = neu; }
  std::vector<ir::NodeId> mapped_inputs(const ir::Node& n) const;
  // Copies `n` with remapped inputs, keeping its attrs, dtype, shape and value.
  ir::NodeId copy(const ir::Node& n);
  // Copies the source outputs (mapped, names kept) and returns the graph.
  ir::Graph finish();

 private:
  const ir::Graph& src_;
  ir::Graph out_;
  std::vector<ir::NodeId> map_;
};

// Rebuilds `g` node by node: `f` may emit replacement nodes into r.out() and
// return the id standing for the source node, or nullopt to copy it as is.
using RewriteFn = std::function<std::optional<ir::NodeId>(Rewriter& r, const ir::Node& n)>;
ir::Graph rewrite(const ir::Graph& g, const RewriteFn& f);

}  // namespace rlx::compile
