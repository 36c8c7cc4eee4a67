// Gradient checkpointing: the reverse sweep, one forward segment at a time,
// last segment first. Before a segment's backward part, its nodes are copied
// (recomputed) on top of the values kept from earlier segments, and its rules
// read the copies; so a forward value inside a segment dies with the forward
// pass, and the copies live only while that segment's backward part runs.
// The copies are tagged so that cse does not merge them back into the forward
// nodes (src/compile/opt_simplify.cpp), and they come after the backward
// part of the later segments in node order, which the kernel order follows.
#include <algorithm>
#include <numeric>

#include "autodiff/engine.hpp"

namespace rlx::autodiff::detail {

using ir::Graph;
using ir::Node;

void checkpointed_reverse(Graph& g, const Graph& src, const Analysis& a, std::vector<Maybe>& ct, const Checkpoint& cp,
                          NodeId loss) {
  // Segment starts, in node order: a segment ends after every `every` ops and at each boundary.
  std::vector<std::size_t> starts{0};
  std::int64_t ops = 0;
  for (const Node& n : src.nodes()) {
    if (n.id > loss) break;
    bool op = !n.inputs.empty();
    ops += op;
    if ((cp.every > 0 && op && ops % cp.every == 0) || cp.boundaries.contains(n.id)) starts.push_back(n.id + 1);
  }
  if (starts.back() > loss) starts.pop_back();  // the loss's segment runs last anyway: it is not recomputed
  // The values the loss needs, selectors (where's condition, indices) included: the rules read them.
  std::vector<bool> live(src.size(), false);
  live[loss] = true;
  for (std::size_t i = loss + 1; i-- > 0;)
    if (live[i])
      for (auto in : src.nodes()[i].inputs) live[in] = true;

  std::vector<NodeId> map(src.size());
  for (std::size_t k = starts.size(); k-- > 0;) {
    const std::size_t begin = starts[k], end = k + 1 < starts.size() ? starts[k + 1] : src.size();
    std::iota(map.begin(), map.end(), NodeId{0});
    if (k + 1 < starts.size())
      for (std::size_t i = begin; i < end; ++i) {
        const Node& n = src.nodes()[i];
        if (n.inputs.empty() || !live[i]) continue;
        Node c = n;
        for (auto& in : c.inputs) in = map[in];
        c.origin = "recompute";
        map[i] = g.add_raw(std::move(c));
      }
    reverse(g, src, map, a, ct, begin, end);
  }
}

}  // namespace rlx::autodiff::detail
