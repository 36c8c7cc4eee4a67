// register_mlx_kernel (rlx/backends/mlx/mlx_kernel.hpp): a custom op given a function over mx::array runs inside
// the MLX segment around it, in place of its host kernel or of its lowering (the decomposition), with its
// attributes, matching the float64 reference; misuse fails naming the node.
// This file is built against MLX's headers (tests/CMakeLists.txt); without MLX it is empty.
#ifdef RLX_HAVE_MLX
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <random>
#include <variant>

#include "backends/mlx/lower.hpp"
#include "rlx/backends/mlx/mlx_backend.hpp"
#include "rlx/backends/mlx/mlx_kernel.hpp"
#include "rlx/env.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/test_ops.hpp"
#include "support/testing.hpp"

namespace rlx::backends::mlx {
namespace {

namespace mx = ::mlx::core;
using runtime::Device;

// alpha * x + 1: attributes, a float64 reference, and no lowering or host kernel, so only an MLX kernel runs it.
class Affine final : public ir::OpExtension {
 public:
  std::string_view name() const override { return "mlx_test_affine"; }
  int num_inputs() const override { return 1; }
  std::vector<ir::AttrSpec> attr_schema() const override { return {{"alpha", ir::AttrType::Float, true}}; }
  ir::TypeInfo infer(std::span<const ir::TypeInfo> in, const ir::Attrs&) const override { return in[0]; }
  std::optional<ir::Tensor> reference(std::span<const ir::Tensor> in, const ir::Attrs& a,
                                      const ir::TypeInfo&) const override {
    ir::Tensor out = in[0];
    for (std::int64_t i = 0; i < out.numel(); ++i) out.set(i, a.get_float("alpha") * in[0].get(i) + 1.0);
    return out;
  }
};

class MlxKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
    testing::register_test_ops();
    static const bool affine = (ir::register_op(std::make_shared<Affine>()), true);
    (void)affine;
  }
  static reference::TensorMap input(std::vector<std::int64_t> shape) {
    std::mt19937_64 rng(testing::test_seed());
    return {{"x", testing::random_tensor(ir::DType::F32, shape, rng)}};
  }
  static std::vector<runtime::NamedTensor> named(const reference::TensorMap& m) {
    std::vector<runtime::NamedTensor> out;
    for (const auto& [k, v] : m) out.push_back({k, ir::view(v)});
    return out;
  }
};

TEST_F(MlxKernels, RunInTheSegmentInPlaceOfTheHostKernel) {
  ir::Graph g("cube");
  auto x = g.input("x", {4, 7});
  g.add_output(g.relu(g.custom_op("test_host_cube", {}, {g.add(x, x)})), "y");
  const auto in = input({4, 7});
  const auto want = reference::run(g, in, {});
  if (!find_mlx_kernel("test_host_cube")) {  // unless an earlier test in this process registered it
    // Its host kernel runs as a host step between MLX segments.
    EXPECT_EQ(runtime::custom_op_route("test_host_cube", Device::Mlx), runtime::CustomRoute::HostKernel);
    auto c = Session(Device::Mlx).compile(g);
    c.set_profiling(true);
    EXPECT_TRUE(testing::tensors_close(c.run(named(in))[0], want[0]));
    int host = 0;
    for (const auto& t : c.kernel_times()) host += t.host;
    EXPECT_EQ(host, 1);
  }
  static std::atomic<int> calls{0};
  register_mlx_kernel("test_host_cube", [](const std::vector<mx::array>& x, const ir::Attrs&) {
    ++calls;
    return mx::multiply(mx::multiply(x[0], x[0]), x[0]);
  });
  EXPECT_EQ(runtime::custom_op_route("test_host_cube", Device::Mlx), runtime::CustomRoute::BackendKernel);
  EXPECT_EQ(runtime::custom_op_route("test_host_cube", Device::Cpu), runtime::CustomRoute::HostKernel);
  EXPECT_TRUE(traits().custom_kernels.contains("test_host_cube"));
  for (const char* mode : {"lazy", "compiled"}) {
    SCOPED_TRACE(mode);
    env::ScopedOverride m("RLX_MLX_MODE", mode);
    calls = 0;
    auto c = Session(Device::Mlx).compile(g);
    c.set_profiling(true);
    auto got = c.run(named(in));
    EXPECT_TRUE(testing::tensors_close(got[0], want[0]));
    EXPECT_GT(calls.load(), 0);  // the MLX kernel was lowered (the host kernel would not call it)
    for (const auto& t : c.kernel_times()) EXPECT_FALSE(t.host) << t.kernel << " ran on the host";
  }
}

