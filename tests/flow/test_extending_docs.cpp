// Every code block of docs/extending.md lives here and runs: a block, a pass,
// a backend and the C codegen target. DocsStayInSync fails when a block in
// the page no longer appears (line by line, indentation aside) in this file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "rlx/backends/cuda/cuda_backend.hpp"
#include "rlx/codegen/c.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/compile/rewrite.hpp"
#include "rlx/flow/flow.hpp"
#include "rlx/ir/custom_op.hpp"
#include "rlx/models/demo_models.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/custom_kernels.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

using namespace rlx::flow;

namespace {

// ---- 1. a block -------------------------------------------------------------

struct GatedMlp : LayerStage {
  std::string gate, up, down;
  std::int64_t hidden;
  GatedMlp(std::string g, std::string u, std::string d, std::int64_t h)
      : gate(std::move(g)), up(std::move(u)), down(std::move(d)), hidden(h) {}

  std::string_view name() const override { return "gated_mlp"; }
  std::pair<FlowValue, StageArtifacts> emit_layer(FlowCtx& ctx, FlowValue x) const override {
    std::int64_t width = x.shape()[x.shape().rank() - 1].size;
    FlowValue g = ctx.silu(ctx.linear(x, gate, hidden));  // param "<gate>.weight" [width, hidden]
    FlowValue u = ctx.linear(x, up, hidden);
    FlowValue out = ctx.linear(ctx.mul(g, u), down, width);
    return {out, StageArtifacts::hidden_only(out.shape())};
  }
};

struct KvTap : LayerStage {
  std::string prefix;
  explicit KvTap(std::string p) : prefix(std::move(p)) {}

  std::string_view name() const override { return "kv_tap"; }
  std::pair<FlowValue, StageArtifacts> emit_layer(FlowCtx& ctx, FlowValue x) const override {
    std::int64_t width = x.shape()[x.shape().rank() - 1].size;
    FlowValue k = ctx.linear(ctx.rms_norm(x, prefix + ".norm"), prefix + ".k", width);
    ctx.publish_side_output(prefix + ".k_cache", k);  // appended after the primary output
    // Anything FlowCtx lacks: build on the raw graph, then wrap the node back.
    FlowValue y = ctx.value(ctx.hir().clamp(k.id(), -4.0, 4.0));
    FlowValue out = ctx.residual(x, y);
    return {out, StageArtifacts::hidden_only(out.shape())};
  }
};

rlx::reference::TensorMap random_values(const rlx::ir::Graph& g, rlx::ir::OpKind kind) {
  std::mt19937_64 rng(rlx::testing::test_seed());
  rlx::reference::TensorMap m;
  for (const auto& n : g.nodes())
    if (n.op == kind)
      m.emplace(n.attrs.get_str("name"), rlx::testing::random_tensor(n.dtype, n.shape.extents(), rng, -1, 1));
  return m;
}

TEST(ExtendingDocs, Block) {
  BuiltModel model = ModelFlow::create("my_model")
                         .input("x", {4, 16})
                         .layer_stage(GatedMlp("mlp.gate", "mlp.up", "mlp.down", 32))
                         .layer_stage(KvTap("layer0"))
                         .build();
  rlx::CompiledGraph compiled = rlx::Session().compile(model.graph);
  // model.output_names() == {"hidden", "layer0.k_cache"}

  EXPECT_EQ(model.output_names(), (std::vector<std::string>{"hidden", "layer0.k_cache"}));
  auto inputs = random_values(model.graph, rlx::ir::OpKind::Input);
  auto params = random_values(model.graph, rlx::ir::OpKind::Param);
  for (const auto& [name, t] : params) compiled.set_param(name, t);
  auto got = compiled.run(inputs);
  auto want = rlx::reference::run(model.graph, inputs, params);
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(rlx::testing::tensors_close(got[i], want[i]));
  // The block is ordinary ops, so it fuses like hand-built graphs do.
  bool fused = false;
  for (const auto& f : compiled.compile_result().fusion)
    fused |= std::count(f.ops.begin(), f.ops.end(), rlx::ir::OpKind::Silu) &&
             std::count(f.ops.begin(), f.ops.end(), rlx::ir::OpKind::Mul);
  EXPECT_TRUE(fused) << compiled.compile_result().summary();
}

// ---- 2. a pass ----------------------------------------------------------------

// relu is idempotent: relu(relu(x)) -> relu(x).
class DropDoubleRelu : public rlx::compile::Pass {
 public:
  std::string_view name() const override { return "drop_double_relu"; }
  rlx::ir::Graph run(const rlx::ir::Graph& g) const override {
    using rlx::ir::OpKind;
    return rlx::compile::rewrite(g, [](rlx::compile::Rewriter& r, const rlx::ir::Node& n) {
      std::optional<rlx::ir::NodeId> replacement;
      if (n.op == OpKind::Relu && r.src().node(n.inputs[0]).op == OpKind::Relu) replacement = r.map(n.inputs[0]);
      return replacement;
    });
  }
};

TEST(ExtendingDocs, Pass) {
  rlx::compile::register_ir_pass(std::make_shared<DropDoubleRelu>());

  rlx::ir::Graph g("relus");
  auto x = g.input("x", {8});
  g.add_output(g.relu(g.relu(g.exp(x))), "y");
  auto compiled = rlx::Session().compile(g);
  const auto& passes = compiled.compile_result().passes;
  auto it = std::find_if(passes.begin(), passes.end(), [](const auto& p) { return p.name == "drop_double_relu"; });
  ASSERT_NE(it, passes.end());
  EXPECT_EQ(it->nodes_before, it->nodes_after + 1);
  auto inputs = random_values(g, rlx::ir::OpKind::Input);
  EXPECT_TRUE(rlx::testing::tensors_close(compiled.run(inputs)[0], rlx::reference::run(g, inputs)[0]));
}

// ---- 3. a backend ---------------------------------------------------------------

// Runs on the CPU backend and counts what passes through; a real backend turns
// the LIR kernels into its own executable instead of delegating.
struct Counters {
  int compiles = 0, runs = 0;
};

class CountingExecutable : public rlx::runtime::ExecutableGraph {
 public:
  CountingExecutable(std::unique_ptr<rlx::runtime::ExecutableGraph> inner, Counters& counters)
      : inner_(std::move(inner)), counters_(counters) {}
  void set_param(std::size_t index, const void* data, std::size_t nbytes) override {
    inner_->set_param(index, data, nbytes);
  }
  void run(std::span<const void* const> inputs, std::span<void* const> outputs) override {
    ++counters_.runs;
    inner_->run(inputs, outputs);
  }
  std::unique_ptr<rlx::runtime::ExecutableGraph> clone() const override {
    return std::make_unique<CountingExecutable>(inner_->clone(), counters_);
  }

