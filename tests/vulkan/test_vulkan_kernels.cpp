// Which kernels the Vulkan backend runs as shaders, and which on the host:
// each kernel kind is checked to run on the device (GPU timestamps, not the
// host fallback) and to match the reference; ops the backend does not claim,
// custom ops with host kernels and f64 on devices without it run on the host,
// and the dispatch report says so.
#include <gtest/gtest.h>

#include "rlx/backends/vulkan/vulkan_backend.hpp"
#include "rlx/models/demo_models.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/test_ops.hpp"
#include "support/testing.hpp"

namespace rlx {
namespace {

using ir::DType;
using ir::Graph;
using ir::OpKind;
using ir::Shape;
namespace vk = backends::vulkan;

class VulkanKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = vk::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  }
};

struct Ran {
  std::vector<vk::KernelTime> kernels;
  compile::DispatchReport report;
};

// Compiles and runs `g` on Vulkan with random inputs and params, checks every
// output against the reference, and returns where each kernel ran.
Ran run_checked(const Graph& g, testing::Tolerance tol = {1e-4, 1e-4}) {
  auto compiled = vk::make_vulkan_backend()->compile(g);
  std::mt19937_64 rng(testing::test_seed());
  reference::TensorMap inputs, params;
  std::vector<const void*> in;
  for (auto id : compiled.result->lir.inputs) {
    const auto& b = compiled.result->lir.buffer(id);
    auto& t = inputs[b.name] = testing::random_tensor(b.dtype, b.shape, rng, -1, 1);
    in.push_back(t.data());
  }
  for (std::size_t i = 0; i < compiled.result->lir.params.size(); ++i) {
    const auto& b = compiled.result->lir.buffer(compiled.result->lir.params[i]);
    auto& t = params[b.name] = testing::random_tensor(b.dtype, b.shape, rng, -1, 1);
    compiled.exe->set_param(i, t.data(), t.nbytes());
  }
  std::vector<ir::Tensor> got;
  std::vector<void*> out;
  for (auto id : compiled.result->lir.outputs) {
    const auto& b = compiled.result->lir.buffer(id);
    got.emplace_back(b.dtype, b.shape);
    out.push_back(got.back().data());
  }
  compiled.exe->run(in, out);
  auto want = reference::run(g, inputs, params);
  for (std::size_t j = 0; j < got.size(); ++j)
    EXPECT_TRUE(testing::tensors_close(got[j], want[j],
                                       ir::is_float(want[j].dtype()) ? tol : testing::tolerance_for(want[j].dtype())))
        << "output " << j;
  return {vk::last_run_times(*compiled.exe), compiled.result->dispatch};
}

void expect_on_device(const Ran& r) {
  ASSERT_FALSE(r.kernels.empty());
  for (const auto& k : r.kernels) EXPECT_FALSE(k.host) << k.kernel << " ran on the host";
}

TEST_F(VulkanKernels, ElementwiseChainIsOneShaderOnTheDevice) {
  Graph g;
  auto x = g.input("x", Shape{33, 65});
  auto b = g.input("b", Shape{65});
  g.add_output(g.unary(OpKind::Gelu, g.mul(g.add(x, b), g.scalar(0.5))));
  auto r = run_checked(g);
  expect_on_device(r);
  EXPECT_EQ(r.kernels.size(), 1u);
}

TEST_F(VulkanKernels, ReductionsShortAndLongRunOnTheDevice) {
  Graph g;
  auto x = g.input("x", Shape{3, 300, 5});
  g.add_output(g.sum(g.exp(x), {1}));                       // long: a workgroup per output
  g.add_output(g.reduce(OpKind::ReduceMax, x, {2}, true));  // short: a thread per output
  g.add_output(g.argmax(x, 1));
  g.add_output(g.div(g.mean(x, {0, 2}), g.scalar(3)));  // with an epilogue
  expect_on_device(run_checked(g, {1e-4, 1e-3}));
}

