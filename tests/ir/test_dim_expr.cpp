// Dim expressions (rlx/ir/dim_expr.hpp): the canonical form, arithmetic, binding, the text form, and the
// errors, each naming the dim or the node.
#include <gtest/gtest.h>

#include <string>

#include "rlx/error.hpp"
#include "rlx/ir/dim_expr.hpp"
#include "rlx/ir/graph.hpp"
#include "rlx/ir/text.hpp"

namespace {

using rlx::ir::Dim;
using rlx::ir::DimExpr;

const DimExpr B = DimExpr::symbol("B"), S = DimExpr::symbol("S");

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const rlx::Error& e) {
    return e.what();
  }
  return "";
}

TEST(DimExpr, CanonicalFormIsIndependentOfHowItWasBuilt) {
  EXPECT_EQ((B * S).str(), "B*S");
  EXPECT_EQ(S * B, B * S);
  EXPECT_EQ((S + 1).str(), "S+1");
  EXPECT_EQ((DimExpr(1) + S).str(), "S+1");
  EXPECT_EQ((S * 2 - 1).str(), "2*S-1");
  EXPECT_EQ((B * S * 384).str(), "384*B*S");
  EXPECT_EQ((S - S).str(), "0");
  EXPECT_EQ(((S + 1) * (S - 1)).str(), "S*S-1");
  EXPECT_EQ((S + 1).floordiv(2).str(), "floordiv(S+1,2)");
  EXPECT_EQ(S.mod(8).str(), "mod(S,8)");
  EXPECT_EQ(DimExpr::symbol("my dim").str(), "\"my dim\"");
  // Integer results fold: a whole multiple divides, constants compute.
  EXPECT_EQ((S * 4 + 8).floordiv(4).str(), "S+2");
  EXPECT_EQ((S * 4).mod(4).str(), "0");
  EXPECT_EQ(DimExpr(7).floordiv(2).constant(), 3);
  EXPECT_EQ(DimExpr(-7).floordiv(2).constant(), -4);  // floor, as Python's //
  EXPECT_EQ(B.dim(), Dim::symbol("B"));
  EXPECT_TRUE(DimExpr(5).dim().is_static());
}

TEST(DimExpr, ExactDivisionOfProducts) {
  EXPECT_EQ(*(B * S * 384).exact_div(384), B * S);
  EXPECT_EQ(*(B * S * 384).exact_div(B * S), DimExpr(384));
  EXPECT_EQ(*(B * S * 6).exact_div(B * 2), S * 3);
  EXPECT_FALSE((B * S).exact_div(DimExpr::symbol("T")).has_value());
  EXPECT_FALSE((S + 1).exact_div(2).has_value());
  EXPECT_FALSE(S.exact_div(0).has_value());
}

TEST(DimExpr, ParsesWhatItPrints) {
  for (const DimExpr& e : {B * S, S + 1, S * 2 - 1, (S + 1).floordiv(2), (B * S).mod(8) * B + 3,
                           DimExpr::symbol("my dim") * 2, DimExpr(12)})
    EXPECT_EQ(DimExpr::parse(e.str()), e) << e.str();
  EXPECT_EQ(DimExpr::parse(" S * B + (2 - 1) ").str(), "B*S+1");
  EXPECT_EQ(DimExpr::of(Dim::symbol("B*S")), B * S);
  EXPECT_EQ(DimExpr::of(Dim::symbol("my dim")), DimExpr::symbol("my dim"));  // a name, taken whole
}

TEST(DimExpr, BindingEvaluatesAndLeavesTheRestSymbolic) {
  const std::vector<std::pair<std::string, std::int64_t>> both{{"B", 8}, {"S", 7}}, only_b{{"B", 8}};
  EXPECT_EQ((B * S).eval(both), 56);
  EXPECT_EQ((S + 1).floordiv(2).eval(both), 4);
  EXPECT_EQ(S.mod(4).eval(both), 3);
  EXPECT_EQ((B * S + 1).substitute(only_b).str(), "8*S+1");
  const auto e = error_of([&] { (B * S).eval(only_b); });
  EXPECT_NE(e.find("B*S"), std::string::npos) << e;
  EXPECT_NE(e.find("S are not bound"), std::string::npos) << e;
}

TEST(DimExpr, ErrorsNameTheExpression) {
  auto e = error_of([] { DimExpr::parse("B*"); });
  EXPECT_NE(e.find("dim expression 'B*'"), std::string::npos) << e;
  e = error_of([] { DimExpr::parse("floordiv(S,0)"); });
  EXPECT_NE(e.find("the divisor must be a positive integer"), std::string::npos) << e;
  e = error_of([] { DimExpr::parse("S/2"); });
  EXPECT_NE(e.find("unexpected"), std::string::npos) << e;
  e = error_of([] { (S * 4611686018427387904).operator*(4); });
  EXPECT_NE(e.find("dim expression"), std::string::npos) << e;
}

// A graph whose dims are expressions: printed and parsed back, verified before binding, bound by
// bind_symbols, and a binding that breaks a reshape is an error naming the node.
TEST(DimExpr, GraphsTextAndBinding) {
  rlx::ir::Graph g("dyn");
  auto x = g.input("x", rlx::ir::Shape(std::vector<Dim>{B.dim(), S.dim(), Dim(4)}));
  auto flat = g.reshape(x, rlx::ir::Shape(std::vector<Dim>{(B * S).dim(), Dim(4)}));
  auto half = g.iota(rlx::ir::Shape(std::vector<Dim>{(S + 1).floordiv(2).dim()}), 0);
  g.add_output(flat, "flat");
  g.add_output(half, "half");
  g.verify();
  const std::string text = rlx::ir::to_text(g);
  EXPECT_NE(text.find("f32[B*S,4]"), std::string::npos) << text;
  EXPECT_NE(text.find("i64[floordiv(S+1,2)]"), std::string::npos) << text;
  EXPECT_EQ(rlx::ir::to_text(rlx::ir::parse_text(text)), text);

  const auto bound = rlx::ir::bind_symbols(g, {{"B", 3}, {"S", 5}});
  EXPECT_EQ(bound.node(flat).shape.str(), "[15,4]");
  EXPECT_EQ(bound.node(half).shape.str(), "[3]");
  EXPECT_EQ(rlx::ir::bind_symbols(g, {{"B", 3}}).node(flat).shape.str(), "[3*S,4]");

  // A reshape whose element counts only match as expressions fails once bound, naming the node.
  rlx::ir::Graph h("bad");
  auto y = h.input("y", rlx::ir::Shape(std::vector<Dim>{B.dim(), S.dim()}));
  h.add_output(h.reshape(y, rlx::ir::Shape(std::vector<Dim>{(B * 2).dim(), Dim(3)})), "r");
  h.verify();
  const auto e = error_of([&] { rlx::ir::bind_symbols(h, {{"B", 2}, {"S", 5}}); });
  EXPECT_NE(e.find("reshape"), std::string::npos) << e;
  EXPECT_NE(e.find("element count"), std::string::npos) << e;
  const auto p = error_of([] { rlx::ir::parse_text("graph g {\n  %x = input \"x\" : f32[B*]\n}"); });
  EXPECT_NE(p.find("line 2"), std::string::npos) << p;
  EXPECT_NE(p.find("dim expression"), std::string::npos) << p;
}

}  // namespace
