#pragma once
// Custom ops that tests register, one per execution route:
//  - "test_scaled_silu" (x * sigmoid(alpha * x)): a lowering, so it inlines and fuses;
//  - "test_host_cube" (x^3): a host kernel and a reference, no lowering.
#include <cmath>
#include <cstring>

#include "rlx/error.hpp"
#include "rlx/ir/custom_op.hpp"
#include "rlx/runtime/custom_kernels.hpp"

namespace rlx::testing {

class ScaledSilu final : public ir::OpExtension {
 public:
  std::string_view name() const override { return "test_scaled_silu"; }
  int num_inputs() const override { return 1; }
  std::vector<ir::AttrSpec> attr_schema() const override { return {{"alpha", ir::AttrType::Float, true}}; }
  ir::TypeInfo infer(std::span<const ir::TypeInfo> in, const ir::Attrs&) const override {
    if (!ir::is_float(in[0].dtype)) throw Error("test_scaled_silu needs a float input");
    return in[0];
  }
  std::optional<ir::NodeId> lower(ir::Graph& g, std::span<const ir::NodeId> in, const ir::Attrs& a) const override {
    auto alpha = g.scalar(a.get_float("alpha"), g.node(in[0]).dtype);
    return g.mul(in[0], g.unary(ir::OpKind::Sigmoid, g.mul(in[0], alpha)));
  }
};

class HostCube final : public ir::OpExtension {
 public:
  std::string_view name() const override { return "test_host_cube"; }
  int num_inputs() const override { return 1; }
  ir::TypeInfo infer(std::span<const ir::TypeInfo> in, const ir::Attrs&) const override {
    if (in[0].dtype != ir::DType::F32) throw Error("test_host_cube needs f32");
    return in[0];
  }
  std::optional<ir::Tensor> reference(std::span<const ir::Tensor> in, const ir::Attrs&,
                                      const ir::TypeInfo&) const override {
    ir::Tensor out = in[0];
    for (std::int64_t i = 0; i < out.numel(); ++i) out.set(i, std::pow(in[0].get(i), 3));
    return out;
  }
};

inline void register_test_ops() {
  static const bool done = [] {
    ir::register_op(std::make_shared<ScaledSilu>());
    ir::register_op(std::make_shared<HostCube>());
    runtime::register_host_kernel(
        "test_host_cube", [](std::span<const ir::TensorView> in, const ir::MutableTensorView& out, const ir::Attrs&) {
          const auto* x = static_cast<const float*>(in[0].data);
          auto* y = static_cast<float*>(out.data);
          for (std::size_t i = 0; i < in[0].nbytes / sizeof(float); ++i) y[i] = x[i] * x[i] * x[i];
        });
    return true;
  }();
  (void)done;
}

}  // namespace rlx::testing