// test_scaled_silu has a lowering, which the pipeline inlines (the op's decomposition) until an MLX kernel is
// registered; then the custom node stays whole and the kernel, not the decomposition, computes it, matching the
// float64 reference (the lowering, run in f64) with its attribute.
std::size_t custom_nodes(const runtime::CompiledGraph& c) {
  std::size_t n = 0;
  for (const auto& k : c.compile_result().lir.kernels)
    for (const auto& node : k.body.nodes()) n += node.op == ir::OpKind::Custom;
  return n;
}

TEST_F(MlxKernels, ReplaceTheDecompositionOfAnOpWithALowering) {
  ir::Graph g("silu");
  auto x = g.input("x", {5, 9});
  g.add_output(g.mul(g.custom_op("test_scaled_silu", {{"alpha", 1.7}}, {x}), x), "y");
  const auto in = input({5, 9});
  const auto want = reference::run(g, in, {});
  ASSERT_EQ(runtime::custom_op_route("test_scaled_silu", Device::Mlx), runtime::CustomRoute::Lowering);
  {
    auto c = Session(Device::Mlx).compile(g);
    EXPECT_EQ(custom_nodes(c), 0u);  // inlined: the decomposition runs
    EXPECT_TRUE(testing::tensors_close(c.run(named(in))[0], want[0]));
  }
  static std::atomic<int> calls{0};
  register_mlx_kernel("test_scaled_silu", [](const std::vector<mx::array>& x, const ir::Attrs& a) {
    ++calls;
    return mx::multiply(x[0], mx::sigmoid(mx::multiply(x[0], mx::array(float(a.get_float("alpha"))))));
  });
  EXPECT_EQ(runtime::custom_op_route("test_scaled_silu", Device::Mlx), runtime::CustomRoute::BackendKernel);
  EXPECT_EQ(runtime::custom_op_route("test_scaled_silu", Device::Cpu), runtime::CustomRoute::Lowering);
  for (const char* mode : {"eager", "lazy", "compiled"}) {
    SCOPED_TRACE(mode);
    env::ScopedOverride m("RLX_MLX_MODE", mode);
    calls = 0;
    auto c = Session(Device::Mlx).compile(g);
    EXPECT_EQ(custom_nodes(c), 1u);  // kept whole for the MLX kernel
    std::vector<ir::Tensor> got{ir::Tensor(ir::DType::F32, {5, 9})};
    for (std::int64_t i = 0; i < got[0].numel(); ++i) got[0].set(i, std::nan(""));  // poisoned
    c.run_into(named(in), got);
    EXPECT_TRUE(testing::tensors_close(got[0], want[0]));
    EXPECT_GT(calls.load(), 0);
  }
  // The CPU still runs the decomposition: the MLX kernel is Device::Mlx's only.
  auto cpu = Session(Device::Cpu).compile(g);
  EXPECT_EQ(custom_nodes(cpu), 0u);
  EXPECT_TRUE(testing::tensors_close(cpu.run(named(in))[0], want[0]));
}

TEST_F(MlxKernels, ReadTheNodesAttributes) {
  register_mlx_kernel("mlx_test_affine", [](const std::vector<mx::array>& x, const ir::Attrs& a) {
    return mx::add(mx::multiply(x[0], mx::array(float(a.get_float("alpha")))), mx::array(1.0f));
  });
  ir::Graph g("affine");
  g.add_output(g.custom_op("mlx_test_affine", {{"alpha", 2.5}}, {g.input("x", {3, 5})}), "y");
  const auto in = input({3, 5});
  auto c = Session(Device::Mlx).compile(g);
  EXPECT_TRUE(testing::tensors_close(c.run(named(in))[0], reference::run(g, in, {})[0]));
}