 private:
  std::unique_ptr<rlx::runtime::ExecutableGraph> inner_;
  Counters& counters_;
};

class CountingBackend : public rlx::runtime::Backend {
 public:
  explicit CountingBackend(Counters& counters) : counters_(counters) {}
  std::string_view name() const override { return "counting"; }
  rlx::compile::BackendTraits traits() const override {
    rlx::compile::BackendTraits t = cpu_->traits();  // claims what the CPU claims
    t.name = "counting";
    return t;
  }
  std::unique_ptr<rlx::runtime::ExecutableGraph> compile_lir(const rlx::compile::LirModule& lir,
                                                             const rlx::compile::CompileOptions& options) override {
    ++counters_.compiles;
    return std::make_unique<CountingExecutable>(cpu_->compile_lir(lir, options), counters_);
  }

 private:
  std::unique_ptr<rlx::runtime::Backend> cpu_ = rlx::runtime::make_backend(rlx::Device::Cpu);
  Counters& counters_;
};

TEST(ExtendingDocs, Backend) {
  static Counters counters;
  rlx::runtime::register_backend(rlx::Device::Tpu, [] { return std::make_unique<CountingBackend>(counters); });

  rlx::Session session(rlx::Device::Tpu);
  rlx::ir::Graph g = rlx::models::mlp({2, 8, 2});
  auto compiled = session.compile(g);
  EXPECT_EQ(session.backend().name(), "counting");
  EXPECT_EQ(compiled.compile_result().dispatch.backend, "counting");
  auto params = rlx::models::random_params(g, 1);
  auto inputs = rlx::models::random_inputs(g, 2);
  for (const auto& [name, t] : params) compiled.set_param(name, t);
  auto out = compiled.run(inputs);
  EXPECT_EQ(counters.compiles, 1);
  EXPECT_EQ(counters.runs, 1);
  EXPECT_TRUE(rlx::testing::tensors_close(out[0], rlx::reference::run(g, inputs, params)[0]));
}

// ---- 4. a codegen target --------------------------------------------------------

const char* kMain = R"(
#include <stdio.h>
#include "mlp.h"

int main(void) {
  float x[16] = {0}, y[16];
  int i;
  x[0] = 1.0f;
  mlp(x, y);
  for (i = 0; i < 16; ++i) printf("%.9g\n", y[i]);
  return 0;
}
)";

