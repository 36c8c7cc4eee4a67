// The CUDA backend's vector accesses (codegen::c::emit_cuda with CudaOptions, src/backends/cuda/layout.hpp):
// the generated source reads and writes an operand 16 bytes at a time only where the layout makes its address
// aligned to that and the loop allows it, and falls back to element-by-element access (or a scalar tail)
// otherwise. Checked on the generated source, and compiled by NVRTC where it is installed (no GPU needed);
// on a GPU, the same graphs run against the reference interpreter.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "backends/cuda/layout.hpp"
#include "rlx/backends/cuda/cuda_backend.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/env.hpp"
#include "rlx/error.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

namespace rlx::backends::cuda {
namespace {

using ir::DType;
using ir::Graph;
using ir::Shape;

compile::LirModule lir_of(const Graph& g) { return compile::compile(g, traits(), {}).lir; }

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The text of the one __global__ function of the graph's only kernel.
std::string kernel_text(const codegen::c::CudaModule& m) {
  EXPECT_EQ(m.kernels.size(), 1u);
  EXPECT_EQ(m.kernels.at(0).phases.size(), 1u);
  return m.kernels.at(0).phases.at(0).text;
}

Graph chain(std::int64_t n) {
  Graph g("chain");
  auto x = g.input("x", Shape{n});
  g.add_output(g.relu(g.add(g.mul(x, g.scalar(1.5)), x)), "y");
  return g;
}

TEST(CudaVectorize, AlignedContiguousOperandsMoveSixteenBytes) {
  const auto lir = lir_of(chain(4096));
  const std::string k = kernel_text(emit(lir, 16));
  EXPECT_EQ(count(k, "*(const rlx_vec<float, 4>*)(in0"), 1u) << k;  // x read once per step, as a vector
  EXPECT_EQ(count(k, "*(rlx_vec<float, 4>*)(out0"), 1u) << k;
  EXPECT_NE(k.find("rlx_t < 1024;"), std::string::npos) << k;  // 4096 / 4 steps
  EXPECT_EQ(count(k, "rlx_t += rlx_step()"), 1u) << k;         // no tail
  EXPECT_EQ(kernel_text(emit(lir, 16)).find("in0["), std::string::npos) << k;
  // 32 bytes: eight floats per step.
  EXPECT_NE(kernel_text(emit(lir, 32)).find("rlx_vec<float, 8>"), std::string::npos);
  // The vector loop is unrolled by RLX_CUDA_VECTOR_UNROLL's steps.
  {
    env::ScopedOverride unroll("RLX_CUDA_VECTOR_UNROLL", "2");
    EXPECT_NE(kernel_text(emit(lir, 16)).find("#pragma unroll 2\n"), std::string::npos);
  }
  {
    env::ScopedOverride unroll("RLX_CUDA_VECTOR_UNROLL", "9");
    EXPECT_THROW(emit(lir, 16), Error);
  }
}

// The grid's cap: none (0) unless RLX_CUDA_BLOCKS_PER_SM sets one.
TEST(CudaVectorize, BlocksPerMultiprocessorComeFromTheEnvironment) {
  EXPECT_EQ(blocks_per_sm(), 0);
  for (const char* ok : {"0", "1", "64", "1024"}) {
    env::ScopedOverride per_sm("RLX_CUDA_BLOCKS_PER_SM", ok);
    EXPECT_EQ(blocks_per_sm(), std::stoll(ok));
  }
  for (const char* bad : {"-1", "1025"}) {
    env::ScopedOverride per_sm("RLX_CUDA_BLOCKS_PER_SM", bad);
    EXPECT_THROW(blocks_per_sm(), Error) << bad;
  }
}

TEST(CudaVectorize, NoAlignmentFactsOrVectorBytesZeroMeansScalar) {
  const auto lir = lir_of(chain(4096));
  for (const auto& m : {codegen::c::emit_cuda(lir), emit(lir, 0)}) {
    const std::string k = kernel_text(m);
    EXPECT_EQ(k.find("rlx_vec"), std::string::npos) << k;
    EXPECT_NE(k.find("rlx_t < 4096;"), std::string::npos) << k;
  }
  // Alignment known only to 8 bytes: a 16-byte access is not safe.
  codegen::c::CudaOptions o;
  o.buffer_alignment.assign(lir.buffers.size(), 8);
  const std::string k = kernel_text(codegen::c::emit_cuda(lir, o));
  EXPECT_EQ(k.find("rlx_vec"), std::string::npos) << k;
}

TEST(CudaVectorize, AnOddCountGetsAScalarTail) {
  const std::string k = kernel_text(emit(lir_of(chain(1003)), 16));
  EXPECT_NE(k.find("rlx_t < 250;"), std::string::npos) << k;  // 250 vectors of 4
  EXPECT_NE(k.find("rlx_t = 1000 + rlx_first(); rlx_t < 1003;"), std::string::npos) << k;
}

TEST(CudaVectorize, BroadcastOperandsStayScalar) {
  Graph g("bias");
  auto x = g.input("x", Shape{64, 128});
  auto b = g.input("b", Shape{128});    // along the inner dim: contiguous, a vector too
  auto c = g.input("c", Shape{64, 1});  // one value per row: read once per step
  g.add_output(g.add(g.mul(x, b), c), "y");
  const auto lir = lir_of(g);
  const std::string k = kernel_text(emit(lir, 16));
  const auto& kernel = lir.kernels.at(0);
  ASSERT_EQ(kernel.inputs.size(), 3u);
  std::size_t vec = 0, scalar = 0;
  for (std::size_t i = 0; i < 3; ++i) {
    const std::string in = "in" + std::to_string(i);
    vec += count(k, "*(const rlx_vec<float, 4>*)(" + in);
    scalar += count(k, " = " + in + "[");
  }
  EXPECT_EQ(vec, 2u) << k;
  EXPECT_EQ(scalar, 1u) << k;
  EXPECT_EQ(count(k, "*(rlx_vec<float, 4>*)(out0"), 1u) << k;
}

TEST(CudaVectorize, AnInnerExtentNotAMultipleStaysScalar) {
  Graph g("odd");
  auto x = g.input("x", Shape{7, 5});
  auto b = g.input("b", Shape{5});
  g.add_output(g.add(x, b), "y");
  const std::string k = kernel_text(emit(lir_of(g), 16));
  EXPECT_EQ(k.find("rlx_vec"), std::string::npos) << k;
}

TEST(CudaVectorize, AViewAtAnUnalignedOffsetIsReadElementByElement) {
  // A slice dropping the first row of 3 floats is a view 12 bytes into its root.
  Graph g("view");
  auto x = g.input("x", Shape{9, 3});
  auto s = g.slice(g.exp(x), {0}, {1}, {9}, {1});
  g.add_output(g.mul(s, g.scalar(2.0)), "y");
  const auto lir = lir_of(g);
  const Layout layout = lay_out(lir);
  const compile::Kernel* mul = nullptr;
  for (const auto& k : lir.kernels)
    if (k.name.find("mul") != std::string::npos) mul = &k;
  ASSERT_NE(mul, nullptr);
  const auto& in = lir.buffer(mul->inputs.at(0));
  if (in.root == in.id || in.root < 0) GTEST_SKIP() << "the slice is not a view in this LIR";
  EXPECT_EQ(in.view_offset, 12);
  EXPECT_EQ(offset_alignment(layout.locs[std::size_t(in.id)].offset), 4);
  const auto m = emit(lir, 16);
  for (std::size_t i = 0; i < lir.kernels.size(); ++i) {
    if (&lir.kernels[i] != mul) continue;
    const std::string k = m.kernels[i].phases.at(0).text;
    EXPECT_EQ(k.find("rlx_vec<float, 4>*)(in0"), std::string::npos) << k;  // 12 bytes in: element by element
    EXPECT_NE(k.find("(rlx_vec<float, 4>*)(out0"), std::string::npos) << k;
  }
}

TEST(CudaVectorize, TheLayoutsAlignmentFacts) {
  EXPECT_EQ(offset_alignment(0), 256);
  EXPECT_EQ(offset_alignment(512), 256);
  EXPECT_EQ(offset_alignment(48), 16);
  EXPECT_EQ(offset_alignment(4), 4);
  EXPECT_EQ(offset_alignment(3), 1);
  Graph g("two");
  auto x = g.input("x", Shape{3});
  auto y = g.input("y", Shape{5});
  g.add_output(g.exp(x), "a");
  g.add_output(g.exp(y), "b");
  const auto lir = lir_of(g);
  const Layout l = lay_out(lir);
  ASSERT_EQ(l.input_at.size(), 2u);
  for (auto at : l.input_at) EXPECT_EQ(at % kArenaAlignment, 0u);
  const auto o = cuda_options(l, 16);
  ASSERT_EQ(o.buffer_alignment.size(), lir.buffers.size());
  for (auto a : o.buffer_alignment) EXPECT_GE(a, 4);
}

TEST(CudaVectorize, TheVectorCodeCompiles) {
  if (auto why = nvrtc_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  Graph g("mixed");
  auto x = g.input("x", Shape{64, 128});
  auto h = g.input("h", Shape{64, 128}, DType::BF16);
  auto c = g.input("c", Shape{64, 1});
  auto y = g.add(g.mul(x, g.cast(h, DType::F32)), c);
  g.add_output(g.cast(y, DType::BF16), "y");
  g.add_output(g.binary(ir::OpKind::Gt, y, g.scalar(0.0)), "positive");
  for (std::int64_t bytes : {16, 32}) {
    const auto m = emit(lir_of(g), bytes);
    EXPECT_NE(m.source.find("rlx_vec"), std::string::npos);
    EXPECT_GT(compile_for_arch(m.source, "compute_90"), 0u);
  }
  EXPECT_GT(compile_for_arch(emit(lir_of(chain(1003)), 16).source, "compute_90"), 0u);
}

// On a GPU: the vector phases against the reference, with tails, broadcasts and an unaligned view.
TEST(CudaVectorize, VectorPhasesMatchTheReferenceOnTheGpu) {
  if (auto why = unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  std::vector<Graph> graphs{chain(1003), chain(1 << 20), chain(3)};
  {
    Graph g("bias");
    auto x = g.input("x", Shape{64, 128});
    g.add_output(g.add(g.mul(x, g.input("b", Shape{128})), g.input("c", Shape{64, 1})), "y");
    graphs.push_back(std::move(g));
  }
  {
    Graph g("view");
    auto s = g.slice(g.exp(g.input("x", Shape{41, 3})), {0}, {1}, {41}, {1});
    g.add_output(g.mul(s, g.scalar(2.0)), "y");
    graphs.push_back(std::move(g));
  }
  {
    Graph g("half");
    auto h = g.input("h", Shape{33, 64}, DType::BF16);
    g.add_output(g.cast(g.exp(g.cast(h, DType::F32)), DType::BF16), "y");
    graphs.push_back(std::move(g));
  }
  std::mt19937_64 rng(testing::test_seed());
  Session session(runtime::Device::Cuda);
  for (const Graph& g : graphs) {
    SCOPED_TRACE(g.name());
    auto exe = session.compile(g);
    reference::TensorMap inputs;
    for (auto id : g.input_ids()) {
      const auto& n = g.node(id);
      inputs[n.attrs.get_str("name")] = testing::random_tensor(n.dtype, n.shape.extents(), rng, -1, 1);
    }
    auto got = exe.run(inputs);
    auto want = reference::run(g, inputs, {});
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t j = 0; j < got.size(); ++j)
      EXPECT_TRUE(testing::tensors_close(got[j], want[j], testing::tolerance_for(want[j].dtype())));
  }
}

}  // namespace
}  // namespace rlx::backends::cuda
