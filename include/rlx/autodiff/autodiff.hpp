#pragma once
// Automatic differentiation as graph transforms. Each function takes a graph
// and returns a new one with the same inputs and params (jvp adds tangent
// inputs), so a derivative compiles, fuses and plans like any other graph;
// differentiating a result again gives higher derivatives. docs/autodiff.md
// lists the rules and what is not covered yet.
#include <initializer_list>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "rlx/ir/graph.hpp"

namespace rlx::autodiff {

struct Options {
  // Nodes of the source graph whose value is taken as a constant: no
  // cotangent flows back through them and their tangent is zero (JAX's
  // stop_gradient, torch's detach). This is also how a path through a
  // non-differentiable op (argmax, a comparison, a cast to an integer) is
  // accepted when its zero derivative is what is meant.
  std::set<ir::NodeId> stop_gradient;
};

// Reverse mode. The graph's FIRST output must be a float scalar (rank 0)
// loss; other outputs are ignored. The result's outputs are d loss / d w for
// each name w in `wrt` (an input or a float param), in order, named
// "grad_<w>". A name that is not in the graph, a non-float w, a non-scalar
// loss, and a non-differentiable op on a path from a w to the loss throw
// rlx::Error naming what is wrong.
ir::Graph vjp(const ir::Graph& g, std::span<const std::string> wrt, const Options& options = {});
// Same as vjp.
ir::Graph grad(const ir::Graph& g, std::span<const std::string> wrt, const Options& options = {});
// The loss (first output, name kept) followed by the gradients.
ir::Graph value_and_grad(const ir::Graph& g, std::span<const std::string> wrt, const Options& options = {});

// Forward mode. Adds an input "tangent_<w>" of w's dtype and shape for each
// name in `wrt`; the outputs are the primal outputs followed by their
// tangents (named "tangent_<output name or index>"). Tangents of non-float
// outputs are zeros.
ir::Graph jvp(const ir::Graph& g, std::span<const std::string> wrt, const Options& options = {});

// Braced-list spellings: grad(g, {"x", "w"}).
inline ir::Graph vjp(const ir::Graph& g, std::initializer_list<std::string> wrt, const Options& options = {}) {
  return vjp(g, std::span<const std::string>(wrt.begin(), wrt.size()), options);
}
inline ir::Graph grad(const ir::Graph& g, std::initializer_list<std::string> wrt, const Options& options = {}) {
  return grad(g, std::span<const std::string>(wrt.begin(), wrt.size()), options);
}
inline ir::Graph value_and_grad(const ir::Graph& g, std::initializer_list<std::string> wrt,
                                const Options& options = {}) {
  return value_and_grad(g, std::span<const std::string>(wrt.begin(), wrt.size()), options);
}
inline ir::Graph jvp(const ir::Graph& g, std::initializer_list<std::string> wrt, const Options& options = {}) {
  return jvp(g, std::span<const std::string>(wrt.begin(), wrt.size()), options);
}

}  // namespace rlx::autodiff
