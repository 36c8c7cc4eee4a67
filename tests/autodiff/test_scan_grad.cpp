// Derivatives through control flow (ScanBackward and friends) against finite
// differences in float64, and an IIR filter written as a scan against a
// direct loop. Central differences use the fourth-order stencil with
// h = 1e-4 (truncation ~h^4, rounding ~1e-12), well inside the 1e-6 relative
// error allowed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "rlx/autodiff/autodiff.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

namespace rlx {
namespace {

using ir::DType;
using ir::Graph;
using ir::GraphRef;
using ir::NodeId;
using ir::OpKind;
using ir::Shape;
using ir::Tensor;
using reference::TensorMap;
using Names = std::vector<std::string>;

constexpr DType F = DType::F64;
constexpr double kStep = 1e-4;

Tensor sample(const std::vector<std::int64_t>& shape, std::mt19937_64& rng, double lo = -1, double hi = 1) {
  return testing::random_tensor(F, shape, rng, lo, hi);
}

std::vector<std::int64_t> all_axes(const Shape& s) {
  std::vector<std::int64_t> a(s.rank());
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::int64_t(i);
  return a;
}

// loss = sum over outputs of sum(out * cot_k): every output's derivative is checked.
Graph with_loss(Graph g) {
  std::vector<NodeId> outs = g.output_ids();
  g.clear_outputs();
  std::optional<NodeId> loss;
  for (std::size_t k = 0; k < outs.size(); ++k) {
    Shape s = g.node(outs[k]).shape;
    NodeId term = g.sum(g.mul(outs[k], g.input("cot" + std::to_string(k), s, F)), all_axes(s));
    loss = loss ? g.add(*loss, term) : term;
  }
  g.add_output(*loss, "loss");
  return g;
}

double loss_at(const Graph& g, const TensorMap& in) { return reference::run(g, in)[0].get(0); }

// d loss / d in[name][i], by the fourth-order central stencil.
double difference(const Graph& g, TensorMap in, const std::string& name, std::int64_t i) {
  Tensor& t = in.at(name);
  const double x = t.get(i);
  auto at = [&](double dx) {
    t.set(i, x + dx);
    return loss_at(g, in);
  };
  return (8 * (at(kStep) - at(-kStep)) - (at(2 * kStep) - at(-2 * kStep))) / (12 * kStep);
}

::testing::AssertionResult close(double got, double want, double scale) {
  double err = std::fabs(got - want), tol = 1e-6 * std::max(std::fabs(got), std::fabs(want)) + 1e-10 * scale;
  if (err <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << got << ", want " << want << " (error " << err << ")";
}

// Random values for every input; differentiates `wrt` element by element.
void check_gradient(const Graph& loss_graph, const Names& wrt, std::uint64_t salt,
                    std::function<void(TensorMap&)> fix = {}) {
  std::mt19937_64 rng(testing::test_seed() ^ salt);
  TensorMap in;
  for (auto id : loss_graph.input_ids()) {
    const auto& n = loss_graph.node(id);
    in[n.attrs.get_str("name")] = testing::random_tensor(n.dtype, n.shape.extents(), rng, -1, 1);
  }
  if (fix) fix(in);
  Graph G = autodiff::grad(loss_graph, wrt);
  auto grads = reference::run(G, in);
  const double scale = std::max(1.0, std::fabs(loss_at(loss_graph, in)));
  for (std::size_t k = 0; k < wrt.size(); ++k)
    for (std::int64_t i = 0; i < grads[k].numel(); ++i)
      EXPECT_TRUE(close(grads[k].get(i), difference(loss_graph, in, wrt[k], i), scale))
          << "d loss / d " << wrt[k] << "[" << i << "]";
  // The gradient graph compiles, unrolled or as host loops, to the same values.
  for (bool unroll : {true, false}) {
    compile::CompileOptions o;
    if (!unroll) o.scan_unroll_max_length = o.scan_unroll_budget = 0;
    auto got = Session().compile(G, o).run(in);
    for (std::size_t k = 0; k < wrt.size(); ++k)
      EXPECT_TRUE(testing::tensors_close(got[k], grads[k])) << wrt[k] << (unroll ? " unrolled" : " host loop");
  }
}

// h' = tanh(h W + x + b), y = h' * h (a product, so the body is nonlinear in the carry too).
GraphRef rnn_cell() {
  Graph b("cell");
  NodeId h = b.input("h", {2, 3}, F), x = b.input("x", {2, 3}, F);
  NodeId w = b.input("w", {3, 3}, F), bias = b.input("b", {3}, F);
  NodeId h2 = b.unary(OpKind::Tanh, b.add(b.add(b.matmul(h, w), x), bias));
  b.set_outputs({h2, b.mul(h2, h)});
  return ir::body_ref(std::move(b));
}

Graph rnn(bool reverse, std::int64_t length = 5) {
  Graph g("rnn");
  auto r = ir::scan(g, rnn_cell(), {g.input("h0", {2, 3}, F)}, {g.input("xs", {length, 2, 3}, F)}, length, reverse,
                    {g.input("w", {3, 3}, F), g.input("b", {3}, F)});
  g.set_outputs(r);
  return g;
}

TEST(ScanGrad, ScanBackwardMatchesFiniteDifferences) {
  check_gradient(with_loss(rnn(false)), {"h0", "xs", "w", "b"}, 1);
}

TEST(ScanGrad, ReverseScanBackwardMatchesFiniteDifferences) {
  check_gradient(with_loss(rnn(true)), {"h0", "xs", "w", "b"}, 2);
}

TEST(ScanGrad, OnlyTheFinalCarryOrOnlyTheYs) {
  for (std::size_t keep : {0u, 1u}) {
    Graph g = rnn(false);
    NodeId out = g.outputs()[keep].node;
    g.set_outputs({out});
    check_gradient(with_loss(g), {"h0", "xs", "w"}, 3 + keep);
  }
}

TEST(ScanGrad, JvpAgreesWithTheVjp) {
  Graph g = with_loss(rnn(true));
  const Names wrt{"h0", "xs", "w", "b"};
  std::mt19937_64 rng(testing::test_seed() ^ 7);
  TensorMap in, feed;
  for (auto id : g.input_ids()) {
    const auto& n = g.node(id);
    in[n.attrs.get_str("name")] = sample(n.shape.extents(), rng);
  }
  feed = in;
  double vjp_dot = 0;
  auto grads = reference::run(autodiff::grad(g, wrt), in);
  for (std::size_t k = 0; k < wrt.size(); ++k) {
    Tensor d = sample(in.at(wrt[k]).shape(), rng);
    for (std::int64_t i = 0; i < d.numel(); ++i) vjp_dot += d.get(i) * grads[k].get(i);
    feed["tangent_" + wrt[k]] = d;
  }
  auto out = reference::run(autodiff::jvp(g, wrt), feed);
  EXPECT_TRUE(close(out[1].get(0), vjp_dot, 1.0)) << "<grad, v> against the loss's tangent";
}

TEST(ScanGrad, HessianVectorProductMatchesDifferencesOfTheGradient) {
  Graph g = with_loss(rnn(false, 3));
  const Names wrt{"w"};
  Graph G = autodiff::grad(g, wrt);
  Graph B = G;  // grad(<grad, v>) is H v
  B.clear_outputs();
  NodeId gw = G.outputs()[0].node;
  B.add_output(B.sum(B.mul(gw, B.input("v", {3, 3}, F)), {0, 1}), "gv");
  std::mt19937_64 rng(testing::test_seed() ^ 8);
  TensorMap in;
  for (auto id : B.input_ids()) {
    const auto& n = B.node(id);
    in[n.attrs.get_str("name")] = sample(n.shape.extents(), rng);
  }
  auto hv = reference::run(autodiff::grad(B, wrt), in)[0];
  for (std::int64_t i = 0; i < 9; ++i) {
    // d/dw_i <grad(w), v> by differences of the gradient.
    auto grad_dot_v = [&](double dx) {
      TensorMap x = in;
      x.at("w").set(i, x.at("w").get(i) + dx);
      auto gr = reference::run(G, x)[0];
      double s = 0;
      for (std::int64_t j = 0; j < 9; ++j) s += gr.get(j) * in.at("v").get(j);
      return s;
    };
    double fd = (8 * (grad_dot_v(kStep) - grad_dot_v(-kStep)) - (grad_dot_v(2 * kStep) - grad_dot_v(-2 * kStep))) /
                (12 * kStep);
    EXPECT_TRUE(close(hv.get(i), fd, 1.0)) << "(H v)[" << i << "]";
  }
}

// ---- an IIR filter ------------------------------------------------------------

// A biquad in direct form I per channel: y = b0 x + b1 x1 + b2 x2 - a1 y1 - a2 y2,
// carries (x1, x2, y1, y2), coefficients as consts.
GraphRef biquad(DType t, std::int64_t channels) {
  Graph b("biquad");
  Shape s{channels};
  NodeId x1 = b.input("x1", s, t), x2 = b.input("x2", s, t), y1 = b.input("y1", s, t), y2 = b.input("y2", s, t);
  NodeId x = b.input("x", s, t), c = b.input("coef", {5}, t);
  auto k = [&](std::int64_t i) { return b.reshape(b.narrow(c, 0, i, 1), std::vector<std::int64_t>{}); };
  NodeId y =
      b.sub(b.add(b.add(b.mul(k(0), x), b.mul(k(1), x1)), b.mul(k(2), x2)), b.add(b.mul(k(3), y1), b.mul(k(4), y2)));
  b.set_outputs({x, x1, y, y1, y});
  return ir::body_ref(std::move(b));
}

Graph iir(DType t, std::int64_t length, std::int64_t channels) {
  Graph g("iir");
  NodeId zero = g.expand(g.scalar(0, t), Shape{channels});
  auto r = ir::scan(g, biquad(t, channels), {zero, zero, zero, zero}, {g.input("signal", {length, channels}, t)},
                    length, false, {g.input("coef", {5}, t)});
  g.add_output(r[4], "filtered");
  return g;
}

std::vector<double> direct_iir(const Tensor& signal, const std::vector<double>& c) {
  const auto length = signal.shape()[0], channels = signal.shape()[1];
  std::vector<double> out(std::size_t(length * channels));
  for (std::int64_t ch = 0; ch < channels; ++ch) {
    double x1 = 0, x2 = 0, y1 = 0, y2 = 0;
    for (std::int64_t t = 0; t < length; ++t) {
      double x = signal.get(t * channels + ch);
      double y = c[0] * x + c[1] * x1 + c[2] * x2 - c[3] * y1 - c[4] * y2;
      out[std::size_t(t * channels + ch)] = y;
      x2 = x1;
      x1 = x;
      y2 = y1;
      y1 = y;
    }
  }
  return out;
}

TEST(ScanGrad, IirFilterAsAScanMatchesADirectLoop) {
  // A resonant low-pass (poles at radius 0.9): its output depends on the whole history.
  const std::vector<double> coef{0.02, 0.04, 0.02, -1.6, 0.81};
  std::mt19937_64 rng(testing::test_seed() ^ 9);
  for (DType t : {DType::F64, DType::F32}) {
    for (std::int64_t length : {48, 2000}) {  // unrolled by length; a host loop
      Graph g = iir(t, length, 3);
      Tensor signal = testing::random_tensor(t, {length, 3}, rng);
      TensorMap in{{"signal", signal}, {"coef", Tensor::from_f64(t, {5}, coef)}};
      Tensor want = Tensor::from_f64(t, {length, 3}, direct_iir(signal, coef));
      // f32 rounding accumulates along the recursion: allow for the filter's gain.
      testing::Tolerance tol = t == F ? testing::Tolerance{1e-9, 1e-9} : testing::Tolerance{1e-3, 1e-3};
      EXPECT_TRUE(testing::tensors_close(reference::run(g, in)[0], want, tol)) << "reference, length " << length;
      auto compiled = Session().compile(g);
      const auto& entries = compiled.compile_result().dispatch.entries;
      auto scan = std::find_if(entries.begin(), entries.end(), [](const auto& e) { return e.op == OpKind::Scan; });
      ASSERT_NE(scan, entries.end());
      EXPECT_EQ(scan->reason.rfind(length > 64 ? "host loop" : "unrolled", 0), 0u) << scan->reason;
      EXPECT_TRUE(testing::tensors_close(compiled.run(in)[0], want, tol)) << ir::dtype_name(t) << ", length " << length;
    }
  }
}

TEST(ScanGrad, IirFilterGradientMatchesFiniteDifferences) {
  Graph g = with_loss(iir(F, 24, 2));
  check_gradient(g, {"signal", "coef"}, 10, [](TensorMap& in) {
    in["coef"] = Tensor::from_f64(F, {5}, std::vector<double>{0.3, -0.2, 0.1, -0.5, 0.2});
  });
}

// ---- if and while -----------------------------------------------------------------

TEST(ScanGrad, IfGradientFollowsTheTakenBranch) {
  Graph g("if");
  NodeId x = g.input("x", {3}, F), w = g.input("w", {3}, F);
  Graph t("sin"), e("square");
  {
    NodeId a = t.input("a", {3}, F), b = t.input("b", {3}, F);
    t.add_output(t.mul(t.unary(OpKind::Sin, a), b));
    NodeId a2 = e.input("a", {3}, F);
    e.input("b", {3}, F);
    e.add_output(e.mul(a2, a2));
  }
  NodeId p = g.binary(OpKind::Gt, g.sum(x, {0}), g.scalar(0, F));  // the condition depends on x: a selector
  g.add_output(ir::if_else(g, p, ir::body_ref(std::move(t)), ir::body_ref(std::move(e)), {x, w})[0]);
  Graph lg = with_loss(g);
  for (double sign : {1.0, -1.0})
    check_gradient(lg, {"x", "w"}, 11, [&](TensorMap& in) {
      in["x"] = Tensor::from_f64(F, {3}, std::vector<double>{0.5 * sign, 0.25, 0.3 * sign});
    });
}

// while (|v| < 2 for all): v = v * a + 0.1; at most `trips` times.
Graph grow(std::int64_t trips) {
  Graph cond("small"), body("step");
  NodeId v = cond.input("v", {2}, F);
  cond.input("a", {2}, F);
  cond.add_output(
      cond.binary(OpKind::Lt, cond.reduce(OpKind::ReduceMax, cond.unary(OpKind::Abs, v), {0}), cond.scalar(2, F)));
  NodeId bv = body.input("v", {2}, F), ba = body.input("a", {2}, F);
  body.add_output(body.add(body.mul(bv, ba), body.scalar(0.1, F)));
  Graph g("grow");
  g.add_output(ir::while_loop(g, ir::body_ref(std::move(cond)), ir::body_ref(std::move(body)), {g.input("v0", {2}, F)},
                              {g.input("a", {2}, F)}, trips)[0]);
  return g;
}

TEST(ScanGrad, BoundedWhileDifferentiatesAsAScan) {
  check_gradient(with_loss(grow(6)), {"v0", "a"}, 12, [](TensorMap& in) {
    in["v0"] = Tensor::from_f64(F, {2}, std::vector<double>{0.3, -0.2});
    in["a"] = Tensor::from_f64(F, {2}, std::vector<double>{1.7, 1.3});  // exits after a few steps, away from the edge
  });
}

TEST(ScanGrad, UnboundedWhileHasForwardModeOnly) {
  Graph g = with_loss(grow(-1));
  try {
    autodiff::grad(g, {"v0"});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    std::string m = e.what();
    for (const char* p : {"node %", "(while)", "max_trip_count", "reverse mode"})
      EXPECT_NE(m.find(p), std::string::npos) << m;
  }
  // Forward mode needs no bound: compare with differences along v0.
  TensorMap in{{"v0", Tensor::from_f64(F, {2}, std::vector<double>{0.3, -0.2})},
               {"a", Tensor::from_f64(F, {2}, std::vector<double>{1.7, 1.3})},
               {"cot0", Tensor::from_f64(F, {2}, std::vector<double>{1, -2})},
               {"tangent_v0", Tensor::from_f64(F, {2}, std::vector<double>{0.5, 1})}};
  auto out = reference::run(autodiff::jvp(g, {"v0"}), in);
  double fd = 0.5 * difference(g, in, "v0", 0) + 1 * difference(g, in, "v0", 1);
  EXPECT_TRUE(close(out[1].get(0), fd, 1.0));
}

TEST(ScanGrad, NonDifferentiableOpInABodyIsNamed) {
  Graph b("argmax_body");
  NodeId c = b.input("c", {3}, F), x = b.input("x", {3}, F);
  NodeId i = b.cast(b.argmax(b.add(c, x), 0), F);
  b.set_outputs({b.add(c, i)});
  Graph g("g");
  g.add_output(ir::scan(g, ir::body_ref(std::move(b)), {g.input("c0", {3}, F)}, {g.input("xs", {4, 3}, F)})[0]);
  try {
    autodiff::grad(with_loss(g), {"xs"});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    std::string m = e.what();
    for (const char* p : {"(scan)", "differentiating its body", "argmax", "not differentiable"})
      EXPECT_NE(m.find(p), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace rlx
