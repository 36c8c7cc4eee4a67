#include "rlx/ir/derivative.hpp"

#include "rlx/error.hpp"

namespace rlx::ir {

void DerivativeArgs::fail(const std::string& why) const { throw Error(describe_node(src, n) + ": " + why); }

NodeId zeros(Graph& g, DType t, const Shape& s) {
  NodeId z = g.scalar(0.0, t);
  return s.rank() ? g.expand(z, s) : z;
}

NodeId unbroadcast(Graph& g, NodeId v, const Shape& to) {
  Shape from = g.node(v).shape;
  if (from == to) return v;
  std::size_t lead = from.rank() - to.rank();
  std::vector<std::int64_t> axes;
  for (std::size_t d = 0; d < from.rank(); ++d) {
    bool stretched =
        d >= lead && to[d - lead].is_static() && to[d - lead].size == 1 && !(from[d].is_static() && from[d].size == 1);
    if (d < lead || stretched) axes.push_back(std::int64_t(d));
  }
  if (!axes.empty()) v = g.sum(v, axes);
  return g.node(v).shape == to ? v : g.reshape(v, to);
}

NodeId fit(Graph& g, NodeId v, const Shape& to) { return g.node(v).shape == to ? v : g.expand(v, to); }

Tangent sum_terms(Graph& g, std::span<const NodeId> terms, const Shape& to) {
  if (terms.empty()) return std::nullopt;
  NodeId acc = terms[0];
  for (std::size_t i = 1; i < terms.size(); ++i) acc = g.add(acc, terms[i]);
  return fit(g, acc, to);
}

NodeId same_op(const DerivativeArgs& s, std::vector<NodeId> inputs) {
  return s.g.add_declared(s.n.op, std::move(inputs), s.n.attrs, s.n.dtype, s.n.shape);
}

}  // namespace rlx::ir