TEST_F(VulkanKernels, EveryMatmulPathRunsOnTheDevice) {
  Graph g;
  auto bias = g.param("bias", Shape{264});
  // The vec4 128x128 tile (aligned rows), ragged edges on both sides, with an epilogue.
  g.add_output(g.relu(g.add(g.matmul(g.input("a", Shape{300, 16}), g.param("w", Shape{16, 264})), bias)));
  g.add_output(g.matmul(g.input("p", Shape{300, 17}), g.input("q", Shape{17, 260})));      // scalar 128x128 tile
  g.add_output(g.matmul(g.input("c", Shape{2, 100, 9}), g.input("d", Shape{2, 9, 120})));  // 64x64 tiles, batched
  g.add_output(g.matmul(g.input("e", Shape{5, 3}), g.input("f", Shape{3, 7})));            // a thread per element
  // Few tiles: 32x32 tiles with K split four ways; ragged M, N and K, a broadcast and a batched B.
  g.add_output(g.unary(OpKind::Tanh, g.matmul(g.input("s", Shape{3, 70, 100}), g.param("t", Shape{100, 45}))));
  g.add_output(g.matmul(g.input("s2", Shape{2, 33, 64}), g.input("t2", Shape{2, 64, 31})));
  g.add_output(g.matmul(g.input("s4", Shape{50, 100}), g.param("t4", Shape{100, 36})));  // the same with 16-byte loads
  // K also split across workgroups (three ranges, the last one short), partials summed before the epilogue.
  g.add_output(g.relu(
      g.add(g.matmul(g.input("s3", Shape{2, 30, 1000}), g.input("t3", Shape{1000, 20})), g.param("b3", Shape{20}))));
  auto i = g.input("i", Shape{4, 6}, DType::I32);
  g.add_output(g.matmul(i, g.input("j", Shape{6, 3}, DType::I32)));  // integers
  expect_on_device(run_checked(g, {2e-4, 2e-4}));
}

TEST_F(VulkanKernels, MovementRunsOnTheDevice) {
  Graph g;
  auto x = g.input("x", Shape{4, 5, 6});
  g.add_output(g.permute(x, {2, 0, 1}));
  g.add_output(g.slice(x, {1, 2}, {-4, 1}, {5, 6}, {2, 3}));
  g.add_output(g.flip(x, {0, 2}));
  g.add_output(g.pad(x, {1, 0, -1, 0, 2, 1}, -3));
  g.add_output(g.concat({x, g.unary(OpKind::Neg, x)}, 1));
  g.add_output(g.expand(g.input("e", Shape{5, 1}), Shape{3, 5, 4}));
  auto idx = g.iota(Shape{4, 5, 3}, 2);  // in range: 0..2 along the gathered axis
  g.add_output(g.gather(x, idx, 2));
  g.add_output(g.index_select(x, g.iota(Shape{2, 3}, 1), 2));
  g.add_output(g.scatter_add(x, idx, g.input("u", Shape{4, 5, 3}), 2));
  auto h = g.cast(x, DType::F16);
  g.add_output(g.cast(g.scatter_add(h, idx, g.cast(g.input("v", Shape{4, 5, 3}), DType::F16), 2), DType::F32));
  expect_on_device(run_checked(g, {2e-2, 2e-2}));
}

TEST_F(VulkanKernels, ArenaAndWeightsLargerThanOneBindingAreBoundAsWindows) {
  // Three inputs, three params and three products of 12M floats (48 MB) each: the arena and the weights
  // are past lavapipe's 128 MiB maxStorageBufferRange, so shaders reach most buffers through later
  // windows; a reduction and a matmul read operands placed after them.
  const std::int64_t n = 12'000'000;
  Graph g;
  for (int i = 0; i < 3; ++i) {
    auto y = g.add(g.mul(g.input("x" + std::to_string(i), Shape{n}), g.param("w" + std::to_string(i), Shape{n})),
                   g.scalar(1.0));
    g.add_output(y);
    if (i == 2) g.add_output(g.sum(g.reshape(y, Shape{n / 1000, 1000}), {1}));
  }
  g.add_output(g.matmul(g.input("a", Shape{40, 70}), g.param("b", Shape{70, 50})));
  expect_on_device(run_checked(g, {1e-4, 1e-4}));
}

TEST_F(VulkanKernels, OneBufferLargerThanABindingShowsIsAnError) {
  Graph g;  // 160 MB in one buffer: no window of lavapipe's 128 MiB holds it
  g.add_output(g.exp(g.input("x", Shape{40'000'000})));
  auto compile = [&] { vk::make_vulkan_backend()->compile(g); };
  if (vk::selected_device().type != "cpu") GTEST_SKIP() << "the window size is the device's maxStorageBufferRange";
  try {
    compile();
    ADD_FAILURE() << "compiled";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit one binding"), std::string::npos) << e.what();
  }
}

