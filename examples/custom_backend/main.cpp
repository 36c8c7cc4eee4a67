// A custom backend, registered on an existing Device value from outside RLX.
// "tracing" claims what the CPU backend claims, prints the LIR it receives and
// counts runs, then delegates the work to the CPU backend. A real backend
// turns each LIR kernel (a small MIR body over arena buffers) into its own
// code in compile_lir instead of delegating.
//
//   build/examples/custom_backend/custom_backend   # exits non-zero on a mismatch
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <rlx/extend.hpp>

using namespace rlx::extend;

namespace {

struct Trace {
  int compiles = 0, runs = 0;
};

class TracingExecutable final : public ExecutableGraph {
 public:
  TracingExecutable(std::unique_ptr<ExecutableGraph> inner, std::shared_ptr<Trace> trace)
      : inner_(std::move(inner)), trace_(std::move(trace)) {}
  void set_param(std::size_t index, const void* data, std::size_t nbytes) override {
    inner_->set_param(index, data, nbytes);
  }
  // No printing here: run must not allocate, and a counter is enough to trace.
  void run(std::span<const void* const> inputs, std::span<void* const> outputs) override {
    ++trace_->runs;
    inner_->run(inputs, outputs);
  }
  std::unique_ptr<ExecutableGraph> clone() const override {
    return std::make_unique<TracingExecutable>(inner_->clone(), trace_);
  }

 private:
  std::unique_ptr<ExecutableGraph> inner_;
  std::shared_ptr<Trace> trace_;
};

class TracingBackend final : public Backend {
 public:
  explicit TracingBackend(std::shared_ptr<Trace> trace) : trace_(std::move(trace)) {}
  std::string_view name() const override { return "tracing"; }
  BackendTraits traits() const override {
    BackendTraits t = cpu_->traits();  // the shared pipeline legalizes and fuses against these
    t.name = "tracing";
    return t;
  }
  std::unique_ptr<ExecutableGraph> compile_lir(const LirModule& lir, const CompileOptions& options) override {
    ++trace_->compiles;
    std::printf("tracing: compile '%s': %zu kernels, arena %lld bytes (%lld without reuse)\n", lir.name.c_str(),
                lir.kernels.size(), static_cast<long long>(lir.memory.arena_bytes),
                static_cast<long long>(lir.memory.naive_bytes));
    for (const auto& k : lir.kernels)
      std::printf("  %-10s %s\n", std::string(rlx::compile::kernel_kind_name(k.kind)).c_str(), k.name.c_str());
    return std::make_unique<TracingExecutable>(cpu_->compile_lir(lir, options), trace_);
  }

 private:
  std::unique_ptr<Backend> cpu_ = rlx::backends::cpu::make_cpu_backend();
  std::shared_ptr<Trace> trace_;
};

Tensor random_tensor(std::vector<std::int64_t> shape, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  Tensor t(DType::F32, std::move(shape));
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
  return t;
}

bool close(const Tensor& got, const Tensor& want) {
  for (std::int64_t i = 0; i < want.numel(); ++i)
    if (!(std::fabs(got.get(i) - want.get(i)) <= 1e-4 + 1e-4 * std::fabs(want.get(i)))) return false;
  return got.numel() == want.numel();
}

}  // namespace

int main() try {
  auto trace = std::make_shared<Trace>();
  // Device is closed: a new backend binds to an existing value (Tpu has no built-in one).
  register_backend(Device::Tpu, [trace] { return std::make_unique<TracingBackend>(trace); });

  Graph g("tiny_mlp");
  auto x = g.input("x", {4, 16});
  auto h = g.unary(OpKind::Gelu, g.linear(x, g.param("w0", {16, 32}), g.param("b0", {32})));
  g.add_output(g.softmax(g.linear(h, g.param("w1", {32, 8}), g.param("b1", {8})), -1), "y");

  Session session(Device::Tpu);
  CompiledGraph compiled = session.compile(g);
  std::mt19937 rng(7);
  rlx::reference::TensorMap params{{"w0", random_tensor({16, 32}, rng)},
                                   {"b0", random_tensor({32}, rng)},
                                   {"w1", random_tensor({32, 8}, rng)},
                                   {"b1", random_tensor({8}, rng)}};
  for (const auto& [name, value] : params) compiled.set_param(name, value);

  bool ok = session.backend().name() == "tracing";
  CompiledGraph twin = compiled.clone();  // shares the weights, counts into the same trace
  for (int i = 0; i < 3; ++i) {
    rlx::reference::TensorMap inputs{{"x", random_tensor({4, 16}, rng)}};
    Tensor want = rlx::reference::run(g, inputs, params)[0];
    bool match = close(compiled.run(inputs)[0], want) && close(twin.run(inputs)[0], want);
    std::printf("run %d: %s\n", i, match ? "matches the reference" : "MISMATCH");
    ok = ok && match;
  }
  std::printf("tracing: %d compile(s), %d run(s)\n", trace->compiles, trace->runs);
  ok = ok && trace->compiles == 1 && trace->runs == 6;
  std::puts(ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
} catch (const rlx::Error& e) {
  std::fprintf(stderr, "custom_backend: %s\n", e.what());
  return 1;
}
