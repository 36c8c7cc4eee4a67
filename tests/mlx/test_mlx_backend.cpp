// The MLX backend beyond the conformance suites: its modes (RLX_MLX_MODE), segments split by host steps,
// the capabilities it claims, clones from several threads, and what a build or machine without MLX reports.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>

#include "rlx/backends/mlx/mlx_backend.hpp"
#include "rlx/env.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

namespace rlx::backends::mlx {
namespace {

using runtime::Device;

class Mlx : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  }
};

std::vector<runtime::NamedTensor> named(const reference::TensorMap& m) {
  std::vector<runtime::NamedTensor> out;
  for (const auto& [k, v] : m) out.push_back({k, ir::view(v)});
  return out;
}

// A small MLP whose middle runs on the host: an f64 stretch (MLX's f64 is not used) and a random sample (RLX's
// counter-based stream, drawn by the CPU backend), so the graph is three MLX segments around two host steps.
ir::Graph split_graph() {
  ir::Graph g("split");
  auto x = g.input("x", {4, 8});
  auto w = g.param("w", {8, 8});
  auto h = g.relu(g.matmul(x, w));
  auto wide = g.cast(h, ir::DType::F64);
  auto back = g.cast(g.exp(g.unary(ir::OpKind::Neg, wide)), ir::DType::F32);
  auto noise = g.random_uniform(ir::Shape{4, 8}, 11);
  g.add_output(g.add(g.matmul(back, w), noise), "y");
  g.add_output(g.sum(h, {1}), "s");
  return g;
}

struct Data {
  reference::TensorMap in, params;
};

Data data() {
  std::mt19937_64 rng(testing::test_seed());
  return {{{"x", testing::random_tensor(ir::DType::F32, {4, 8}, rng)}},
          {{"w", testing::random_tensor(ir::DType::F32, {8, 8}, rng)}}};
}

TEST(MlxModes, ParseAndEnv) {
  EXPECT_EQ(parse_mode("Eager"), Mode::Eager);
  EXPECT_EQ(parse_mode("lazy"), Mode::Lazy);
  EXPECT_EQ(parse_mode("COMPILED"), Mode::Compiled);
  testing::expect_error([] { parse_mode("jit"); }, {"RLX_MLX_MODE", "'jit'", "eager, lazy or compiled"});
  {
    env::ScopedOverride unset("RLX_MLX_MODE", std::nullopt);
    EXPECT_EQ(mode_from_env(), Mode::Compiled);  // the seed's default
  }
  env::ScopedOverride lazy("RLX_MLX_MODE", "lazy");
  EXPECT_EQ(mode_from_env(), Mode::Lazy);
}

TEST(MlxTraits, ClaimTheLoweredPrimitivesAndFallBackToTheHost) {
  const auto t = traits();
  EXPECT_EQ(t.name, "mlx");
  EXPECT_TRUE(t.host_fallback);
  for (auto op : {ir::OpKind::MatMul, ir::OpKind::ReduceMax, ir::OpKind::Gather, ir::OpKind::ScatterAdd})
    EXPECT_TRUE(t.native_ops.contains(op)) << ir::op_name(op);
  // The composites MLX has kernels for (mx::softmax, mx::fast), computed in f32.
  for (auto op : {ir::OpKind::Softmax, ir::OpKind::LayerNorm, ir::OpKind::RmsNorm, ir::OpKind::Attention}) {
    EXPECT_TRUE(t.native_ops.contains(op)) << ir::op_name(op);
    EXPECT_TRUE(t.f32_compute_ops.contains(op)) << ir::op_name(op);
  }
  // RLX's random streams, control flow and the composites without an exact MLX kernel (rope: mx::fast::rope
  // makes its own angles) are not MLX kernels.
  for (auto op : {ir::OpKind::RandomUniform, ir::OpKind::While, ir::OpKind::Rope, ir::OpKind::LogSoftmax})
    EXPECT_FALSE(t.native_ops.contains(op)) << ir::op_name(op);
  EXPECT_EQ(runtime::dispatch_tier(ir::OpKind::RandomNormal, t), compile::DispatchTier::HostFallback);
}