TEST_F(VulkanKernels, ConvIsAnImplicitGemmForEveryShape) {
  struct Case {
    Shape x, w;
    std::vector<std::int64_t> stride, pad, dilation;
    std::int64_t groups;
  };
  const Case cases[] = {
      {{3, 8, 9, 7}, {12, 8, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},    // batch, "same" padding
      {{1, 8, 4, 6}, {36, 4, 3, 3}, {1, 2}, {1, 0}, {1, 1}, 2},    // groups, more than 32 channels
      {{1, 3, 31, 29}, {4, 3, 2, 3}, {3, 2}, {4, 7}, {2, 3}, 1},   // strides, dilation, padding wider than the kernel
      {{2, 40, 6, 7}, {33, 40, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1},  // K = 360: several K tiles, ragged
      {{1, 16, 5, 5}, {48, 16, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1},  // pointwise
  };
  Graph g;
  int i = 0;
  for (const Case& c : cases) {
    const std::string s = std::to_string(i++);
    auto bias = g.param("b" + s, Shape{c.w.extents()[0]});
    g.add_output(g.conv2d(g.input("x" + s, c.x), g.param("w" + s, c.w), bias, c.stride, c.pad, c.dilation, c.groups));
  }
  g.add_output(g.conv1d(g.input("x1d", Shape{2, 6, 50}), g.param("w1d", Shape{10, 3, 5}), std::nullopt, 2, 3, 2, 2));
  expect_on_device(run_checked(g, {2e-4, 2e-4}));
}

TEST_F(VulkanKernels, EncoderBlockRunsOnTheDevice) {
  // Layer norms, attention with chunks of keys (S > 64), GELU and residual epilogues.
  auto g = models::encoder_block({2, 80, 32, 4, 64, 1e-5});
  expect_on_device(run_checked(g, {2e-4, 2e-4}));
}

TEST_F(VulkanKernels, TiledAttentionCoversRaggedTilesMasksAndCausality) {
  Graph g;
  // Sq and Sk not multiples of the 32- or 64-query and 32-key tiles; Dv != D and not a multiple of 32.
  auto q = g.input("q", Shape{2, 3, 70, 12}), k = g.input("k", Shape{2, 3, 45, 12}),
       v = g.input("v", Shape{2, 3, 45, 20});
  g.add_output(g.attention(q, k, v));
  g.add_output(g.attention(q, k, v, std::nullopt, /*causal=*/true, 0.3));
  // An additive mask broadcast over heads, and a boolean one that masks keys from 40 on.
  g.add_output(g.attention(q, k, v, g.input("m", Shape{2, 1, 70, 45})));
  auto keys = g.cast(g.iota(Shape{2, 3, 70, 45}, 3), DType::F32);
  g.add_output(g.attention(q, k, v, g.binary(OpKind::Lt, keys, g.scalar(40.0)), /*causal=*/true));
  // Enough batch entries for 64-query tiles.
  auto q3 = g.input("q3", Shape{4, 32, 70, 16}), k3 = g.input("k3", Shape{4, 32, 40, 16});
  g.add_output(g.attention(q3, k3, g.input("v3", Shape{4, 32, 40, 8})));
  // A head dim of 64.
  auto q2 = g.input("q2", Shape{4, 8, 130, 64}), k2 = g.input("k2", Shape{4, 8, 130, 64});
  g.add_output(g.attention(q2, k2, g.input("v2", Shape{4, 8, 130, 64}), std::nullopt, true));
  expect_on_device(run_checked(g, {2e-4, 2e-4}));
}

TEST_F(VulkanKernels, RowOpsHoldShortRowsInRegistersAndLoopOverLongOnes) {
  Graph g;
  // 70 elements: two per thread, the second only for some threads; 5000: a loop (more than 16 per thread).
  for (std::int64_t L : {70, 5000}) {
    auto x = g.input("x" + std::to_string(L), Shape{3, L});
    g.add_output(g.softmax(x, 1));
    g.add_output(g.log_softmax(x, -1));
    g.add_output(
        g.layer_norm(x, g.param("w" + std::to_string(L), Shape{L}), g.param("b" + std::to_string(L), Shape{L})));
    g.add_output(g.rms_norm(x, g.param("r" + std::to_string(L), Shape{L})));
  }
  g.add_output(g.softmax(g.input("y", Shape{4, 33, 5}), 1));  // a strided row
  expect_on_device(run_checked(g, {2e-4, 2e-4}));
}

TEST_F(VulkanKernels, IntegerComparisonsAfterWideningCasts) {
  Graph g;
  auto x = g.input("x", Shape{64}, DType::I32);
  auto w = g.cast(x, DType::I64);
  g.add_output(g.binary(OpKind::Lt, w, g.scalar(3, DType::I64)));
  g.add_output(g.binary(OpKind::Ge, w, g.scalar(-2, DType::I64)));
  g.add_output(g.binary(OpKind::Max, w, g.scalar(-1, DType::I64)));
  g.add_output(g.clamp(w, -3, 5));
  g.add_output(g.sum(w, {0}));
  g.add_output(g.argmin(w, 0));
  expect_on_device(run_checked(g));
}

}  // namespace
}  // namespace rlx
