// The op table (rlx/ir/op_def.hpp): every op has an entry, defaults are filled
// in, and a formula is one decomposition every layer runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "rlx/autodiff/autodiff.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/ir/op_def.hpp"
#include "rlx/ir/text.hpp"
#include "rlx/reference/interpreter.hpp"
#include "support/testing.hpp"

namespace rlx {
namespace {

using ir::DType;
using ir::OpKind;
using ir::Shape;

TEST(OpTable, EveryOpHasItsEntry) {
  for (OpKind k : ir::kAllOps) {
    const ir::OpDef& d = ir::op_def(k);
    EXPECT_EQ(d.kind, k) << ir::op_name(k);
    EXPECT_FALSE(d.doc.empty()) << ir::op_name(k) << " has no doc line";
    EXPECT_EQ(&ir::op_attr_schema(k), &d.attrs);
    if (d.formula) {
      EXPECT_TRUE(ir::is_elementwise(k)) << ir::op_name(k) << ": a formula is for elementwise ops";
    }
    if (ir::op_info(k).cls == ir::OpClass::Composite) {
      EXPECT_FALSE(d.formula) << ir::op_name(k);
    }
    for (const auto& a : d.attrs) EXPECT_FALSE(a.required && a.default_value) << ir::op_name(k) << "." << a.key;
    // infer_type and the reference interpreter are lookups: every op brings its shape rule, and its float64
    // reference (a rule, or the formula) unless the interpreter runs its bodies (custom, control flow) or the
    // caller feeds it (input, param).
    EXPECT_TRUE(d.infer) << ir::op_name(k) << " has no shape rule";
    const bool fed_or_bodies = k == OpKind::Input || k == OpKind::Param || k == OpKind::Custom ||
                               ir::op_info(k).cls == ir::OpClass::ControlFlow;
    EXPECT_EQ(bool(d.reference) || bool(d.formula), !fed_or_bodies) << ir::op_name(k);
    if (fed_or_bodies || ir::op_info(k).cls == ir::OpClass::Leaf) continue;
    // autodiff and vmap are lookups too: each op brings its rules or has a decomposition to go through, but for the
    // ops whose results carry no derivative.
    EXPECT_TRUE(d.vmap || d.has_decomposition()) << ir::op_name(k) << " has no batching rule";
    const bool no_derivative = ir::is_comparison(k) || k == OpKind::And || k == OpKind::Or || k == OpKind::Not ||
                               k == OpKind::ArgMax || k == OpKind::ArgMin || k == OpKind::Floor || k == OpKind::Ceil ||
                               k == OpKind::Round || k == OpKind::Sign ||
                               // block-quantized storage: no tangent space of its own
                               k == OpKind::Dequantize || k == OpKind::Quantize;
    const bool reverse = d.partial || d.vjp || d.has_decomposition(),
               forward = d.partial || d.jvp || d.has_decomposition();
    EXPECT_EQ(reverse && forward, !no_derivative) << ir::op_name(k);
    if (d.partial) {
      EXPECT_TRUE(ir::is_elementwise(k)) << ir::op_name(k) << ": a partial is for elementwise ops";
    }
  }
}

TEST(OpTable, ASecondDefinitionIsRefused) {
  testing::expect_error([] { ir::define_op({.kind = OpKind::Exp, .doc = "again"}); }, {"'exp' is defined twice"});
}

TEST(OpTable, FormulasDecomposeIntoOpsWithoutOne) {
  for (OpKind k : ir::kAllOps) {
    if (!ir::op_def(k).formula) continue;
    for (DType t : {DType::F32, DType::F16}) {
      ir::Graph g("formula");
      auto x = g.input("x", Shape{3}, t);
      g.add_output(g.unary(k, x));
      ir::Graph m = compile::passes::decompose(g, {});
      for (const auto& n : m.nodes())
        EXPECT_FALSE(ir::op_def(n.op).formula) << ir::op_name(k) << " left " << ir::op_name(n.op);
      // f16 computes in f32 and rounds once, at the end.
      EXPECT_EQ(m.nodes()[m.output_ids()[0]].dtype, t);
      if (t == DType::F16) {
        std::size_t casts = 0;
        for (const auto& n : m.nodes()) casts += n.op == OpKind::Cast;
        EXPECT_EQ(casts, 2u) << ir::op_name(k);
      }
    }
  }
}

// The formulas against closed forms computed here in long double, in both tails.
TEST(OpTable, FormulaReferencesMatchClosedForms) {
  const std::vector<double> xs{-60, -30, -17, -3, -0.5, 0, 1e-9, 0.5, 3, 17, 30, 60};
  auto closed = [](OpKind k, long double x) -> long double {
    const long double sig = 1 / (1 + std::exp(-x));
    switch (k) {
      case OpKind::Sigmoid: return sig;
      case OpKind::Silu: return x * sig;
      case OpKind::Softplus: return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
      case OpKind::Mish: return x * std::tanh(x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)));
      case OpKind::Gelu: return 0.5L * x * (1 + std::erf(x / std::sqrt(2.0L)));
      case OpKind::GeluTanh:
        return 0.5L * x * (1 + std::tanh(std::sqrt(2 / 3.14159265358979323846L) * (x + 0.044715L * x * x * x)));
      default: return NAN;
    }
  };
  for (OpKind k : {OpKind::Sigmoid, OpKind::Silu, OpKind::Softplus, OpKind::Mish, OpKind::Gelu, OpKind::GeluTanh}) {
    ir::Graph g("tails");
    auto x = g.input("x", Shape{std::int64_t(xs.size())}, DType::F64);
    g.add_output(g.unary(k, x));
    auto y = reference::run(g, {{"x", ir::Tensor::from_f64(DType::F64, {std::int64_t(xs.size())}, xs)}})[0];
    ASSERT_EQ(y.numel(), std::int64_t(xs.size()));
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const double want = double(closed(k, xs[i])), got = y.get(std::int64_t(i));
      EXPECT_NEAR(got, want, 1e-14 * std::max(1.0, std::fabs(want)) + 1e-300) << ir::op_name(k) << "(" << xs[i] << ")";
      if (want != 0) {
        EXPECT_LT(std::fabs(got - want) / std::fabs(want), 1e-12) << ir::op_name(k) << "(" << xs[i] << ")";
      }
    }
  }
}

