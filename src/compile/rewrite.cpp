#include "rlx/compile/rewrite.hpp"

#include <cassert>
#include <limits>

namespace rlx::compile {

namespace {
constexpr ir::NodeId kUnmapped = std::numeric_limits<ir::NodeId>::max();
}

Rewriter::Rewriter(const ir::Graph& src) : src_(src), out_(src.name()), map_(src.size(), kUnmapped) {}

ir::NodeId Rewriter::map(ir::NodeId old) const {
  assert(old < map_.size() && map_[old] != kUnmapped && "node used before it was emitted");
  return map_[old];
}

std::vector<ir::NodeId> Rewriter::mapped_inputs(const ir::Node& n) const {
  std::vector<ir::NodeId> ins;
  ins.reserve(n.inputs.size());
  for (auto i : n.inputs) ins.push_back(map(i));
  return ins;
}

ir::NodeId Rewriter::copy(const ir::Node& n) {
  ir::Node c = n;
  c.inputs = mapped_inputs(n);
  auto id = out_.add_raw(std::move(c));
  map_[n.id] = id;
  return id;
}

ir::Graph Rewriter::finish() {
  out_.clear_outputs();
  for (const auto& o : src_.outputs()) out_.add_output(map(o.node), o.name);
  return std::move(out_);
}

ir::Graph rewrite(const ir::Graph& g, const RewriteFn& f) {
  Rewriter r(g);
  for (const auto& n : g.nodes()) {
    auto first = static_cast<ir::NodeId>(r.out().size());
    if (auto id = f(r, n)) {
      r.set_map(n.id, *id);
      // What a node becomes keeps its origin (autodiff's recompute marker, a custom op's name).
      if (!n.origin.empty()) r.out().tag_origin(first, n.origin);
    } else {
      r.copy(n);
    }
  }
  return r.finish();
}

}  // namespace rlx::compile
