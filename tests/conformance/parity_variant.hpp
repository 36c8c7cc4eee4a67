// One op-parity variant: a labelled graph, the generators of its inputs and an optional tolerance, built
// through V (tests/conformance/test_op_parity.cpp and the variant families it includes).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "conformance/harness.hpp"

namespace rlx::conformance {

using ir::DType;
using ir::Graph;
using ir::NodeId;
using ir::Shape;
using testing::Tolerance;

inline std::string str(const Ints& s) { return Shape(s).str(); }
inline std::string dt(DType t) { return std::string(ir::dtype_name(t)); }

struct Variant {
  std::string label;
  Graph graph;
  Gens gens;
  std::optional<Tolerance> tol;
};

// One variant under construction.
struct V {
  Variant v;
  explicit V(std::string label) { v.label = std::move(label); }
  Graph& g() { return v.graph; }
  NodeId in(const std::string& name, DType t, const Ints& shape, Gen gen = {}) {
    if (gen) v.gens[name] = std::move(gen);
    return v.graph.input(name, Shape(shape), t);
  }
  V& tol(Tolerance t) {
    v.tol = t;
    return *this;
  }
  Variant out(std::vector<NodeId> outs) {
    for (auto o : outs) v.graph.add_output(o);
    return std::move(v);
  }
};

using Variants = std::vector<Variant>;

}  // namespace rlx::conformance
