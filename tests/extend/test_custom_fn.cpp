// custom_fn: a body with user-given derivative bodies; autodiff must use them.
#include <gtest/gtest.h>

#include "rlx/autodiff/autodiff.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/custom_op.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

using namespace rlx;
using ir::DType;

namespace {
// square(x) = x * x, with a VJP body that returns 3 * x * ct on purpose (not
// the true 2 * x * ct) so the test can tell the given rule was used, and a
// JVP body that returns 5 * x * t.
ir::CustomFn square_fn() {
  ir::CustomFn fn;
  fn.name = "test_square_fn";
  fn.body = ir::Graph("square");
  auto x = fn.body.input("x", {3});
  fn.body.add_output(fn.body.mul(x, x));
  ir::Graph vjp("square_vjp");
  auto vx = vjp.input("x", {3});
  auto ct = vjp.input("ct", {3});
  vjp.add_output(vjp.mul(vjp.mul(vjp.scalar(3.0), vx), ct));
  fn.vjp = vjp;
  ir::Graph jvp("square_jvp");
  auto jx = jvp.input("x", {3});
  auto t = jvp.input("t", {3});
  jvp.add_output(jvp.mul(jvp.mul(jvp.scalar(5.0), jx), t));
  fn.jvp = jvp;
  return fn;
}

ir::Tensor vec(std::vector<double> v) { return ir::Tensor::from_f64(DType::F32, {std::int64_t(v.size())}, v); }
}  // namespace

TEST(CustomFn, BodyRunsAndGivenDerivativesAreHonoured) {
  ir::Graph g("uses_square");
  auto x = g.input("x", {3});
  g.add_output(g.sum(ir::call_custom_fn(g, square_fn(), {x}), {0}), "loss");
  reference::TensorMap in{{"x", vec({1, 2, -3})}};
  auto compiled = Session().compile(g);
  EXPECT_TRUE(rlx::testing::tensors_close(compiled.run(in)[0], ir::Tensor::scalar(DType::F32, 14)));

  auto grad = autodiff::grad(g, {"x"});
  auto dg = Session().compile(grad).run(in)[0];
  EXPECT_TRUE(rlx::testing::tensors_close(dg, vec({3, 6, -9})));  // 3 * x from the given VJP body, not 2 * x

  ir::Graph h("jvp_of_square");
  auto hx = h.input("x", {3});
  h.add_output(ir::call_custom_fn(h, square_fn(), {hx}), "y");
  auto jg = autodiff::jvp(h, {"x"});
  reference::TensorMap jin{{"x", vec({1, 2, -3})}, {"tangent_x", vec({1, 1, 2})}};
  auto outs = Session().compile(jg).run(jin);
  EXPECT_TRUE(rlx::testing::tensors_close(outs[1], vec({5, 10, -30})));  // 5 * x * t from the given JVP body
}

TEST(CustomFn, WithoutRulesAutodiffDifferentiatesTheBody) {
  auto fn = square_fn();
  fn.name = "test_square_plain";
  fn.vjp.reset();
  ir::Graph g("plain");
  auto x = g.input("x", {3});
  g.add_output(g.sum(ir::call_custom_fn(g, fn, {x}), {0}));
  auto dg = reference::run(autodiff::grad(g, {"x"}), {{"x", vec({1, 2, -3})}})[0];
  EXPECT_TRUE(rlx::testing::tensors_close(dg, vec({2, 4, -6})));
}

TEST(CustomFn, MistypedBodiesAreRejected) {
  auto fn = square_fn();
  fn.name = "test_square_bad";
  ir::Graph bad("bad_vjp");
  auto bx = bad.input("x", {3});
  bad.input("ct", {4});
  bad.add_output(bx);
  fn.vjp = bad;
  try {
    ir::register_custom_fn(fn);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input 1 of the vjp body is f32[4], expected f32[3]"), std::string::npos)
        << e.what();
  }
  ir::Graph g;
  auto y = g.input("y", {4});
  EXPECT_THROW(ir::call_custom_fn(g, square_fn(), {y}), Error);  // argument type differs from the body's
}
