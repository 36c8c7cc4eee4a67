// ISA selection: every ISA this CPU supports computes the same elementwise
// programs and reductions (matching the reference and each other), and
// RLX_CPU_ISA overrides the choice or fails naming itself.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>

#include "conformance/harness.hpp"
#include "rlx/backends/cpu/cpu_backend.hpp"

namespace rlx::backends::cpu {
namespace {

using ir::DType;
using ir::Graph;
using ir::OpKind;

// Sets RLX_CPU_ISA for its lifetime, restoring the previous value.
class IsaEnv {
 public:
  explicit IsaEnv(const std::string& value) {
    if (const char* old = std::getenv("RLX_CPU_ISA")) old_ = old;
    ::setenv("RLX_CPU_ISA", value.c_str(), 1);
  }
  ~IsaEnv() {
    if (old_)
      ::setenv("RLX_CPU_ISA", old_->c_str(), 1);
    else
      ::unsetenv("RLX_CPU_ISA");
  }

 private:
  std::optional<std::string> old_;
};

Graph elementwise_program() {
  Graph g("isa elementwise");
  auto x = g.input("x", {37, 129});
  auto b = g.input("b", {129});
  auto h = g.input("h", {37, 1}, DType::F16);
  auto y = g.add(g.mul(x, g.scalar(0.75)), b);
  y = g.add(g.unary(OpKind::Gelu, y), g.unary(OpKind::Tanh, x));
  y = g.sub(y, g.cast(h, DType::F32));
  y = g.where(g.binary(OpKind::Gt, y, g.scalar(0.1)), g.unary(OpKind::Softplus, y), g.unary(OpKind::Sin, y));
  g.add_output(g.cast(y, DType::BF16));
  // mod is discontinuous: apply it to an input so ISA rounding cannot move a value across a step.
  g.add_output(g.binary(OpKind::Mod, x, g.scalar(0.7)));
  g.add_output(g.unary(OpKind::Silu, g.binary(OpKind::Pow, g.unary(OpKind::Abs, x), b)));
  return g;
}

Graph reduction() {
  Graph g("isa reduction");
  auto x = g.input("x", {16, 1000});
  g.add_output(g.sum(g.exp(x), {1}));
  g.add_output(g.reduce(OpKind::ReduceMax, x, {0}));
  g.add_output(g.argmin(x, 1));
  g.add_output(g.softmax(x, -1));
  g.add_output(g.layer_norm(x, std::nullopt, std::nullopt));
  return g;
}

std::vector<ir::Tensor> run_on(const std::string& isa, const Graph& g, const reference::TensorMap& inputs) {
  IsaEnv env(isa);
  EXPECT_EQ(selected_isa(), isa);
  Session s;
  return s.compile(g).run(inputs);
}

TEST(CpuIsa, GenericIsAlwaysAvailableAndLast) {
  auto isas = available_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.back(), "generic");
  if (!std::getenv("RLX_CPU_ISA")) {
    EXPECT_EQ(selected_isa(), isas.front());
  }
}

TEST(CpuIsa, EveryIsaMatchesTheReferenceAndTheOthers) {
  for (const Graph& g : {elementwise_program(), reduction()}) {
    std::mt19937_64 rng(testing::test_seed());
    reference::TensorMap inputs;
    for (auto id : g.input_ids()) {
      const auto& n = g.node(id);
      inputs[n.attrs.get_str("name")] = testing::random_tensor(n.dtype, n.shape.extents(), rng);
    }
    std::optional<std::vector<ir::Tensor>> first;
    for (const auto& isa : available_isas()) {
      SCOPED_TRACE(g.name() + " on " + isa);
      {
        IsaEnv env(isa);
        conformance::Check c;
        c.seed = testing::test_seed();
        c.label = g.name() + " " + isa;
        EXPECT_TRUE(conformance::matches_reference(runtime::Device::Cpu, g, c));
      }
      auto got = run_on(isa, g, inputs);
      if (!first) {
        first = got;
        continue;
      }
      for (std::size_t j = 0; j < got.size(); ++j) {
        // ISAs round transcendentals differently by ~1 ulp of f32, which can flip the last bit of a
        // narrower output dtype: allow that dtype's rounding, and 2e-6 for f32.
        auto tol =
            got[j].dtype() == DType::F32 ? testing::Tolerance{2e-6, 2e-6} : testing::tolerance_for(got[j].dtype());
        EXPECT_TRUE(testing::tensors_close(got[j], (*first)[j], tol))
            << "output " << j << " differs from " << available_isas().front();
      }
    }
  }
}

TEST(CpuIsa, OverrideIsValidated) {
  Graph g("tiny");
  g.add_output(g.exp(g.input("x", {4})));
  {
    IsaEnv env("sse9");
    try {
      Session().compile(g);
      FAIL() << "an invalid RLX_CPU_ISA must fail";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("RLX_CPU_ISA"), std::string::npos) << e.what();
    }
  }
  IsaEnv env("generic");
  EXPECT_EQ(selected_isa(), "generic");
  EXPECT_NO_THROW(Session().compile(g));
}

}  // namespace
}  // namespace rlx::backends::cpu