TEST_F(Mlx, EveryModeMatchesTheReferenceAcrossHostSteps) {
  const auto g = split_graph();
  const auto d = data();
  const auto want = reference::run(g, d.in, d.params);
  for (const char* mode : {"eager", "lazy", "compiled"}) {
    SCOPED_TRACE(mode);
    env::ScopedOverride m("RLX_MLX_MODE", mode);
    auto c = Session(Device::Mlx).compile(g);
    c.set_param("w", d.params.at("w"));
    for (int run = 0; run < 2; ++run) {
      auto got = c.run(named(d.in));
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t j = 0; j < got.size(); ++j) EXPECT_TRUE(testing::tensors_close(got[j], want[j])) << j;
    }
  }
}

TEST_F(Mlx, ClaimsItsCapabilities) {
  auto c = Session(Device::Mlx).compile(split_graph());
  EXPECT_EQ(c.backend_name(), "mlx");
  EXPECT_EQ(c.capabilities().names(),
            (std::vector<std::string_view>{"clone", "persistent_handles", "gpu_handles", "kv_resident", "typed_io",
                                           "async_pipeline", "active_extent", "read_outputs", "rng", "copy_params",
                                           "kernel_times"}));
  EXPECT_EQ(runtime::advisory_capabilities(Device::Mlx), c.capabilities());
}

// kernel_times: one entry per LIR kernel, the host steps marked, and the profiled run still right.
TEST_F(Mlx, KernelTimesMarkTheHostSteps) {
  const auto g = split_graph();
  const auto d = data();
  const auto want = reference::run(g, d.in, d.params);
  auto c = Session(Device::Mlx).compile(g);
  c.set_param("w", d.params.at("w"));
  c.set_profiling(true);
  auto got = c.run(named(d.in));
  for (std::size_t j = 0; j < got.size(); ++j) EXPECT_TRUE(testing::tensors_close(got[j], want[j])) << j;
  const auto times = c.kernel_times();
  const auto& kernels = c.compile_result().lir.kernels;
  ASSERT_EQ(times.size(), kernels.size());
  int host = 0;
  for (std::size_t k = 0; k < times.size(); ++k) {
    EXPECT_EQ(times[k].kernel, kernels[k].name);
    EXPECT_TRUE(times[k].micros > 0 && std::isfinite(times[k].micros)) << times[k].kernel;
    // f64 and the random sample are the host's (the split graph's two host steps).
    const auto& nodes = kernels[k].body.nodes();
    const bool want_host = std::any_of(nodes.begin(), nodes.end(), [](const ir::Node& n) {
      return n.op == ir::OpKind::RandomUniform || n.dtype == ir::DType::F64;
    });
    EXPECT_EQ(times[k].host, want_host) << times[k].kernel;
    host += times[k].host;
  }
  EXPECT_EQ(host, 2);
  c.set_profiling(false);
  EXPECT_TRUE(c.kernel_times().empty());
}

TEST_F(Mlx, ClonesRunFromSeveralThreads) {
  const auto g = split_graph();
  const auto d = data();
  const auto want = reference::run(g, d.in, d.params);
  auto c = Session(Device::Mlx).compile(g);
  c.set_param("w", d.params.at("w"));
  std::vector<CompiledGraph> clones;
  for (int i = 0; i < 3; ++i) clones.push_back(c.clone());
  std::vector<std::thread> threads;
  std::vector<int> ok(clones.size(), 0);
  for (std::size_t i = 0; i < clones.size(); ++i)
    threads.emplace_back([&, i] {
      for (int r = 0; r < 5; ++r) {
        auto got = clones[i].run(named(d.in));
        ok[i] += testing::tensors_close(got[0], want[0]) && testing::tensors_close(got[1], want[1]);
      }
    });
  for (auto& t : threads) t.join();
  for (std::size_t i = 0; i < clones.size(); ++i) EXPECT_EQ(ok[i], 5) << "clone " << i;
}

TEST(MlxUnavailable, SaysWhy) {
  if (unavailable_reason().empty()) GTEST_SKIP() << "mlx is available here";
  testing::expect_error([] { Session s(Device::Mlx); }, {"mlx", "unavailable", "MLX"});
}

}  // namespace
}  // namespace rlx::backends::mlx
