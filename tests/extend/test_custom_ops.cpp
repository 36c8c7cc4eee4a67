// The custom-op seam: registration, errors, the three execution routes and
// what the reports say about them.
#include <gtest/gtest.h>

#include "rlx/error.hpp"
#include "rlx/ir/custom_op.hpp"
#include "rlx/ir/text.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/custom_kernels.hpp"
#include "rlx/runtime/session.hpp"
#include "support/test_ops.hpp"
#include "support/testing.hpp"

using namespace rlx;

namespace {
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

// An op with neither a lowering, a reference nor a kernel anywhere.
class Opaque final : public ir::OpExtension {
 public:
  std::string_view name() const override { return "test_opaque"; }
  int num_inputs() const override { return 2; }
  ir::TypeInfo infer(std::span<const ir::TypeInfo> in, const ir::Attrs&) const override { return in[0]; }
};

std::vector<runtime::NamedTensor> named(const reference::TensorMap& m) {
  std::vector<runtime::NamedTensor> out;
  for (const auto& [k, v] : m) out.push_back({k, ir::view(v)});
  return out;
}
}  // namespace

TEST(CustomOps, RegistrationErrors) {
  rlx::testing::register_test_ops();
  ir::Graph g;
  auto x = g.input("x", {3});
  auto msg = error_of([&] { g.custom_op("no_such_op", {}, {x}); });
  EXPECT_NE(msg.find("'no_such_op' is not registered"), std::string::npos) << msg;
  EXPECT_NE(msg.find("test_scaled_silu"), std::string::npos) << msg;  // lists what is registered
  std::string err;
  EXPECT_FALSE(g.try_custom_op("no_such_op", {}, {x}, &err));
  EXPECT_NE(err.find("no_such_op"), std::string::npos);
  EXPECT_TRUE(g.try_custom_op("test_scaled_silu", {{"alpha", 2.0}}, {x}, &err));
  msg = error_of([] { ir::register_op_strict(std::make_shared<rlx::testing::ScaledSilu>()); });
  EXPECT_NE(msg.find("already registered"), std::string::npos) << msg;
  msg = error_of([&] { g.custom_op("test_scaled_silu", {{"alpha", 2.0}}, {x, x}); });
  EXPECT_NE(msg.find("takes 1 inputs, got 2"), std::string::npos) << msg;
  msg = error_of([&] { g.custom_op("test_scaled_silu", {}, {x}); });
  EXPECT_NE(msg.find("missing attribute 'alpha'"), std::string::npos) << msg;
  EXPECT_TRUE(ir::is_op_registered("test_host_cube"));
  EXPECT_FALSE(ir::is_op_registered("no_such_op"));
}

TEST(CustomOps, LoweredOpFusesWithItsNeighbours) {
  rlx::testing::register_test_ops();
  ir::Graph g("fused_custom");
  auto x = g.input("x", {8, 16});
  auto y = g.mul(g.custom_op("test_scaled_silu", {{"alpha", 1.5}}, {g.add(x, g.scalar(1.0))}), x);
  g.add_output(g.relu(y));
  auto compiled = Session().compile(g);
  const auto& res = compiled.compile_result();
  ASSERT_EQ(res.lir.kernels.size(), 1u) << res.lir.to_text();  // add, the lowering, mul, relu: one kernel
  ASSERT_EQ(res.fusion.size(), 1u);
  EXPECT_EQ(res.fusion[0].origins, std::vector<std::string>{"custom:test_scaled_silu"});
  EXPECT_NE(res.lir.kernels[0].name.find("[custom:test_scaled_silu]"), std::string::npos) << res.lir.kernels[0].name;
  bool reported = false;
  for (const auto& e : res.dispatch.entries)
    reported |= e.op == ir::OpKind::Custom && e.tier == compile::DispatchTier::Decomposed;
  EXPECT_TRUE(reported) << res.dispatch.to_text();
  std::mt19937_64 rng(rlx::testing::test_seed());
  reference::TensorMap in{{"x", rlx::testing::random_tensor(ir::DType::F32, {8, 16}, rng)}};
  EXPECT_TRUE(rlx::testing::tensors_close(compiled.run(named(in))[0], reference::run(g, in)[0]));
}

