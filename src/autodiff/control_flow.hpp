#pragma once
// Derivative rules of scan, if and while (control_flow.cpp): the derivative
// of a control-flow op is another control-flow op whose bodies are the
// derivatives of its bodies.
#include <span>
#include <vector>

#include "autodiff/engine.hpp"

namespace rlx::autodiff::detail {

std::vector<Maybe> control_flow_vjp(const Site& s, NodeId ct, const std::vector<bool>& want);
Maybe control_flow_jvp(const Site& s, std::span<const Maybe> t);

}  // namespace rlx::autodiff::detail
