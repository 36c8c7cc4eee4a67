// Control flow: bodies are subgraphs held as attributes, one sibling node per
// result, picked by `result` (rlx/ir/control_flow.hpp).
#include "ops/family.hpp"

RLX_OP_FAMILY(control) {
  using namespace rlx::ops;
  using rlx::ir::define_op;
  define_op({.kind = OpKind::Scan,
             .doc = "jax.lax.scan over (carries, xs, consts)",
             .operands = {"carries...", "xs...", "consts..."},
             .attrs = {{"body", T::Graph, true},
                       {"length", T::Int, true},
                       {"num_carries", T::Int, true},
                       {"num_consts", T::Int, false},
                       {"reverse", T::Bool, false},
                       {"result", T::Int, true}}});
  define_op({.kind = OpKind::If,
             .doc = "then(operands) if cond else else(operands)",
             .operands = {"cond", "operands..."},
             .attrs = {{"then", T::Graph, true}, {"else", T::Graph, true}, {"result", T::Int, true}}});
  define_op({.kind = OpKind::While,
             .doc = "carries = body(carries, consts) while cond(carries, consts)",
             .operands = {"carries...", "consts..."},
             .attrs = {{"cond", T::Graph, true},
                       {"body", T::Graph, true},
                       {"num_carries", T::Int, true},
                       {"max_trip_count", T::Int, false},
                       {"result", T::Int, true}}});
}
