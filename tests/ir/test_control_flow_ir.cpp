// Control flow in the IR: builders and sibling results, the reference
// interpreter, the text form with nested bodies, and the errors that name a
// mistyped body.
#include <gtest/gtest.h>

#include <string>

#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/ir/text.hpp"
#include "rlx/reference/interpreter.hpp"
#include "support/testing.hpp"

namespace rlx::ir {
namespace {

using reference::TensorMap;

// (c, x) -> (c + x, c * x): a running sum, and each step's product.
GraphRef sum_body(const Shape& s, DType t = DType::F32) {
  Graph b("step");
  NodeId c = b.input("c", s, t), x = b.input("x", s, t);
  b.set_outputs({b.add(c, x), b.mul(c, x)});
  return body_ref(std::move(b));
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

void expect_has(const std::string& msg, std::initializer_list<const char*> parts) {
  for (const char* p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

Tensor f32(std::vector<std::int64_t> shape, std::vector<double> v) {
  return Tensor::from_f64(DType::F32, std::move(shape), v);
}

TEST(ControlFlowIr, ScanMakesOneSiblingNodePerResult) {
  Graph g("g");
  NodeId h = g.input("h", {4}), xs = g.input("xs", {8, 4});
  auto r = scan(g, sum_body(Shape{4}), {h}, {xs});
  ASSERT_EQ(r.size(), 2u);
  const Node &carry = g.node(r[0]), &ys = g.node(r[1]);
  EXPECT_EQ(carry.shape, (Shape{4}));
  EXPECT_EQ(ys.shape, (Shape{8, 4}));
  EXPECT_EQ(carry.attrs.get_int("length"), 8);
  EXPECT_EQ(carry.attrs.get_int("result"), 0);
  EXPECT_EQ(ys.attrs.get_int("result"), 1);
  EXPECT_TRUE(are_siblings(carry, ys));
  EXPECT_EQ(num_results(carry), 2u);
  // Adding nodes may reallocate the graph's node storage, so carry and ys are not used after this.
  auto other = scan(g, sum_body(Shape{4}), {h}, {xs});  // an equal but distinct body: another loop
  EXPECT_FALSE(are_siblings(g.node(r[0]), g.node(other[0])));
  g.verify();
}

TEST(ControlFlowIr, ReferenceRunsScanInBothDirections) {
  for (bool rev : {false, true}) {
    Graph g("g");
    NodeId h = g.input("h", {2}), xs = g.input("xs", {3, 2});
    auto r = scan(g, sum_body(Shape{2}), {h}, {xs}, -1, rev);
    g.set_outputs(r);
    Tensor hv = f32({2}, {1, -1}), xv = f32({3, 2}, {1, 2, 3, 4, 5, 6});
    auto out = reference::run(g, {{"h", hv}, {"xs", xv}});
    // By hand: visit rows in order (or reversed), y[t] = c * x[t], c += x[t].
    std::vector<double> c{1, -1}, ys(6);
    for (int s = 0; s < 3; ++s) {
      int t = rev ? 2 - s : s;
      for (int k = 0; k < 2; ++k) {
        ys[std::size_t(2 * t + k)] = c[std::size_t(k)] * xv.get(2 * t + k);
        c[std::size_t(k)] += xv.get(2 * t + k);
      }
    }
    EXPECT_TRUE(testing::tensors_close(out[0], f32({2}, c))) << "reverse=" << rev;
    EXPECT_TRUE(testing::tensors_close(out[1], f32({3, 2}, ys))) << "reverse=" << rev;
  }
}

TEST(ControlFlowIr, ReferenceRunsIfAndWhile) {
  Graph g("g");
  NodeId p = g.input("p", {}, DType::Bool), x = g.input("x", {3});
  Graph dbl("double"), neg("negate");
  dbl.add_output(dbl.mul(dbl.input("v", {3}), dbl.scalar(2)));
  neg.add_output(neg.unary(OpKind::Neg, neg.input("v", {3})));
  NodeId chosen = if_else(g, p, body_ref(std::move(dbl)), body_ref(std::move(neg)), {x})[0];
  // while (v < limit) v = v * 2, capped at 3 trips when bounded.
  Graph cond("below"), body("grow");
  {
    NodeId v = cond.input("v", {}), lim = cond.input("lim", {});
    cond.add_output(cond.binary(OpKind::Lt, v, lim));
    NodeId v2 = body.input("v", {});
    body.input("lim", {});
    body.add_output(body.mul(v2, body.scalar(2)));
  }
  GraphRef cr = body_ref(std::move(cond)), br = body_ref(std::move(body));
  NodeId v = g.input("v", {}), lim = g.input("lim", {});
  NodeId grown = while_loop(g, cr, br, {v}, {lim})[0];
  NodeId capped = while_loop(g, cr, br, {v}, {lim}, 3)[0];
  g.set_outputs({chosen, grown, capped});
  for (bool pv : {true, false}) {
    auto out = reference::run(g, {{"p", Tensor::scalar(DType::Bool, pv)},
                                  {"x", f32({3}, {1, -2, 3})},
                                  {"v", Tensor::scalar(DType::F32, 1.5)},
                                  {"lim", Tensor::scalar(DType::F32, 100)}});
    EXPECT_TRUE(testing::tensors_close(out[0], pv ? f32({3}, {2, -4, 6}) : f32({3}, {-1, 2, -3})));
    EXPECT_EQ(out[1].get(0), 192);  // 1.5 * 2^7
    EXPECT_EQ(out[2].get(0), 12);   // 1.5 * 2^3
  }
}

// Scan with consts, nested scan in its body, if, while: every body kind.
Graph nested_graph() {
  Graph inner("inner");
  {
    NodeId acc = inner.input("acc", {}), e = inner.input("e", {});
    inner.set_outputs({inner.add(acc, e)});
  }
  Graph outer("rows");
  {
    NodeId c = outer.input("c", {}), row = outer.input("row", {3}), w = outer.input("w", {});
    NodeId s = scan(outer, body_ref(std::move(inner)), {outer.scalar(0)}, {row})[0];
    outer.set_outputs({outer.add(c, outer.mul(s, w)), s});
  }
  Graph g("nested");
  NodeId x = g.input("x", {4, 3}), w = g.param("w", {});
  GraphRef rows = body_ref(std::move(outer));
  auto r = scan(g, rows, {g.scalar(0)}, {x}, -1, true, {w});
  Graph t("pos"), e("neg");
  t.add_output(t.input("v", {}));
  e.add_output(e.unary(OpKind::Neg, e.input("v", {})));
  NodeId chosen =
      if_else(g, g.binary(OpKind::Gt, r[0], g.scalar(0)), body_ref(std::move(t)), body_ref(std::move(e)), {r[0]})[0];
  Graph cond("c"), body("b");
  cond.add_output(cond.binary(OpKind::Lt, cond.input("v", {}), cond.scalar(10)));
  body.add_output(body.add(body.input("v", {}), body.scalar(1)));
  NodeId counted = while_loop(g, body_ref(std::move(cond)), body_ref(std::move(body)), {chosen}, {}, 50)[0];
  g.add_output(r[1], "per_row");
  g.add_output(counted, "counted");
  return g;
}

TEST(ControlFlowIr, TextRoundTripsNestedBodies) {
  Graph g = nested_graph();
  const std::string text = to_text(g);
  expect_has(text, {"body @b0 = graph rows {", "body @b0 = graph inner {", "%3 = scan %2, %0, %1 {body=@b0,",
                    "result=1, reverse=true}", "then=@b2", "max_trip_count=50"});
  Graph back = parse_text(text);
  EXPECT_EQ(to_text(back), text);
  ASSERT_EQ(back.size(), g.size());
  // Siblings of the parsed graph share one body, as the builder's do.
  EXPECT_TRUE(are_siblings(back.node(3), back.node(4))) << text;
  TensorMap in{{"x", f32({4, 3}, {1, 2, 3, 4, 5, 6, -7, -8, -9, 1, 0, 1})}};
  TensorMap params{{"w", Tensor::scalar(DType::F32, 0.5)}};
  auto want = reference::run(g, in, params), got = reference::run(back, in, params);
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(testing::tensors_close(got[i], want[i]));
}

TEST(ControlFlowIr, MistypedCarriesNameTheNodeTheCarryAndBothTypes) {
  Graph g("g");
  NodeId h = g.input("h", {4}), xs = g.input("xs", {8, 3});
  Graph b("shrink");  // takes carry f32[4] and a step f32[3] but returns the carry as f32[3]
  NodeId c = b.input("c", {4}), x = b.input("x", {3});
  b.set_outputs({b.add(b.slice(c, {0}, {0}, {3}), x)});
  std::string msg = error_of([&] { scan(g, body_ref(std::move(b)), {h}, {xs}); });
  expect_has(msg, {"node %2", "scan", "carry 0", "returns f32[3]", "the carry is f32[4]"});

  msg = error_of([&] { scan(g, sum_body(Shape{3}), {h}, {xs}); });  // the body takes f32[3] for the f32[4] carry
  expect_has(msg, {"node %2", "scan", "carry 0: the scan body takes f32[3]", "initial carry is f32[4]"});

  msg = error_of([&] { scan(g, sum_body(Shape{4}, DType::F64), {h}, {g.input("xs4", {8, 4})}); });
  expect_has(msg, {"scan", "carry 0", "f64[4]", "f32[4]"});

  msg = error_of([&] { scan(g, sum_body(Shape{4}), {h}, {g.input("short", {8, 5})}); });
  expect_has(msg, {"scan", "xs 0", "f32[4]", "f32[8,5]"});

  // The same error from text: the verifier names the line of the node.
  msg = error_of([] {
    parse_text(R"(graph g {
  %0 = input "h" : f32[4]
  body @b = graph step {
    %0 = input "c" : f32[3]
    output %0
  }
  %1 = scan %0 {body=@b, length=2, num_carries=1, result=0} : f32[4]
  output %1
})");
  });
  expect_has(msg, {"line 7", "node %1 (scan)", "carry 0: the scan body takes f32[3]", "f32[4]"});
}

TEST(ControlFlowIr, OtherMisfitsAreErrors) {
  Graph g("g");
  NodeId x = g.input("x", {3}), flag = g.input("flag", {3}, DType::Bool), p = g.input("p", {}, DType::Bool);
  Graph same("same"), wide("wide");
  same.add_output(same.input("v", {3}));
  NodeId wv = wide.input("v", {3});
  wide.add_output(wide.concat({wv, wv}, 0));
  GraphRef same_ref = body_ref(same);
  expect_has(error_of([&] { if_else(g, flag, same_ref, same_ref, {x}); }), {"if", "condition must be a bool scalar"});
  expect_has(error_of([&] { if_else(g, p, same_ref, body_ref(std::move(wide)), {x}); }),
             {"if", "result 0: the then body gives f32[3], the else body f32[6]"});
  Graph twice("twice");
  twice.add_output(twice.concat({twice.input("v", {3}), twice.input("v2", {3})}, 0));
  expect_has(error_of([&] { if_else(g, p, body_ref(twice), same_ref, {x}); }),
             {"the then body 'twice' takes 2 inputs, the op passes 1"});
  Graph prm("with_param");
  prm.add_output(prm.add(prm.input("v", {3}), prm.param("w", {3})));
  expect_has(error_of([&] { if_else(g, p, body_ref(prm), body_ref(prm), {x}); }), {"has params"});
  Graph not_bool("not_bool");
  not_bool.add_output(not_bool.input("v", {3}));
  expect_has(error_of([&] { while_loop(g, body_ref(not_bool), same_ref, {x}); }),
             {"while", "cond body must return one bool scalar", "f32[3]"});
  expect_has(error_of([&] { scan(g, sum_body(Shape{3}), {x}, {}); }), {"a scan without xs needs its length"});

  // Through add_raw and verify: a bad result index, and a broken body.
  Graph h("h");
  NodeId hx = h.input("x", {3});
  Node bad;
  bad.op = OpKind::If;
  bad.inputs = {h.input("p", {}, DType::Bool), hx};
  bad.attrs = {{"then", same_ref}, {"else", same_ref}, {"result", std::int64_t(1)}};
  bad.shape = Shape{3};
  h.add_raw(bad);
  expect_has(error_of([&] { h.verify(); }), {"node %2 (if)", "result 1 is out of range"});
  Graph broken("broken");
  NodeId bi = broken.input("v", {3});
  Node wrong;
  wrong.op = OpKind::Exp;
  wrong.inputs = {bi};
  wrong.shape = Shape{4};
  broken.add_output(broken.add_raw(wrong));
  Graph k("k");
  Node call = bad;
  call.inputs = {k.input("p", {}, DType::Bool), k.input("x", {3})};
  call.attrs = {{"then", std::make_shared<const Graph>(broken)}, {"else", same_ref}, {"result", std::int64_t(0)}};
  k.add_raw(call);
  expect_has(error_of([&] { k.verify(); }), {"node %2 (if)", "in its 'then' body", "graph 'broken'", "node %1 (exp)"});
  expect_has(
      error_of([] { parse_text("graph g {\n  %0 = input \"x\" : f32[3]\n  %1 = if %0 {then=@nope} : f32[3]\n}"); }),
      {"line 3", "undefined body @nope"});
}

TEST(ControlFlowIr, DotNamesTheBodies) {
  std::string dot = to_dot(nested_graph());
  expect_has(dot, {"scan", "body: rows", "result 1", "then: pos", "else: neg", "cond: c"});
}

}  // namespace
}  // namespace rlx::ir