TEST(CustomOps, HostKernelRunsNativelyOnCpu) {
  rlx::testing::register_test_ops();
  ir::Graph g("host_kernel");
  auto x = g.input("x", {5, 3});
  g.add_output(g.custom_op("test_host_cube", {}, {g.add(x, x)}));
  auto compiled = Session().compile(g);
  bool native = false;
  for (const auto& e : compiled.compile_result().dispatch.entries)
    native |= e.op == ir::OpKind::Custom && e.tier == compile::DispatchTier::Native;
  EXPECT_TRUE(native) << compiled.compile_result().dispatch.to_text();
  std::mt19937_64 rng(rlx::testing::test_seed());
  reference::TensorMap in{{"x", rlx::testing::random_tensor(ir::DType::F32, {5, 3}, rng)}};
  EXPECT_TRUE(rlx::testing::tensors_close(compiled.run(named(in))[0], reference::run(g, in)[0]));
}

TEST(CustomOps, NoRouteIsAClearError) {
  ir::register_op(std::make_shared<Opaque>());
  ir::Graph g("opaque");
  auto x = g.input("x", {2});
  g.add_output(g.custom_op("test_opaque", {}, {x, x}));
  auto msg = error_of([&] { Session().compile(g); });
  EXPECT_NE(msg.find("test_opaque"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no lowering"), std::string::npos) << msg;
  msg = error_of([&] { reference::run(g, {{"x", ir::Tensor(ir::DType::F32, {2})}}); });
  EXPECT_NE(msg.find("neither a lowering nor a reference"), std::string::npos) << msg;
}

TEST(CustomOps, TextRoundTripKeepsTypedAttributes) {
  rlx::testing::register_test_ops();
  ir::Graph g("text");
  g.add_output(g.custom_op("test_scaled_silu", {{"alpha", 2.0}}, {g.input("x", {4})}));
  auto text = ir::to_text(g);
  EXPECT_NE(text.find("alpha=2.0"), std::string::npos) << text;
  auto parsed = ir::parse_text(text);
  EXPECT_EQ(ir::to_text(parsed), text);
  EXPECT_EQ(parsed.node(1).attrs.get_float("alpha"), 2.0);
  auto msg = error_of([&] {
    ir::parse_text(
        "graph g {\n  %0 = input \"x\" : f32[4]\n  %1 = custom %0 {op=\"test_scaled_silu\", beta=1.0} : f32[4]\n}");
  });
  EXPECT_NE(msg.find("unknown attribute 'beta'"), std::string::npos) << msg;
  msg = error_of(
      [&] { ir::parse_text("graph g {\n  %0 = input \"x\" : f32[4]\n  %1 = custom %0 {op=\"nope\"} : f32[4]\n}"); });
  EXPECT_NE(msg.find("line 3"), std::string::npos) << msg;
}

TEST(CustomOps, RoutePrecedence) {
  rlx::testing::register_test_ops();
  using runtime::CustomRoute;
  EXPECT_EQ(runtime::custom_op_route("test_host_cube", runtime::Device::Cpu), CustomRoute::HostKernel);
  EXPECT_EQ(runtime::custom_op_route("test_scaled_silu", runtime::Device::Cpu), CustomRoute::Lowering);
  EXPECT_EQ(runtime::custom_op_route("unregistered", runtime::Device::Cpu), CustomRoute::None);
  // A raw GPU kernel takes precedence over a host kernel of the same name on its device.
  runtime::register_vulkan_kernel("test_host_cube", {.glsl = "void main() {}"});
  runtime::register_cuda_kernel("test_host_cube", {.source = "", .entry = "cube"});
  EXPECT_EQ(runtime::custom_op_route("test_host_cube", runtime::Device::Vulkan), CustomRoute::RawGpuKernel);
  EXPECT_EQ(runtime::custom_op_route("test_host_cube", runtime::Device::Cuda), CustomRoute::RawGpuKernel);
  EXPECT_EQ(runtime::custom_op_route("test_host_cube", runtime::Device::Cpu), CustomRoute::HostKernel);
}
