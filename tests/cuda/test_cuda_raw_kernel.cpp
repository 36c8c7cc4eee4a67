// The CUDA backend's raw kernel seam (runtime::register_cuda_kernel, raw_kernel.hpp): a custom op's CUDA C, with
// the fixed signature (the arena as floats, the inputs' and the output's offsets in 4-byte words, the output's
// element count), compiled by NVRTC and launched against the arena. Without a GPU: the launch planned from the
// LIR, NVRTC compiling the registered source (and its log, naming the op, for source that does not compile), and
// what the signature cannot carry. On a GPU: the kernels run against the reference (operands from the arena and
// from the weights, results feeding other kernels), ahead of a host kernel of the same name.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>

#include "backends/cuda/raw_kernel.hpp"
#include "conformance/harness.hpp"
#include "rlx/backends/cuda/cuda_backend.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/ir/custom_op.hpp"
#include "rlx/runtime/custom_kernels.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

namespace rlx::backends::cuda {
namespace {

using ir::Graph;
using ir::Shape;

// y = 2 x (cuda_test_twice) and y = a - b (cuda_test_sub); their references are the op table's answer.
struct Twice final : public ir::OpExtension {
  std::string_view name() const override { return "cuda_test_twice"; }
  int num_inputs() const override { return 1; }
  ir::TypeInfo infer(std::span<const ir::TypeInfo> in, const ir::Attrs&) const override { return in[0]; }
  std::optional<ir::Tensor> reference(std::span<const ir::Tensor> in, const ir::Attrs&,
                                      const ir::TypeInfo&) const override {
    ir::Tensor out = in[0];
    for (std::int64_t i = 0; i < out.numel(); ++i) out.set(i, 2 * in[0].get(i));
    return out;
  }
};
struct Sub final : public ir::OpExtension {
  std::string_view name() const override { return "cuda_test_sub"; }
  int num_inputs() const override { return 2; }
  ir::TypeInfo infer(std::span<const ir::TypeInfo> in, const ir::Attrs&) const override { return in[0]; }
  std::optional<ir::Tensor> reference(std::span<const ir::Tensor> in, const ir::Attrs&,
                                      const ir::TypeInfo&) const override {
    ir::Tensor out = in[0];
    for (std::int64_t i = 0; i < out.numel(); ++i) out.set(i, in[0].get(i) - in[1].get(i));
    return out;
  }
};
// Five inputs: one more than the signature carries.
struct Five final : public ir::OpExtension {
  std::string_view name() const override { return "cuda_test_five"; }
  int num_inputs() const override { return 5; }
  ir::TypeInfo infer(std::span<const ir::TypeInfo> in, const ir::Attrs&) const override { return in[0]; }
};
struct Broken final : public ir::OpExtension {
  std::string_view name() const override { return "cuda_test_broken"; }
  int num_inputs() const override { return 1; }
  ir::TypeInfo infer(std::span<const ir::TypeInfo> in, const ir::Attrs&) const override { return in[0]; }
};

constexpr const char* kSignature =
    "(float* arena, unsigned long long in0, unsigned long long in1, unsigned long long in2, unsigned long long in3, "
    "unsigned long long out, unsigned long long n)";

// A grid-stride loop: correct under the default grid (a thread per element) and under a fixed small one.
const std::string kTwice = std::string("extern \"C\" __global__ void twice") + kSignature + R"( {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    arena[out + i] = 2.0f * arena[in0 + i];
}
)";
const std::string kSub = std::string("extern \"C\" __global__ void sub") + kSignature + R"( {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i < n) arena[out + i] = arena[in0 + i] - arena[in1 + i];
}
)";

void register_ops() {
  static const bool done = [] {
    ir::register_op(std::make_shared<Twice>());
    ir::register_op(std::make_shared<Sub>());
    ir::register_op(std::make_shared<Five>());
    ir::register_op(std::make_shared<Broken>());
    runtime::register_cuda_kernel("cuda_test_twice", {.source = kTwice, .entry = "twice", .block = 64, .grid = 2});
    runtime::register_cuda_kernel("cuda_test_sub", {.source = kSub, .entry = "sub", .block = 128});
    runtime::register_cuda_kernel("cuda_test_five", {.source = kTwice, .entry = "twice"});
    runtime::register_cuda_kernel("cuda_test_broken", {.source = std::string("extern \"C\" __global__ void broken") +
                                                                 kSignature + " { undeclared_thing = 1; }\n",
                                                       .entry = "broken"});
    // A host kernel of the same name computes 3 x: the raw kernel's 2 x must win on the GPU.
    runtime::register_host_kernel(
        "cuda_test_twice", [](std::span<const ir::TensorView> in, const ir::MutableTensorView& out, const ir::Attrs&) {
          const auto* x = static_cast<const float*>(in[0].data);
          auto* y = static_cast<float*>(out.data);
          for (std::size_t i = 0; i < out.nbytes / sizeof(float); ++i) y[i] = 3 * x[i];
        });
    return true;
  }();
  (void)done;
}