// log1p's quotient form has a branch whose divisor is 0 when 1 + t rounds to 1;
// the derivative through the branch not taken must still be finite.
TEST(OpTable, Log1pFormulaHasAFiniteDerivativeEverywhere) {
  ir::Graph g("log1p");
  auto x = g.input("x", Shape{4}, DType::F64);
  g.add_output(g.sum(ir::log1p(ir::Expr(g, x)).id(), {0}));
  ir::Graph dg = autodiff::grad(g, {"x"});
  const std::vector<double> ts{1e-300, 1e-20, 1e-3, 3};
  auto outs = reference::run(dg, {{"x", ir::Tensor::from_f64(DType::F64, {4}, ts)}});
  const ir::Tensor& dx = outs.back();
  for (std::size_t i = 0; i < ts.size(); ++i) EXPECT_NEAR(dx.get(std::int64_t(i)), 1 / (1 + ts[i]), 1e-12) << ts[i];
}

// mish has no rule of its own: autodiff goes through its formula, whose log1p
// and sigmoid branches must keep the derivative finite far into both tails.
TEST(OpTable, MishDerivativeThroughItsFormulaIsFiniteInTheTails) {
  const std::vector<double> xs{-80, -40, -20, -1, 0.5, 3, 20, 80};
  ir::Graph g("mish");
  auto x = g.input("x", Shape{std::int64_t(xs.size())}, DType::F64);
  g.add_output(g.sum(g.unary(OpKind::Mish, x), {0}));
  ir::Graph dg = autodiff::grad(g, {"x"});
  auto dx = reference::run(dg, {{"x", ir::Tensor::from_f64(DType::F64, {std::int64_t(xs.size())}, xs)}}).back();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const long double v = xs[i], sp = v > 0 ? v + std::log1p(std::exp(-v)) : std::log1p(std::exp(v));
    const long double th = std::tanh(sp), sig = 1 / (1 + std::exp(-v));
    const double want = double(th + v * (1 - th * th) * sig);
    EXPECT_NEAR(dx.get(std::int64_t(i)), want, 1e-12 * std::max(1.0, std::fabs(want))) << "mish'(" << xs[i] << ")";
  }
}