TEST(ExtendingDocs, CodegenTarget) {
  if (std::system("cc --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no C compiler (cc)";
  std::filesystem::path generated = std::filesystem::temp_directory_path() / ("rlx_docs_" + std::to_string(::getpid()));
  std::filesystem::create_directories(generated);
  std::ofstream(generated / "main.c") << kMain;

  rlx::ir::Graph g = rlx::models::mlp({1, 16, 2});
  rlx::codegen::c::Options options;
  options.params = rlx::codegen::c::ParamMode::Baked;
  options.param_values = rlx::models::random_params(g, 0);  // your trained weights
  rlx::codegen::c::Source src = rlx::codegen::c::emit(g, options);
  rlx::codegen::c::write(src, generated);  // mlp.h, mlp.c

  std::string dir = generated.string();
  std::string build = "cd '" + dir + "' && cc -std=c99 -O2 -c mlp.c && cc -std=c99 -O2 main.c mlp.o -lm -o mlp_demo";
  ASSERT_EQ(std::system(build.c_str()), 0);
  FILE* p = ::popen(("'" + dir + "/mlp_demo'").c_str(), "r");
  ASSERT_NE(p, nullptr);
  rlx::ir::Tensor got(rlx::ir::DType::F32, {1, 16});
  float v;
  for (std::int64_t i = 0; i < 16 && std::fscanf(p, "%f", &v) == 1; ++i) got.set(i, v);
  ASSERT_EQ(::pclose(p), 0);
  rlx::ir::Tensor x(rlx::ir::DType::F32, {1, 16});
  x.set(0, 1.0);
  auto want = rlx::reference::run(g, {{"x", x}}, options.param_values);
  EXPECT_TRUE(rlx::testing::tensors_close(got, want[0]));
  std::filesystem::remove_all(generated);
}

// ---- the page and this file agree ------------------------------------------------

std::vector<std::string> trimmed_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    auto b = line.find_first_not_of(" \t");
    out.push_back(b == std::string::npos ? "" : line.substr(b, line.find_last_not_of(" \t") - b + 1));
  }
  return out;
}

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(ExtendingDocs, DocsStayInSync) {
  std::string page = read(RLX_SOURCE_DIR "/docs/extending.md");
  ASSERT_FALSE(page.empty());
  auto source = trimmed_lines(read(RLX_SOURCE_DIR "/tests/flow/test_extending_docs.cpp"));
  int blocks = 0;
  for (std::string fence : {"```cpp\n", "```c\n"}) {
    for (std::size_t at = page.find(fence); at != std::string::npos; at = page.find(fence, at)) {
      at += fence.size();
      std::size_t end = page.find("```", at);
      auto block = trimmed_lines(page.substr(at, end - at));
      ++blocks;
      EXPECT_NE(std::search(source.begin(), source.end(), block.begin(), block.end()), source.end())
          << "this block of docs/extending.md is not in tests/flow/test_extending_docs.cpp:\n"
          << page.substr(at, end - at);
      at = end + 3;
    }
  }
  EXPECT_GE(blocks, 7);
}

}  // namespace

// ---- docs/extending.md §2: a custom op ----
namespace docs_custom_op {
namespace ir = rlx::ir;
class ScaledSilu final : public rlx::ir::OpExtension {
 public:
  std::string_view name() const override { return "scaled_silu"; }
  int num_inputs() const override { return 1; }
  std::vector<ir::AttrSpec> attr_schema() const override { return {{"alpha", ir::AttrType::Float, true}}; }
  ir::TypeInfo infer(std::span<const ir::TypeInfo> in, const ir::Attrs&) const override { return in[0]; }
  // Optional: decompose into primitives. With it the op fuses and runs on every backend.
  std::optional<ir::NodeId> lower(ir::Graph& g, std::span<const ir::NodeId> in, const ir::Attrs& a) const override {
    auto alpha = g.scalar(a.get_float("alpha"), g.node(in[0]).dtype);
    return g.mul(in[0], g.unary(ir::OpKind::Sigmoid, g.mul(in[0], alpha)));
  }
};

TEST(ExtendingDocs, CustomOp) {
  ir::Graph g("docs_custom_op");
  auto x = g.input("x", {4});
  std::string error;
  rlx::ir::register_op(std::make_shared<ScaledSilu>());        // register_op_strict throws on a name clash
  auto y = g.custom_op("scaled_silu", {{"alpha", 1.5}}, {x});  // rlx::Error for an unknown name or bad inputs
  auto z = g.try_custom_op("scaled_silu", {{"alpha", 1.5}}, {x}, &error);  // std::optional, message in `error`
  ASSERT_TRUE(z.has_value()) << error;
  g.add_output(y);
  g.add_output(*z);
  auto compiled = rlx::Session().compile(g);
  EXPECT_EQ(compiled.compile_result().lir.kernels.size(), 1u);  // the two lowered copies fuse into one kernel
}

// The raw CUDA kernel of the page: registered, routed, and compiled by NVRTC where it is installed (no GPU needed).
TEST(ExtendingDocs, RawCudaKernel) {
  rlx::ir::register_op(std::make_shared<ScaledSilu>());
  // clang-format off
rlx::runtime::register_cuda_kernel("scaled_silu", {.source = R"(
extern "C" __global__ void scaled_silu(float* arena, unsigned long long in0, unsigned long long in1,
                                       unsigned long long in2, unsigned long long in3,
                                       unsigned long long out, unsigned long long n) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    const float x = arena[in0 + i];
    arena[out + i] = x / (1.0f + __expf(-1.5f * x));  // alpha = 1.5 baked in
  }
})", .entry = "scaled_silu"});
  // clang-format on
  EXPECT_EQ(rlx::runtime::custom_op_route("scaled_silu", rlx::runtime::Device::Cuda),
            rlx::runtime::CustomRoute::RawGpuKernel);
  if (auto why = rlx::backends::cuda::nvrtc_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  EXPECT_NE(rlx::backends::cuda::compile_custom_kernel("scaled_silu", "compute_90").find(".entry scaled_silu"),
            std::string::npos);
}
}  // namespace docs_custom_op
