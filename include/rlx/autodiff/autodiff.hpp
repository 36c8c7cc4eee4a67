#pragma once
// Automatic differentiation as graph transforms. Each function takes a graph
// and returns a new one with the same inputs and params (jvp adds tangent
// inputs), so a derivative compiles, fuses and plans like any other graph;
// differentiating a result again gives higher derivatives. docs/autodiff.md
// lists the rules and what is not covered yet.
#include <cstdint>
#include <initializer_list>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "rlx/ir/graph.hpp"

namespace rlx::autodiff {

// Gradient checkpointing (reverse mode): the forward pass is cut into
// segments, in node order; only values that cross from one segment into a
// later one are kept for the backward pass, and each segment's other values
// are recomputed right before its backward part runs. Less memory (the
// arena's peak), one more forward pass of compute.
struct Checkpoint {
  // A segment ends after every `every` ops (nodes that are not leaves); 0: never.
  std::int64_t every = 0;
  // A segment also ends at each of these nodes of the source graph.
  std::set<ir::NodeId> boundaries;
  bool enabled() const { return every > 0 || !boundaries.empty(); }
};

struct Options {
  // Nodes of the source graph whose value is taken as a constant: no
  // cotangent flows back through them and their tangent is zero (JAX's
  // stop_gradient, torch's detach). This is also how a path through a
  // non-differentiable op (argmax, a comparison, a cast to an integer) is
  // accepted when its zero derivative is what is meant.
  std::set<ir::NodeId> stop_gradient;
  // Recompute instead of store (vjp, grad, value_and_grad; jvp keeps nothing
  // for later and ignores it). Off by default.
  Checkpoint checkpoint;
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

// ---- vmap ---------------------------------------------------------------------

struct VmapOptions {
  // Inputs and params that carry the batch axis, by name. Empty: every input
  // (params are then shared by all examples).
  std::vector<std::string> batched;
  // The batch extent: static, or a symbol bound at compile time
  // (CompileOptions::bind). A few rules (conv, pooling and attention merged
  // into one call, index_select with batched table and indices) need it static.
  ir::Dim size = ir::Dim::symbol("batch");
  std::int64_t in_axis = 0;   // where the batched inputs carry the batch axis
  std::int64_t out_axis = 0;  // where every output carries it
};

// The graph mapped over a batch: each batched input gets a batch axis of
// `size` at in_axis, and every output gets one at out_axis (an output that
// depends on no batched input is broadcast). Example i of the outputs is g
// applied to example i of the batched inputs and to the shared ones. Inputs
// and params keep their names and order. An op without a batching rule (and
// without a decomposition or lowering to batch through) throws rlx::Error
// naming it; custom ops use OpExtension::vmap when they give one.
ir::Graph vmap(const ir::Graph& g, const VmapOptions& options = {});

// ---- backward ops ---------------------------------------------------------------

// The composites the VJP rules emit for the backward pass of softmax,
// log_softmax, layer_norm and rms_norm (HIR ops like the others: a backend
// runs them natively or the pipeline decomposes them).
const std::set<ir::OpKind>& backward_ops();
// Decomposes the backward ops not in `supported` into primitives, leaving
// everything else as it is: for a backend (or a graph-level consumer) that
// lacks some of them.
ir::Graph decompose_backward_ops_except(const ir::Graph& g, const std::set<ir::OpKind>& supported);

}  // namespace rlx::autodiff
