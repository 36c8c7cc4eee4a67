// An outside project: it sees only the installed headers and rlx::rlx, and
// adds one of each extension: a block, an op through each execution route,
// a pass and a backend. Exits non-zero when any check fails.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <rlx/extend.hpp>

using namespace rlx::extend;

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  std::printf("%-58s %s\n", what, ok ? "ok" : "FAILED");
  failures += ok ? 0 : 1;
}

Tensor random_tensor(DType dtype, const std::vector<std::int64_t>& shape, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  Tensor t(dtype, shape);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
  return t;
}

rlx::reference::TensorMap random_leaves(const Graph& g, OpKind kind, std::mt19937& rng) {
  rlx::reference::TensorMap m;
  for (const Node& n : g.nodes())
    if (n.op == kind) m.emplace(n.attrs.get_str("name"), random_tensor(n.dtype, n.shape.extents(), rng));
  return m;
}

// Compiles `g` for `device`, runs it with random inputs and params, and
// compares every output with the float64 reference.
bool matches_reference(const Graph& g, Device device = Device::Cpu) {
  std::mt19937 rng(11);
  auto inputs = random_leaves(g, OpKind::Input, rng), params = random_leaves(g, OpKind::Param, rng);
  CompiledGraph compiled = Session(device).compile(g);
  for (const auto& [name, value] : params) compiled.set_param(name, value);
  auto got = compiled.run(inputs);
  auto want = rlx::reference::run(g, inputs, params);
  if (got.size() != want.size()) return false;
  for (std::size_t o = 0; o < got.size(); ++o)
    for (std::int64_t i = 0; i < want[o].numel(); ++i)
      if (!(std::fabs(got[o].get(i) - want[o].get(i)) <= 1e-4 * std::max(1.0, std::fabs(want[o].get(i))))) return false;
  return true;
}

// ---- a block ------------------------------------------------------------------

struct SwiGlu : LayerStage {
  std::string prefix;
  std::int64_t hidden;
  SwiGlu(std::string p, std::int64_t h) : prefix(std::move(p)), hidden(h) {}
  std::string_view name() const override { return "swiglu"; }
  std::pair<FlowValue, StageArtifacts> emit_layer(FlowCtx& ctx, FlowValue x) const override {
    std::int64_t width = x.shape()[x.shape().rank() - 1].size;
    FlowValue n = ctx.rms_norm(x, prefix + ".norm");
    FlowValue h = ctx.mul(ctx.silu(ctx.linear(n, prefix + ".gate", hidden)), ctx.linear(n, prefix + ".up", hidden));
    FlowValue out = ctx.residual(x, ctx.linear(h, prefix + ".down", width));
    ctx.publish_side_output(prefix + ".tap", n);
    return {out, StageArtifacts::hidden_only(out.shape())};
  }
};

BuiltModel block_model() {
  return ModelFlow::create("ds_model")
      .input("x", {3, 8})
      .layer_stage(SwiGlu("l0", 16))
      .layer_stage(SwiGlu("l1", 16))
      .build();
}

// ---- ops, one per route -----------------------------------------------------------

struct UnaryFloatOp : OpExtension {
  int num_inputs() const override { return 1; }
  TypeInfo infer(std::span<const TypeInfo> in, const Attrs&) const override {
    if (in[0].dtype != DType::F32) throw Error(std::string(name()) + " needs f32");
    return in[0];
  }
};

// Route 1, lowering: x / (1 + |x|) from primitives; it fuses and runs everywhere.
struct Softsign final : UnaryFloatOp {
  std::string_view name() const override { return "ds_softsign"; }
  std::optional<NodeId> lower(Graph& g, std::span<const NodeId> in, const Attrs&) const override {
    return g.div(in[0], g.add(g.scalar(1.0), g.unary(OpKind::Abs, in[0])));
  }
};