// Operands from the arena (x + 1, an input) and from the weights (w, a param), results feeding other kernels.
Graph seam_graph() {
  Graph g("raw kernels");
  auto x = g.input("x", Shape{5, 41});
  auto w = g.param("w", Shape{5, 41});
  g.add_output(g.mul(g.custom_op("cuda_test_twice", {}, {g.add(x, g.scalar(1))}), g.scalar(3)), "a");
  g.add_output(g.add(g.custom_op("cuda_test_sub", {}, {w, x}), x), "b");
  g.add_output(g.custom_op("cuda_test_twice", {}, {w}), "c");
  return g;
}

TEST(CudaRawKernel, TheRegisteredKernelsAreTheTraitsAndTheRoute) {
  register_ops();
  const auto t = traits();
  for (const char* op : {"cuda_test_twice", "cuda_test_sub"}) {
    EXPECT_TRUE(t.custom_kernels.contains(op)) << op;
    EXPECT_EQ(runtime::custom_op_route(op, runtime::Device::Cuda), runtime::CustomRoute::RawGpuKernel) << op;
  }
}

TEST(CudaRawKernel, EachCustomOpIsALaunchOfItsSignature) {
  register_ops();
  const auto lir = compile::compile(seam_graph(), traits(), {}).lir;
  int raws = 0;
  for (const auto& k : lir.kernels) {
    auto raw = plan_raw_kernel(lir, k);
    if (!raw) continue;
    ++raws;
    EXPECT_EQ(raw->n, 5 * 41);
    EXPECT_NE(raw->label.find("custom op '" + raw->op + "'"), std::string::npos) << raw->label;
    if (raw->op == "cuda_test_twice") {
      EXPECT_EQ(raw->inputs.size(), 1u);
      EXPECT_EQ(raw->block, 64u);
      EXPECT_EQ(raw->grid, 2u);  // the registration's
    } else {
      EXPECT_EQ(raw->op, "cuda_test_sub");
      EXPECT_EQ(raw->inputs.size(), 2u);
      EXPECT_EQ(raw->block, 128u);
      EXPECT_EQ(raw->grid, (5u * 41u + 127u) / 128u);  // a thread per output element
    }
  }
  EXPECT_EQ(raws, 3);
}

TEST(CudaRawKernel, MoreInputsThanTheSignatureCarriesIsAnErrorNamingTheOp) {
  register_ops();
  Graph g("five");
  std::vector<ir::NodeId> in;
  for (int i = 0; i < 5; ++i) in.push_back(g.input("x" + std::to_string(i), Shape{4}));
  g.add_output(g.custom_op("cuda_test_five", {}, in));
  const auto lir = compile::compile(g, traits(), {}).lir;
  for (const auto& k : lir.kernels)
    if (k.kind == compile::KernelKind::Native)
      testing::expect_error([&] { plan_raw_kernel(lir, k); }, {"cuda_test_five", "5 inputs", "at most 4"});
}

TEST(CudaRawKernel, NvrtcCompilesTheRegisteredSource) {
  if (auto why = nvrtc_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  register_ops();
  const std::string ptx = compile_custom_kernel("cuda_test_twice", "compute_90");
  EXPECT_NE(ptx.find(".entry twice"), std::string::npos) << ptx;
  EXPECT_GT(compile_custom_kernel("cuda_test_sub", "sm_90").size(), 0u);
}

TEST(CudaRawKernel, SourceThatDoesNotCompileIsAnErrorWithNvrtcsLogAndTheOp) {
  if (auto why = nvrtc_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  register_ops();
  testing::expect_error([] { compile_custom_kernel("cuda_test_broken", "compute_90"); },
                        {"custom op 'cuda_test_broken'", "undeclared_thing", "NVRTC"});
  testing::expect_error([] { compile_custom_kernel("cuda_test_nothing", "compute_90"); },
                        {"cuda_test_nothing", "no raw CUDA kernel"});
}

TEST(CudaRawKernel, RunsAgainstTheArenaAheadOfTheHostKernel) {
  if (auto why = unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  register_ops();
  conformance::Check check;
  check.seed = testing::test_seed();
  check.label = "raw kernels";
  EXPECT_TRUE(conformance::matches_reference(runtime::Device::Cuda, seam_graph(), check));
  // Every kernel on the device: the host kernel of cuda_test_twice is not used.
  runtime::Session session(runtime::Device::Cuda);
  auto exe = session.compile(seam_graph());
  std::mt19937_64 rng(testing::test_seed());
  exe.set_param("w", testing::random_tensor(ir::DType::F32, {5, 41}, rng));
  exe.set_profiling(true);
  exe.run(reference::TensorMap{{"x", testing::random_tensor(ir::DType::F32, {5, 41}, rng)}});
  for (const auto& k : exe.kernel_times()) EXPECT_FALSE(k.host) << k.kernel;
}

TEST(CudaRawKernel, ACompileErrorOnTheGpuNamesTheOpAndQuotesNvrtc) {
  if (auto why = unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  register_ops();
  Graph g("broken");
  g.add_output(g.custom_op("cuda_test_broken", {}, {g.input("x", Shape{4})}));
  testing::expect_error([&] { runtime::Session(runtime::Device::Cuda).compile(g); },
                        {"cuda_test_broken", "undeclared_thing"});
}

}  // namespace
}  // namespace rlx::backends::cuda
