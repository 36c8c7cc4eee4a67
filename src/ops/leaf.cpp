// Leaves: the node's own dtype and shape are declared.
#include "ops/family.hpp"

RLX_OP_FAMILY(leaf) {
  using namespace rlx::ops;
  using rlx::ir::define_op;
  define_op({.kind = OpKind::Input, .doc = "a run-time input, fed by name", .attrs = {{"name", T::String, true}}});
  define_op({.kind = OpKind::Param, .doc = "a parameter held by the session", .attrs = {{"name", T::String, true}}});
  define_op({.kind = OpKind::Constant, .doc = "a tensor held in the node"});
  define_op({.kind = OpKind::Iota, .doc = "the index along `axis`", .attrs = {{"axis", T::Int, true}}});
  define_op({.kind = OpKind::RandomUniform,
             .doc = "counter-based uniform samples in [low, high)",
             .attrs = {{"seed", T::Int, true}, {"low", T::Float, true}, {"high", T::Float, true}}});
  define_op({.kind = OpKind::RandomNormal,
             .doc = "counter-based normal samples",
             .attrs = {{"seed", T::Int, true}, {"mean", T::Float, true}, {"std", T::Float, true}}});
}
