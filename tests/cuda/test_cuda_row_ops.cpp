// Softmax, log_softmax, layer_norm and rms_norm on the CUDA backend: kept whole by its traits and emitted as
// one warp-per-row phase by codegen::c's CUDA dialect (c_cuda.inc, row_op); rope likewise, one phase over its
// pairs (c_cuda.inc, rope). Checked on the LIR and the
// generated source, compiled by NVRTC where it is installed (no GPU needed); on a GPU, the same graphs run
// against the reference interpreter on fresh random inputs (NaN and -inf rows included).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/layout.hpp"
#include "rlx/backends/cuda/cuda_backend.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

namespace rlx::backends::cuda {
namespace {

using ir::DType;
using ir::Graph;
using ir::Shape;

// Each row op on its own: rows along the last axis and along a middle one (elements `inner` apart), rows
// longer and shorter than a warp, norms with and without their scales, f32 and f64.
std::vector<Graph> row_graphs() {
  std::vector<Graph> gs;
  auto one = [&](const char* name, Shape s, DType t, auto&& build) {
    Graph g(name);
    auto x = g.input("x", s, t);
    g.add_output(build(g, x), "y");
    gs.push_back(std::move(g));
  };
  one("softmax rows of 300", Shape{7, 300}, DType::F32, [](Graph& g, auto x) { return g.softmax(x, -1); });
  one("softmax rows of 5", Shape{9, 5}, DType::F32, [](Graph& g, auto x) { return g.softmax(x, -1); });
  one("softmax over a middle axis", Shape{3, 37, 40}, DType::F32, [](Graph& g, auto x) { return g.softmax(x, 1); });
  one("log_softmax", Shape{4, 70}, DType::F32, [](Graph& g, auto x) { return g.log_softmax(x, -1); });
  one("softmax f64", Shape{6, 90}, DType::F64, [](Graph& g, auto x) { return g.softmax(x, -1); });
  {
    Graph g("layer_norm over two axes, gamma and beta");
    auto x = g.input("x", Shape{2, 3, 16, 12});
    g.add_output(g.layer_norm(x, g.input("gamma", Shape{16, 12}), g.input("beta", Shape{16, 12}), 1e-5, -2), "y");
    gs.push_back(std::move(g));
  }
  one("layer_norm alone", Shape{5, 64}, DType::F32,
      [](Graph& g, auto x) { return g.layer_norm(x, std::nullopt, std::nullopt, 1e-5, -1); });
  {
    Graph g("rms_norm with gamma");
    auto x = g.input("x", Shape{6, 100});
    g.add_output(g.rms_norm(x, g.input("gamma", Shape{100}), 1e-6), "y");
    gs.push_back(std::move(g));
  }
  one("rms_norm f64", Shape{3, 33}, DType::F64, [](Graph& g, auto x) { return g.rms_norm(x, std::nullopt, 1e-6); });
  return gs;
}

// Rope (kept whole too: one phase over the pairs): halves and interleaved pairs, cos and sin per position
// broadcast over batch and heads, and per head; f64.
std::vector<Graph> rope_graphs() {
  std::vector<Graph> gs;
  auto one = [&](const char* name, Shape x, Shape cs, bool interleaved, DType t) {
    Graph g(name);
    auto xn = g.input("x", x, t);
    g.add_output(g.rope(xn, g.input("cos", cs, t), g.input("sin", cs, t), interleaved), "y");
    gs.push_back(std::move(g));
  };
  one("rope halves, cos [S, D/2]", Shape{2, 3, 7, 64}, Shape{7, 32}, false, DType::F32);
  one("rope interleaved, cos [S, D/2]", Shape{1, 4, 5, 10}, Shape{5, 5}, true, DType::F32);
  one("rope per head, cos [H, S, D/2]", Shape{2, 3, 4, 8}, Shape{3, 4, 4}, false, DType::F32);
  one("rope f64", Shape{3, 6}, Shape{3, 3}, false, DType::F64);
  return gs;
}

// dynamic_update_slice (a KV cache's update, kept whole): along a middle axis and the first, f32 and i32, the start
// an i32 scalar or an i64 [1] (random in [-3, 3] on the GPU: negative starts clamp to 0).
std::vector<Graph> update_graphs() {
  std::vector<Graph> gs;
  auto one = [&](const char* name, Shape x, Shape u, DType t, Shape start, DType st, std::int64_t axis) {
    Graph g(name);
    auto xn = g.input("x", x, t);
    g.add_output(g.dynamic_update_slice(xn, g.input("update", u, t), g.input("start", start, st), axis), "y");
    gs.push_back(std::move(g));
  };
  one("dynamic_update_slice of rows of a cache", Shape{3, 20, 8}, Shape{3, 4, 8}, DType::F32, Shape{}, DType::I32, 1);
  one("dynamic_update_slice i32 on the first axis", Shape{5, 6}, Shape{2, 6}, DType::I32, Shape{1}, DType::I64, 0);
  return gs;
}

std::vector<Graph> native_graphs() {
  auto gs = row_graphs();
  for (auto& g : rope_graphs()) gs.push_back(std::move(g));
  for (auto& g : update_graphs()) gs.push_back(std::move(g));
  return gs;
}

// Rope (a thread per pair; its decomposition is ten kernels) and dynamic_update_slice (a thread per element of x;
// four kernels decomposed) are each the graph's one kernel, one phase of generated code.
TEST(CudaRowOps, RopeAndDynamicUpdateSliceAreOnePhase) {
  auto check = [](const Graph& g, std::int64_t threads_per_two_elements) {
    SCOPED_TRACE(g.name());
    const auto lir = compile::compile(g, traits(), {}).lir;
    ASSERT_EQ(lir.kernels.size(), 1u);
    EXPECT_EQ(lir.kernels[0].kind, compile::KernelKind::Native);
    const auto m = emit(lir);
    EXPECT_EQ(m.kernels[0].why, "");
    ASSERT_EQ(m.kernels[0].phases.size(), 1u);
    EXPECT_EQ(m.kernels[0].phases[0].iterations, g.node(g.input_ids()[0]).shape.numel() * threads_per_two_elements / 2);
  };
  for (const Graph& g : rope_graphs()) check(g, 1);
  for (const Graph& g : update_graphs()) check(g, 2);
}

TEST(CudaRowOps, StayWholeAsOneWarpPerRowPhase) {
  for (const Graph& g : row_graphs()) {
    SCOPED_TRACE(g.name());
    const auto lir = compile::compile(g, traits(), {}).lir;
    std::size_t native = 0;
    for (const auto& k : lir.kernels) {
      EXPECT_NE(k.kind, compile::KernelKind::Reduce) << k.name;  // not decomposed into reductions
      native += k.kind == compile::KernelKind::Native;
    }
    EXPECT_EQ(native, 1u);
    const auto m = emit(lir);
    for (std::size_t i = 0; i < lir.kernels.size(); ++i) {
      EXPECT_EQ(m.kernels[i].why, "") << lir.kernels[i].name;  // nothing left for the host
      if (lir.kernels[i].kind != compile::KernelKind::Native) continue;
      ASSERT_EQ(m.kernels[i].phases.size(), 1u);
      const std::string& text = m.kernels[i].phases[0].text;
      EXPECT_NE(text.find("rlx_shfl"), std::string::npos) << text;
      EXPECT_EQ(m.kernels[i].phases[0].iterations % 32, 0) << text;  // 32 lanes a row
    }
  }
}

TEST(CudaRowOps, TheRowPhasesCompile) {
  if (auto why = nvrtc_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  for (const Graph& g : native_graphs()) {
    SCOPED_TRACE(g.name());
    EXPECT_GT(compile_for_arch(emit(compile::compile(g, traits(), {}).lir).source, "compute_90"), 0u);
  }
}

TEST(CudaRowOps, MatchTheReferenceOnTheGpu) {
  if (auto why = unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  std::mt19937_64 rng(testing::test_seed());
  runtime::Session session(runtime::Device::Cuda);
  for (const Graph& g : native_graphs()) {
    SCOPED_TRACE(g.name());
    auto exe = session.compile(g);
    reference::TensorMap inputs;
    for (auto id : g.input_ids()) {
      const auto& n = g.node(id);
      inputs[n.attrs.get_str("name")] = testing::random_tensor(n.dtype, n.shape.extents(), rng, -3, 3);
    }
    // A NaN in the first row and a row of -inf in the second: both come out as the reference's.
    ir::Tensor& x = inputs.at("x");
    if (ir::is_float(x.dtype())) {
      x.set(1, std::nan(""));
      const auto row = x.shape().back();
      for (std::int64_t j = 0; j < row && row + j < x.numel(); ++j)
        x.set(row + j, -std::numeric_limits<double>::infinity());
    }
    auto got = exe.run(inputs);
    auto want = reference::run(g, inputs, {});
    ASSERT_EQ(got.size(), want.size());
    EXPECT_TRUE(testing::tensors_close(got[0], want[0], testing::tolerance_for(want[0].dtype())));
  }
}

}  // namespace
}  // namespace rlx::backends::cuda