// Route 2, a host kernel: x^3 in plain C++, with a reference for the interpreter.
struct Cube final : UnaryFloatOp {
  std::string_view name() const override { return "ds_cube"; }
  std::optional<Tensor> reference(std::span<const Tensor> in, const Attrs&, const TypeInfo&) const override {
    Tensor out = in[0];
    for (std::int64_t i = 0; i < out.numel(); ++i) out.set(i, std::pow(in[0].get(i), 3));
    return out;
  }
};

// Route 3, a raw GPU kernel: 2x as a Vulkan compute shader, and a lowering
// for devices without the kernel.
struct Twice final : UnaryFloatOp {
  std::string_view name() const override { return "ds_twice"; }
  std::optional<NodeId> lower(Graph& g, std::span<const NodeId> in, const Attrs&) const override {
    return g.add(in[0], in[0]);
  }
};

constexpr const char* kTwiceGlsl = R"(#version 450
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Arena { float arena[]; };
layout(std430, binding = 1) readonly buffer Offsets { uint offsets[]; };  // x, then the output
void main() {
  uint i = gl_GlobalInvocationID.x;
  arena[offsets[1] + i] = 2.0 * arena[offsets[0] + i];
}
)";

void register_ops() {
  register_op(std::make_shared<Softsign>());
  register_op(std::make_shared<Cube>());
  register_cpu_kernel("ds_cube", [](std::span<const TensorView> in, const MutableTensorView& out, const Attrs&) {
    const auto* x = static_cast<const float*>(in[0].data);
    auto* y = static_cast<float*>(out.data);
    for (std::size_t i = 0; i < in[0].nbytes / sizeof(float); ++i) y[i] = x[i] * x[i] * x[i];
  });
  register_op_strict(std::make_shared<Twice>());
  VulkanKernel twice;
  twice.glsl = kTwiceGlsl;
  register_vulkan_kernel("ds_twice", twice);
}

// ---- a pass ------------------------------------------------------------------------

// tanh(x) -> 2 sigmoid(2x) - 1, as a backend without a tanh kernel might want.
struct TanhViaSigmoid final : Pass {
  std::string_view name() const override { return "ds_tanh_via_sigmoid"; }
  Graph run(const Graph& g) const override {
    return rewrite(g, [](Rewriter& r, const Node& n) -> std::optional<NodeId> {
      if (n.op != OpKind::Tanh) return std::nullopt;
      Graph& out = r.out();
      NodeId two = out.scalar(2.0, n.dtype);
      NodeId s = out.unary(OpKind::Sigmoid, out.mul(r.map(n.inputs[0]), two));
      return out.sub(out.mul(s, two), out.scalar(1.0, n.dtype));
    });
  }
};

// ---- a backend -----------------------------------------------------------------------

struct Counts {
  int compiles = 0, runs = 0;
};

class CountingExecutable final : public ExecutableGraph {
 public:
  CountingExecutable(std::unique_ptr<ExecutableGraph> inner, Counts& counts)
      : inner_(std::move(inner)), counts_(counts) {}
  void set_param(std::size_t index, const void* data, std::size_t nbytes) override {
    inner_->set_param(index, data, nbytes);
  }
  void run(std::span<const void* const> inputs, std::span<void* const> outputs) override {
    ++counts_.runs;
    inner_->run(inputs, outputs);
  }
  std::unique_ptr<ExecutableGraph> clone() const override {
    return std::make_unique<CountingExecutable>(inner_->clone(), counts_);
  }

 private:
  std::unique_ptr<ExecutableGraph> inner_;
  Counts& counts_;
};

class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(Counts& counts) : counts_(counts) {}
  std::string_view name() const override { return "ds_counting"; }
  BackendTraits traits() const override {
    BackendTraits t = cpu_->traits();
    t.name = "ds_counting";
    return t;
  }
  std::unique_ptr<ExecutableGraph> compile_lir(const LirModule& lir, const CompileOptions& options) override {
    ++counts_.compiles;
    return std::make_unique<CountingExecutable>(cpu_->compile_lir(lir, options), counts_);
  }

 private:
  std::unique_ptr<Backend> cpu_ = make_backend(Device::Cpu);
  Counts& counts_;
};

