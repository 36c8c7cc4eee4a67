// Dim expressions (rlx/ir/dim_expr.hpp): the canonical form, arithmetic, binding, the text form, and the
// errors, each naming the dim or the node.
#include <gtest/gtest.h>

#include <string>

#include "rlx/error.hpp"
#include "rlx/ir/dim_expr.hpp"
#include "rlx/ir/graph.hpp"
#include "rlx/ir/text.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"

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

// Every way a binding can be wrong is an rlx::Error naming the symbol: bound twice to different sizes, a
// name the graph does not have, a negative size, and (at compile) one left unbound, found inside an
// expression too.
TEST(DimExpr, BindingErrorsNameTheSymbol) {
  rlx::ir::Graph g("dyn");
  auto x = g.input("x", rlx::ir::Shape(std::vector<Dim>{B.dim(), S.dim()}));
  g.add_output(g.reshape(x, rlx::ir::Shape(std::vector<Dim>{(B * S).dim()})), "flat");
  auto e = error_of([&] { rlx::ir::bind_symbols(g, {{"B", 2}, {"S", 3}, {"B", 4}}); });
  EXPECT_NE(e.find("symbol 'B' bound to both 2 and 4"), std::string::npos) << e;
  EXPECT_NO_THROW(rlx::ir::bind_symbols(g, {{"B", 2}, {"B", 2}}));  // the same size twice is one binding
  e = error_of([&] { rlx::ir::bind_symbols(g, {{"T", 2}}); });
  EXPECT_NE(e.find("cannot bind the symbol 'T': the graph has the symbols B, S"), std::string::npos) << e;
  e = error_of([&] { rlx::ir::bind_symbols(g, {{"S", -1}}); });
  EXPECT_NE(e.find("symbol 'S' bound to -1"), std::string::npos) << e;

  // Only the expression B*S names S here: the compile's error still lists it.
  rlx::ir::Graph h("only_expr");
  auto y = h.input("y", rlx::ir::Shape(std::vector<Dim>{(B * S).dim()}));
  h.add_output(h.unary(rlx::ir::OpKind::Neg, y), "n");
  rlx::compile::CompileOptions o;
  o.bind = {{"B", 2}};
  e = error_of([&] { rlx::runtime::Session(rlx::runtime::Device::Cpu).compile(h, o); });
  EXPECT_NE(e.find("unbound symbolic dims S"), std::string::npos) << e;
  o.bind = {{"B", 2}, {"S", 3}};
  auto cg = rlx::runtime::Session(rlx::runtime::Device::Cpu).compile(h, o);
  rlx::ir::Tensor in(rlx::ir::DType::F32, {6});
  for (std::int64_t i = 0; i < 6; ++i) in.set(i, double(i));
  EXPECT_EQ(cg.run({{"y", in}}).at(0).get(5), -5.0);
}

// The reference interpreter binds plain symbols from the feeds and checks an input whose dim is an
// expression once they are bound.
TEST(DimExpr, ReferenceChecksExpressionInputsAfterBinding) {
  rlx::ir::Graph g("two");
  auto x = g.input("x", rlx::ir::Shape(std::vector<Dim>{B.dim(), S.dim()}));
  auto y = g.input("y", rlx::ir::Shape(std::vector<Dim>{(B * S).dim()}));
  g.add_output(g.add(g.reshape(x, rlx::ir::Shape(std::vector<Dim>{(B * S).dim()})), y), "sum");
  rlx::ir::Tensor a(rlx::ir::DType::F32, {2, 3}), b6(rlx::ir::DType::F32, {6}), b5(rlx::ir::DType::F32, {5});
  for (std::int64_t i = 0; i < 6; ++i) {
    a.set(i, double(i));
    b6.set(i, 10.0);
  }
  const auto out = rlx::reference::run(g, {{"x", a}, {"y", b6}}, {}).at(0);
  EXPECT_EQ(out.shape(), (std::vector<std::int64_t>{6}));
  EXPECT_EQ(out.get(5), 15.0);
  const auto e = error_of([&] { rlx::reference::run(g, {{"x", a}, {"y", b5}}, {}); });
  EXPECT_NE(e.find("expects shape [B*S] ([6] here), got [5]"), std::string::npos) << e;
}

}  // namespace