// What MLX's CUDA build cannot be given (found on an H100): its GPU kernels divide by sizes, so an empty value is
// never made by an MLX op (SIGFPE on x86); f64, which its GPU does not compute, moves on MLX's CPU device; and f32
// matmuls stay exact (MLX_ENABLE_TF32 off). On mlx-cpu these hold as well: the value is already evaluated when the
// lowering returns it, not a lazy op that a GPU would run.
TEST_F(MlxKernels, EmptyValuesF64AndF32MatmulsAvoidWhatMlxsGpuCannotDo) {
  auto lowered = [](ir::Graph& body, ir::NodeId id, std::vector<mx::array> x) {
    return lower_node(body, body.node(id), x);
  };
  ir::Graph body("empty");
  auto e = body.input("in0", {0, 3});
  auto exp = body.exp(e);
  auto y = lowered(body, exp, {mx::zeros({0, 3})});
  EXPECT_TRUE(y.is_available());
  EXPECT_EQ(y.shape(), (mx::Shape{0, 3}));
  // Non-empty results of empty operands: the reductions' identities, matmul over K = 0, concat of an empty piece.
  auto sum = lowered(body, body.sum(e, {0}), {mx::zeros({0, 3})});
  auto prod = lowered(body, body.reduce(ir::OpKind::ReduceProd, e, {0}), {mx::zeros({0, 3})});
  auto mean = lowered(body, body.reduce(ir::OpKind::ReduceMean, e, {0}), {mx::zeros({0, 3})});
  mx::eval({sum, prod, mean});
  EXPECT_EQ(sum.data<float>()[2], 0.0f);
  EXPECT_EQ(prod.data<float>()[2], 1.0f);
  EXPECT_TRUE(std::isnan(mean.data<float>()[2]));
  ir::Graph mm("k0");
  auto a = mm.input("in0", {2, 0});
  auto b = mm.input("in1", {0, 3});
  auto c = lowered(mm, mm.matmul(a, b), {mx::zeros({2, 0}), mx::zeros({0, 3})});
  mx::eval(c);
  EXPECT_EQ(c.shape(), (mx::Shape{2, 3}));
  EXPECT_EQ(c.data<float>()[5], 0.0f);
  ir::Graph cat("concat");
  auto p = cat.input("in0", {0, 3});
  auto q = cat.input("in1", {2, 3});
  auto joined = lowered(cat, cat.concat({p, q}, 0), {mx::zeros({0, 3}), mx::ones({2, 3})});
  mx::eval(joined);
  EXPECT_EQ(joined.shape(), (mx::Shape{2, 3}));
  const mx::Device cpu(mx::Device::cpu);  // MLX's GPU refuses to make an f64 array at all
  EXPECT_EQ(std::get<mx::Device>(device_for(mx::zeros({2}, mx::float64, cpu))), cpu);
  EXPECT_TRUE(std::holds_alternative<std::monostate>(device_for(mx::zeros({2}))));
  (void)make_mlx_backend();
  const char* tf32 = std::getenv("MLX_ENABLE_TF32");
  ASSERT_NE(tf32, nullptr);
  EXPECT_STREQ(tf32, "0");
}

TEST_F(MlxKernels, MisuseFailsNamingTheNode) {
  testing::expect_error([] { register_mlx_kernel("mlx_test_affine", {}); },
                        {"register_mlx_kernel", "mlx_test_affine", "empty"});
  ir::Graph g("affine");
  g.add_output(g.custom_op("mlx_test_affine", {{"alpha", 1.0}}, {g.input("x", {3, 5})}), "y");
  // A result of the wrong shape.
  register_mlx_kernel("mlx_test_affine",
                      [](const std::vector<mx::array>& x, const ir::Attrs&) { return mx::sum(x[0], 0); });
  testing::expect_error([&] { Session(Device::Mlx).compile(g); }, {"custom op 'mlx_test_affine'", "[5]", "[3,5]"});
  // MLX's own refusal (a reshape that cannot be), as an rlx::Error.
  register_mlx_kernel("mlx_test_affine",
                      [](const std::vector<mx::array>& x, const ir::Attrs&) { return mx::reshape(x[0], {7}); });
  testing::expect_error([&] { Session(Device::Mlx).compile(g); }, {"mlx_test_affine", "MLX kernel", "failed"});
}

}  // namespace
}  // namespace rlx::backends::mlx
#endif  // RLX_HAVE_MLX