template <class F>
bool throws_error_with(F&& f, std::string_view text) {
  try {
    f();
  } catch (const Error& e) {
    return std::string_view(e.what()).find(text) != std::string_view::npos;
  }
  return false;
}

}  // namespace

int main() try {
  // Block.
  BuiltModel model = block_model();
  check(model.output_names() == std::vector<std::string>{"hidden", "l0.tap", "l1.tap"}, "block: outputs named");
  check(matches_reference(model.graph), "block: runs on the CPU, matches the reference");

  // Ops.
  register_ops();
  check(is_op_registered("ds_softsign") && !is_op_registered("ds_nope"), "ops: registered");
  check(throws_error_with([] { register_op_strict(std::make_shared<Twice>()); }, "already registered"),
        "ops: register_op_strict refuses a clash");
  check(throws_error_with([] { Graph().custom_op("ds_nope", {}, {}); }, "ds_nope"), "ops: an unknown name throws");

  Graph lowered("ds_lowered");
  NodeId x = lowered.input("x", {4, 8});
  lowered.add_output(lowered.relu(lowered.custom_op("ds_softsign", {}, {lowered.mul(x, x)})), "y");
  check(custom_op_route("ds_softsign", Device::Cpu) == CustomRoute::Lowering, "lower: the route on the CPU");
  check(matches_reference(lowered), "lower: matches the reference");
  auto fusion = Session().compile(lowered).compile_result().fusion;
  check(fusion.size() == 1 && fusion[0].origins == std::vector<std::string>{"custom:ds_softsign"},
        "lower: fuses with mul and relu into one kernel");

  Graph host("ds_host");
  NodeId h = host.input("x", {5, 3});
  host.add_output(host.custom_op("ds_cube", {}, {host.add(h, h)}), "y");
  check(custom_op_route("ds_cube", Device::Cpu) == CustomRoute::HostKernel, "host kernel: the route on the CPU");
  check(matches_reference(host), "host kernel: matches the reference");

  Graph gpu("ds_gpu");
  gpu.add_output(gpu.custom_op("ds_twice", {}, {gpu.input("x", {6})}), "y");
  check(custom_op_route("ds_twice", Device::Vulkan) == CustomRoute::RawGpuKernel,
        "raw GPU kernel: the route on Vulkan");
  check(custom_op_route("ds_twice", Device::Cpu) == CustomRoute::Lowering, "raw GPU kernel: lowered on the CPU");
  check(matches_reference(gpu), "raw GPU kernel: the CPU fallback matches the reference");

  // Pass.
  register_ir_pass(std::make_shared<TanhViaSigmoid>());
  Graph tanhs("ds_tanh");
  tanhs.add_output(tanhs.unary(OpKind::Tanh, tanhs.exp(tanhs.input("x", {7}))), "y");
  auto result = Session().compile(tanhs).compile_result();
  bool ran = std::any_of(result.passes.begin(), result.passes.end(),
                         [](const auto& p) { return p.name == "ds_tanh_via_sigmoid"; });
  bool tanh_left = std::any_of(result.mir.nodes().begin(), result.mir.nodes().end(),
                               [](const Node& n) { return n.op == OpKind::Tanh; });
  check(ran && !tanh_left, "pass: runs and rewrites tanh");
  check(matches_reference(tanhs), "pass: matches the reference");

  // Backend.
  static Counts counts;
  register_backend(Device::Tpu, [] { return std::make_unique<CountingBackend>(counts); });
  check(Session(Device::Tpu).backend().name() == "ds_counting", "backend: Session(Tpu) uses it");
  check(matches_reference(model.graph, Device::Tpu), "backend: the block on it matches the reference");
  check(matches_reference(host, Device::Tpu), "backend: a host-kernel op on it matches the reference");
  check(counts.compiles == 2 && counts.runs == 2, "backend: counted 2 compiles and 2 runs");

  std::printf("%s\n", failures ? "FAILED" : "all ok");
  return failures ? 1 : 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "downstream: unexpected error: %s\n", e.what());
  return 1;
}
