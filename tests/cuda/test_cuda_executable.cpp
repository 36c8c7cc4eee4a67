// The CUDA executable's asynchronous surface (async_pipeline) and its refusals, beyond what the capability test
// checks: run_pipelined over more sets than its two staging buffers, in order through a handle fed from an
// output, with outputs left behind, and on a graph with a host kernel (the sets then run one after the other);
// commit_no_wait refusing every other call until sync_pending. All of it needs a GPU but the advisory bits
// (set_active_extent is the capability test's, on every backend that claims it).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/quant.hpp"
#include "rlx/backends/cuda/cuda_backend.hpp"
#include "rlx/codegen/c.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/ir/custom_op.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/custom_kernels.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

namespace rlx::backends::cuda {
namespace {

using ir::Graph;
using ir::Shape;
using runtime::Device;

// y = x w + state, n = sum(x); with `host`, y goes through a custom op that only has a host kernel (y + 1).
struct HostPlusOne final : public ir::OpExtension {
  std::string_view name() const override { return "cuda_test_host_plus_one"; }
  int num_inputs() const override { return 1; }
  ir::TypeInfo infer(std::span<const ir::TypeInfo> in, const ir::Attrs&) const override { return in[0]; }
  std::optional<ir::Tensor> reference(std::span<const ir::Tensor> in, const ir::Attrs&,
                                      const ir::TypeInfo&) const override {
    ir::Tensor out = in[0];
    for (std::int64_t i = 0; i < out.numel(); ++i) out.set(i, in[0].get(i) + 1);
    return out;
  }
};

Graph pipeline_graph(bool host) {
  static const bool registered = [] {
    ir::register_op(std::make_shared<HostPlusOne>());
    runtime::register_host_kernel("cuda_test_host_plus_one", [](std::span<const ir::TensorView> in,
                                                                const ir::MutableTensorView& out, const ir::Attrs&) {
      const auto* x = static_cast<const float*>(in[0].data);
      auto* y = static_cast<float*>(out.data);
      for (std::size_t i = 0; i < out.nbytes / sizeof(float); ++i) y[i] = x[i] + 1;
    });
    return true;
  }();
  (void)registered;
  Graph g(host ? "pipeline with a host kernel" : "pipeline");
  auto x = g.input("x", Shape{16, 32});
  auto state = g.input("state", Shape{16, 32});
  auto y = g.add(g.matmul(x, g.param("w", Shape{32, 32})), state);
  if (host) y = g.mul(g.custom_op("cuda_test_host_plus_one", {}, {y}), g.scalar(0.5));
  g.add_output(y, "y");
  g.add_output(g.sum(x, {0, 1}), "n");
  return g;
}

class CudaExecutable : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST(CudaExecutableBits, TheAdvisoryBitsOfferTheAsyncPipelineAndTheActiveExtent) {
  const auto caps = runtime::advisory_capabilities(Device::Cuda);
  EXPECT_TRUE(caps.async_pipeline);
  EXPECT_TRUE(caps.active_extent);
}

// Seven sets (an odd count, more than the two staging buffers), the state fed from y after each: set k sees the
// state set k - 1 left, so the sets must run in order even as they overlap.
TEST_F(CudaExecutable, RunPipelinedKeepsTheSetsInOrder) {
  for (bool host : {false, true}) {
    SCOPED_TRACE(host ? "with a host kernel" : "one segment");
    const Graph g = pipeline_graph(host);
    std::mt19937_64 rng(testing::test_seed());
    reference::TensorMap params{{"w", testing::random_tensor(ir::DType::F32, {32, 32}, rng, -0.2, 0.2)}};
    const ir::Tensor state0 = testing::random_tensor(ir::DType::F32, {16, 32}, rng);
    auto exe = runtime::Session(Device::Cuda).compile(g);
    exe.set_param("w", params.at("w"));
    exe.bind_handle("state", ir::view(state0));
    exe.feed_handle("state", "y");
    std::vector<ir::Tensor> xs;
    std::vector<std::vector<runtime::NamedTensor>> sets;
    for (int k = 0; k < 7; ++k) xs.push_back(testing::random_tensor(ir::DType::F32, {16, 32}, rng));
    for (const auto& x : xs) sets.push_back({{"x", ir::view(x)}});
    const auto got = exe.run_pipelined(sets);
    ASSERT_EQ(got.size(), xs.size());
    ir::Tensor state = state0;
    for (std::size_t k = 0; k < xs.size(); ++k) {
      const auto want = reference::run(g, {{"x", xs[k]}, {"state", state}}, params);
      EXPECT_TRUE(testing::tensors_close(got[k][0], want[0])) << "set " << k;
      EXPECT_TRUE(testing::tensors_close(got[k][1], want[1])) << "set " << k;
      state = want[0];
    }
    EXPECT_TRUE(testing::tensors_close(exe.read_handle("state"), state));
    // Again: the second staging buffer and its graph are kept; a plain run after it sees the last state.
    const auto again = exe.run_pipelined(sets);
    for (std::size_t k = 0; k < xs.size(); ++k) {
      const auto want = reference::run(g, {{"x", xs[k]}, {"state", state}}, params);
      EXPECT_TRUE(testing::tensors_close(again[k][0], want[0])) << "set " << k;
      state = want[0];
    }
  }
}

// commit_no_wait, then every other entry point refuses until sync_pending, which returns the run's outputs; a
// sync_pending with nothing pending returns nothing.
TEST_F(CudaExecutable, CommitNoWaitRefusesOtherCallsUntilSyncPending) {
  const Graph g = pipeline_graph(false);
  std::mt19937_64 rng(testing::test_seed());
  reference::TensorMap params{{"w", testing::random_tensor(ir::DType::F32, {32, 32}, rng)}};
  reference::TensorMap in{{"x", testing::random_tensor(ir::DType::F32, {16, 32}, rng)},
                          {"state", testing::random_tensor(ir::DType::F32, {16, 32}, rng)}};
  auto exe = runtime::Session(Device::Cuda).compile(g);
  exe.set_param("w", params.at("w"));
  std::vector<runtime::NamedTensor> named;
  for (const auto& [name, t] : in) named.push_back({name, ir::view(t)});
  EXPECT_TRUE(exe.sync_pending().empty());
  exe.commit_no_wait(named);
  testing::expect_error([&] { exe.run(named); }, {"pending", "sync_pending"});
  testing::expect_error([&] { exe.set_param("w", params.at("w")); }, {"set_param", "pending"});
  testing::expect_error([&] { exe.set_profiling(true); }, {"set_profiling", "pending"});
  testing::expect_error([&] { exe.commit_no_wait(named); }, {"commit_no_wait", "pending"});
  const auto got = exe.sync_pending();
  const auto want = reference::run(g, in, params);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t j = 0; j < got.size(); ++j) EXPECT_TRUE(testing::tensors_close(got[j], want[j])) << j;
  EXPECT_TRUE(exe.sync_pending().empty());
  const auto after = exe.run(named);  // idle again
  EXPECT_TRUE(testing::tensors_close(after[0], want[0]));
}

// Programmatic dependent launch: the backend launches a generated or quantized kernel while the one before it
// still runs, which is safe only because every such function waits for the previous grid before anything else.
// Each generated function's first statement is that wait, and the programs compile with it for sm_90 (where it
// is griddepcontrol) and for sm_80 (where it is empty).
TEST(CudaGridDependency, EveryGeneratedFunctionWaitsForThePreviousGridFirst) {
  Graph g("mixed kernels");
  auto x = g.input("x", Shape{64, 256});
  auto n = g.layer_norm(x, std::nullopt, std::nullopt);
  auto s = g.sum(g.mul(n, x), {1}, true);
  auto p = g.pad(g.softmax(g.sub(x, s), 1), {0, 1, 0, 2});
  g.add_output(p, "y");
  g.add_output(g.argmax(x, 1), "i");
  const auto lir = compile::compile(g, traits(), {}).lir;
  const auto m = codegen::c::emit_cuda(lir);
  std::size_t functions = 0;
  for (const auto& k : m.kernels)
    for (const auto* phases : {&k.phases, &k.epilogue})
      for (const auto& ph : *phases) {
        const auto body = ph.text.find(") {\n");
        ASSERT_NE(body, std::string::npos) << ph.text;
        EXPECT_EQ(ph.text.substr(body + 4, 29), "  rlx_grid_dependency_wait();") << ph.text;
        ++functions;
      }
  EXPECT_GE(functions, 4u);
  EXPECT_NE(m.prelude.find(codegen::c::kCudaGridDependencyWait), std::string::npos);
  for (ir::DType t : {ir::DType::Q4_0, ir::DType::F32}) {
    const std::string& program = quant_program(t);
    EXPECT_NE(program.find(codegen::c::kCudaGridDependencyWait), std::string::npos);
  }
  if (auto why = nvrtc_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const char* arch : {"sm_90", "sm_80"}) {
    SCOPED_TRACE(arch);
    EXPECT_GT(compile_for_arch(m.source, arch), 0u);
    EXPECT_GT(compile_for_arch(quant_program(ir::DType::Q4_0), arch), 0u);
  }
}

// On a GPU: sixteen dependent steps, each a reduction kernel and an elementwise kernel that reads its result and
// the step before (y = 0.9 (y - mean(y)) + x over 2^20 elements): under the programmatic launches a kernel that
// started reading before its predecessor ended would see a stale or half-written buffer. Run on fresh inputs,
// again and again, against the reference.
TEST_F(CudaExecutable, DependentKernelsLaunchedProgrammaticallySeeTheirPredecessorsWrites) {
  Graph g("dependent steps");
  auto x = g.input("x", Shape{1024, 1024});
  auto y = x;
  for (int k = 0; k < 16; ++k) y = g.add(g.mul(g.sub(y, g.mean(y, {1}, true)), g.scalar(0.9)), x);
  g.add_output(y, "y");
  auto exe = runtime::Session(Device::Cuda).compile(g);
  std::mt19937_64 rng(testing::test_seed());
  for (int run = 0; run < 4; ++run) {
    const ir::Tensor xt = testing::random_tensor(ir::DType::F32, {1024, 1024}, rng);
    const auto want = reference::run(g, {{"x", xt}}, {});
    for (int again = 0; again < 5; ++again) {
      const auto got = exe.run(std::vector<runtime::NamedTensor>{{"x", ir::view(xt)}});
      ASSERT_TRUE(testing::tensors_close(got.at(0), want.at(0))) << "run " << run << ", again " << again;
    }
  }
}

}  // namespace
}  // namespace rlx::backends::cuda