// layer_norm's and rms_norm's eps defaults live in the table alone; the builders set eps only when given.
TEST(OpTable, NormBuildersTakeTheTablesEps) {
  ir::Graph g("norms");
  auto x = g.input("x", Shape{2, 8});
  EXPECT_EQ(g.node(g.layer_norm(x, std::nullopt, std::nullopt)).attrs.get_float("eps"), 1e-5);
  EXPECT_EQ(g.node(g.rms_norm(x, std::nullopt)).attrs.get_float("eps"), 1e-6);
  EXPECT_EQ(g.node(g.rms_norm(x, std::nullopt, 0.5)).attrs.get_float("eps"), 0.5);
  for (OpKind k : {OpKind::LayerNorm, OpKind::RmsNorm, OpKind::LayerNormBackward, OpKind::RmsNormBackward}) {
    const auto& attrs = ir::op_def(k).attrs;
    auto eps = std::find_if(attrs.begin(), attrs.end(), [](const ir::AttrSpec& a) { return a.key == "eps"; });
    ASSERT_NE(eps, attrs.end()) << ir::op_name(k);
    EXPECT_TRUE(eps->default_value.has_value()) << ir::op_name(k);
  }
}

// group_norm's default, checks and text form come from its entry alone.
TEST(OpTable, GroupNormTakesItsDefaultAndChecksFromTheTable) {
  ir::Graph g("gn");
  auto x = g.input("x", Shape{2, 6, 5});
  auto gamma = g.input("gamma", Shape{6}), beta = g.input("beta", Shape{6});
  auto y = g.group_norm(x, 3, gamma, beta);
  EXPECT_EQ(g.node(y).attrs.get_float("eps"), 1e-5);
  EXPECT_EQ(g.node(g.group_norm(x, 2, std::nullopt, std::nullopt, 0.25)).attrs.get_float("eps"), 0.25);
  testing::expect_error([&] { g.group_norm(x, 4); }, {"group_norm", "num_groups 4 does not divide the 6 channels"});
  testing::expect_error([&] { g.group_norm(x, 0); }, {"num_groups 0"});
  testing::expect_error([&] { g.group_norm(x, 3, g.input("short", Shape{5})); }, {"gamma must be [6]"});
  testing::expect_error([&] { g.group_norm(x, 3, std::nullopt, beta); }, {"beta without gamma"});
  testing::expect_error([&] { g.group_norm(g.input("v", Shape{6}), 3); }, {"rank >= 2"});
  testing::expect_error([&] { g.add(OpKind::GroupNorm, {x}, {}); }, {"missing attribute 'num_groups'"});
  // The text form writes the filled-in default, and parses back to the same graph.
  g.add_output(y);
  const std::string text = ir::to_text(g);
  EXPECT_NE(text.find("group_norm"), std::string::npos);
  EXPECT_NE(text.find("eps=1.0000000000000001e-05"), std::string::npos) << text;
  EXPECT_EQ(ir::to_text(ir::parse_text(text)), text);
  // A text node without the optional key gets the default too.
  ir::Graph parsed = ir::parse_text(
      "graph t {\n  %0 = input \"x\" : f32[1,4,2]\n  %1 = group_norm %0 {num_groups=2} : f32[1,4,2]\n"
      "  output %1\n}\n");
  EXPECT_EQ(parsed.node(1).attrs.get_float("eps"), 1e-5);
}

}  // namespace
}  // namespace rlx
