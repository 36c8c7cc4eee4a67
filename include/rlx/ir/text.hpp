#pragma once
// The textual form of a Graph: compact, line-oriented and round-trippable
// (to_text(parse_text(s)) == s for any s that to_text printed). Test fixtures
// and RLX_DUMP use it.
//
//   graph mlp {
//     %0 = input "x" : f32[64,1024]
//     %1 = param "w1" : f32[1024,1024]
//     %2 = matmul %0, %1 : f32[64,1024]
//     %3 = reduce_sum %2 {axes=[1], keepdims=true} : f32[64,1]
//     %4 = constant {value=[1.5, 2, 3]} : f32[3]
//     %5 = cast %3 {to=f16} : f16[64,1]
//     %6 = reshape %5 : f16[B,64]
//     output %3 "logits", %6
//   }
//
// Node labels (%name) are local to the text: the parser numbers nodes densely
// in order of appearance. Symbolic dims are identifiers (or quoted strings
// when not identifier-like). Float attributes always carry a '.' or an
// exponent; the op's attribute schema resolves the remaining ambiguity (a
// Float attribute may be written as 1). `//` starts a comment.
#include <string>
#include <string_view>

#include "rlx/ir/graph.hpp"

namespace rlx::ir {

std::string to_text(const Graph& g);
// One attribute value as the text form writes it (a body as "@body").
std::string attr_value_str(const AttrValue& value);

// Parses and verifies a graph. Every malformed input, including a shape error
// the verifier finds, throws rlx::Error "line L, col C: <what>".
Graph parse_text(std::string_view text);

// Graphviz DOT, one box per node labelled "%id op\ndtype[shape]" plus one
// ellipse per graph output.
std::string to_dot(const Graph& g);

// Renders to_dot(g) with `dot -Tsvg` into `path`; throws rlx::Error when
// graphviz is missing or fails (with its stderr).
void write_svg(const Graph& g, const std::string& path);

}  // namespace rlx::ir
