// A user pass that emits a custom op (or a composite) still gets it lowered
// (seed extending.md §2b): user passes run after the built-in passes, so the
// pipeline inlines and decomposes again when one leaves such nodes behind.
// This binary registers its pass globally; it acts on one graph name only.
#include <gtest/gtest.h>

#include "rlx/compile/pipeline.hpp"
#include "rlx/compile/rewrite.hpp"
#include "rlx/ir/custom_op.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/test_ops.hpp"
#include "support/testing.hpp"

namespace rlx {
namespace {

// Rewrites relu(x) into softmax(test_scaled_silu(x) {alpha=1.5}): a custom op and a composite, in
// graphs named "rewritten".
class EmitCustomAndComposite final : public compile::Pass {
 public:
  std::string_view name() const override { return "emit_custom_and_composite"; }
  ir::Graph run(const ir::Graph& g) const override {
    if (g.name() != "rewritten") return g;
    return compile::rewrite(g, [](compile::Rewriter& r, const ir::Node& n) -> std::optional<ir::NodeId> {
      if (n.op != ir::OpKind::Relu) return std::nullopt;
      auto ins = r.mapped_inputs(n);
      auto silu = r.out().custom_op("test_scaled_silu", {{"alpha", 1.5}}, {ins[0]});
      return r.out().softmax(silu, -1);
    });
  }
};

TEST(UserPass, EmittedCustomOpsAndCompositesAreLowered) {
  testing::register_test_ops();
  compile::register_ir_pass(std::make_shared<EmitCustomAndComposite>());
  ir::Graph g("rewritten");
  auto x = g.input("x", {3, 5});
  g.add_output(g.relu(x), "y");

  // What the pass makes of it, run by the reference: the expected values.
  ir::Graph want_graph("want");
  {
    auto wx = want_graph.input("x", {3, 5});
    want_graph.add_output(want_graph.softmax(want_graph.custom_op("test_scaled_silu", {{"alpha", 1.5}}, {wx}), -1));
  }
  std::mt19937_64 rng(testing::test_seed());
  auto input = testing::random_tensor(ir::DType::F32, {3, 5}, rng);
  auto want = reference::run(want_graph, {{"x", input}}, {});

  for (Device d : {Device::Cpu, Device::Vulkan}) {
    try {
      runtime::make_backend(d);
    } catch (const Error&) {
      continue;  // Vulkan may be unavailable here; the CPU always runs
    }
    auto c = Session(d).compile(g);
    const auto& mir = c.compile_result().mir;
    for (const auto& n : mir.nodes()) EXPECT_NE(n.op, ir::OpKind::Custom) << "a custom op was left for the backend";
    auto got = c.run({{"x", input}});
    EXPECT_TRUE(testing::tensors_close(got[0], want[0])) << "device " << int(d);
  }
}

}  // namespace
}  // namespace rlx
