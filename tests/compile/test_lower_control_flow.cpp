// lower_control_flow and the CPU host loops: which scans unroll, what the
// dispatch report says, and that unrolled, host-loop and reference runs agree
// for every shape of scan, if and while.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <thread>

#include "compile/lir_exec.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

namespace rlx {
namespace {

using compile::CompileOptions;
using compile::DispatchTier;
using compile::KernelKind;
using ir::DType;
using ir::Graph;
using ir::GraphRef;
using ir::NodeId;
using ir::OpKind;
using ir::Shape;
using reference::TensorMap;

CompileOptions unrolled() { return {}; }  // the defaults unroll every scan below 64 steps
CompileOptions host_loop() {
  CompileOptions o;
  o.scan_unroll_max_length = 0;
  o.scan_unroll_budget = 0;
  return o;
}

bool has_op(const Graph& g, OpKind op) {
  return std::any_of(g.nodes().begin(), g.nodes().end(), [&](const ir::Node& n) { return n.op == op; });
}

// h' = tanh(h W + x + b), y = h' * s: an RNN cell with consts W, b, s.
GraphRef rnn_cell(std::int64_t d) {
  Graph b("cell");
  NodeId h = b.input("h", {2, d}), x = b.input("x", {2, d});
  NodeId w = b.input("w", {d, d}), bias = b.input("b", {d}), s = b.input("s", {});
  NodeId h2 = b.unary(OpKind::Tanh, b.add(b.add(b.matmul(h, w), x), bias));
  b.set_outputs({h2, b.mul(h2, s)});
  return ir::body_ref(std::move(b));
}

Graph rnn(std::int64_t length, bool reverse, std::int64_t d = 3) {
  Graph g("rnn");
  NodeId h0 = g.input("h0", {2, d}), xs = g.input("xs", {length, 2, d});
  auto r = ir::scan(g, rnn_cell(d), {h0}, {xs}, length, reverse,
                    {g.param("w", {d, d}), g.param("b", {d}), g.param("s", {})});
  g.add_output(r[0], "h");
  g.add_output(r[1], "ys");
  return g;
}

// A random W can make the RNN cell's h -> tanh(hW + ...) expanding, and then
// f32 rounding grows with the scan's length until a 600-step scan misses the
// float64 reference on some seeds. Scaled to column sums of |W| at most 0.9
// the step contracts and the error stays that of one step.
void contract_recurrence(TensorMap& params) {
  auto w = params.find("w");
  if (w == params.end() || w->second.shape().size() != 2) return;
  ir::Tensor& t = w->second;
  const std::int64_t rows = t.shape()[0], cols = t.shape()[1];
  double widest = 0;
  for (std::int64_t c = 0; c < cols; ++c) {
    double sum = 0;
    for (std::int64_t r = 0; r < rows; ++r) sum += std::abs(t.get(r * cols + c));
    widest = std::max(widest, sum);
  }
  if (widest > 0.9)
    for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, t.get(i) * 0.9 / widest);
}

// Compiles `g` for the CPU with `o` and checks it against the reference on
// random inputs; returns the compile result for further checks.
std::shared_ptr<const compile::CompileResult> check_cpu(const Graph& g, const CompileOptions& o,
                                                        std::uint64_t salt = 0) {
  std::mt19937_64 rng(testing::test_seed() ^ salt);
  auto [in, params] = testing::random_feeds(g, rng);
  contract_recurrence(params);
  auto want = reference::run(g, in, params);
  auto compiled = Session().compile(g, o);
  for (const auto& [name, t] : params) compiled.set_param(name, t);
  auto got = compiled.run(in);
  EXPECT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i)
    EXPECT_TRUE(testing::tensors_close(got[i], want[i])) << g.name() << " output " << i << "\n" << compiled.ir("mir");
  EXPECT_TRUE(testing::check_contract(compiled.compile_result().lir, Session().backend().traits()))
      << compiled.ir("lir");
  return std::make_shared<compile::CompileResult>(compiled.compile_result());
}

const compile::DispatchEntry& entry_for(const compile::CompileResult& r, OpKind op) {
  for (const auto& e : r.dispatch.entries)
    if (e.op == op) return e;
  throw Error("no dispatch entry for " + std::string(ir::op_name(op)));
}

TEST(LowerControlFlow, ShortScansUnrollByLengthOrBudget) {
  auto r = check_cpu(rnn(16, false), unrolled());
  EXPECT_FALSE(has_op(r->mir, OpKind::Scan)) << ir::to_text(r->mir);
  auto e = entry_for(*r, OpKind::Scan);
  EXPECT_EQ(e.tier, DispatchTier::Decomposed);
  EXPECT_EQ(e.reason.rfind("unrolled (length 16", 0), 0u) << e.reason;
  EXPECT_NE(e.reason.find("scan_unroll_max_length 64"), std::string::npos) << e.reason;

  // 200 steps of a 10-node body: past the length rule, within the budget.
  r = check_cpu(rnn(200, false), unrolled());
  e = entry_for(*r, OpKind::Scan);
  EXPECT_EQ(e.tier, DispatchTier::Decomposed);
  EXPECT_NE(e.reason.find("scan_unroll_budget 4096"), std::string::npos) << e.reason;

  // The length rule switched off alone still leaves the budget.
  CompileOptions no_length;
  no_length.scan_unroll_max_length = 0;
  r = check_cpu(rnn(16, false), no_length);
  EXPECT_EQ(entry_for(*r, OpKind::Scan).tier, DispatchTier::Decomposed);
}

TEST(LowerControlFlow, LongScansRunAsAHostLoop) {
  auto r = check_cpu(rnn(600, true), unrolled());  // 600 x 10 body nodes > 4096
  EXPECT_TRUE(has_op(r->mir, OpKind::Scan));
  auto e = entry_for(*r, OpKind::Scan);
  EXPECT_EQ(e.tier, DispatchTier::Native);
  EXPECT_EQ(e.reason.rfind("host loop (length 600", 0), 0u) << e.reason;
  // Both results come from one ControlFlow kernel.
  int loops = 0;
  for (const auto& k : r->lir.kernels)
    if (k.kind == KernelKind::ControlFlow) {
      ++loops;
      EXPECT_EQ(k.outputs.size(), 2u) << k.name;
    }
  EXPECT_EQ(loops, 1);
  EXPECT_NE(r->summary().find("1 control_flow"), std::string::npos) << r->summary();
}

// One scan configuration, built as a graph.
struct Config {
  std::string name;
  std::function<Graph()> build;
};
std::ostream& operator<<(std::ostream& os, const Config& c) { return os << c.name; }

std::vector<Config> configs() {
  std::vector<Config> c;
  c.push_back({"rnn", [] { return rnn(7, false); }});
  c.push_back({"rnn_reverse", [] { return rnn(7, true); }});
  c.push_back({"length_one", [] { return rnn(1, false); }});
  c.push_back({"length_zero", [] { return rnn(0, false); }});
  c.push_back({"final_carry_only", [] {
                 Graph g = rnn(5, false);
                 NodeId h = g.outputs()[0].node;
                 g.set_outputs({h});
                 return g;
               }});
  c.push_back({"ys_only", [] {
                 Graph g = rnn(5, true);
                 NodeId ys = g.outputs()[1].node;
                 g.set_outputs({ys});
                 return g;
               }});
  // Several carries of several dtypes (an i32 step counter), several xs and ys,
  // a carry passed through untouched and a y that is a carry.
  c.push_back({"mixed", [] {
                 Graph b("mixed");
                 NodeId n = b.input("n", {}, DType::I32), acc = b.input("acc", {3}), keep = b.input("keep", {2});
                 NodeId x = b.input("x", {3}), m = b.input("m", {}, DType::F64);
                 NodeId n2 = b.add(n, b.scalar(1, DType::I32));
                 NodeId acc2 = b.add(b.mul(acc, b.cast(n2, DType::F32)), x);
                 b.set_outputs({n2, acc2, keep, b.mul(m, m), acc2, b.cast(n, DType::F32)});
                 Graph g("mixed");
                 auto r = ir::scan(g, ir::body_ref(std::move(b)),
                                   {g.scalar(0, DType::I32), g.input("acc0", {3}), g.input("keep0", {2})},
                                   {g.input("xs", {6, 3}), g.input("ms", {6}, DType::F64)});
                 for (auto id : r) g.add_output(id);
                 return g;
               }});
  // A scan inside the body of a scan.
  c.push_back({"nested", [] {
                 Graph inner("inner");
                 NodeId a = inner.input("a", {2}), e = inner.input("e", {2});
                 inner.set_outputs({inner.add(inner.mul(a, inner.scalar(0.5)), e)});
                 Graph outer("outer");
                 NodeId c = outer.input("c", {2}), rows = outer.input("rows", {4, 2});
                 NodeId s = ir::scan(outer, ir::body_ref(std::move(inner)), {c}, {rows})[0];
                 outer.set_outputs({outer.unary(OpKind::Tanh, s), s});
                 Graph g("nested");
                 auto r = ir::scan(g, ir::body_ref(std::move(outer)), {g.input("c0", {2})}, {g.input("xs", {5, 4, 2})});
                 g.set_outputs(r);
                 return g;
               }});
  return c;
}

class ScanAgreement : public ::testing::TestWithParam<Config> {};

TEST_P(ScanAgreement, UnrolledHostLoopAndReferenceAgree) {
  Graph g = GetParam().build();
  auto u = check_cpu(g, unrolled(), 1);
  EXPECT_FALSE(has_op(u->mir, OpKind::Scan)) << ir::to_text(u->mir);
  auto h = check_cpu(g, host_loop(), 2);
  EXPECT_TRUE(has_op(h->mir, OpKind::Scan));
  // The same inputs through both compiled forms give the same values.
  std::mt19937_64 rng(testing::test_seed() ^ 3);
  auto [in, params] = testing::random_feeds(g, rng);
  auto a = Session().compile(g, unrolled()), b = Session().compile(g, host_loop());
  for (const auto& [name, t] : params) {
    a.set_param(name, t);
    b.set_param(name, t);
  }
  auto ra = a.run(in), rb = b.run(in);
  for (std::size_t i = 0; i < ra.size(); ++i) EXPECT_TRUE(testing::tensors_close(rb[i], ra[i])) << "output " << i;
  // The LIR itself runs on the reference (the module's contract and memory plan).
  auto want = reference::run(g, in, params);
  auto lir = testing::run_lir(h->lir, in, params);
  for (std::size_t i = 0; i < lir.size(); ++i) EXPECT_TRUE(testing::tensors_close(lir[i], want[i])) << "lir " << i;
}

INSTANTIATE_TEST_SUITE_P(Scans, ScanAgreement, ::testing::ValuesIn(configs()),
                         [](const ::testing::TestParamInfo<Config>& info) { return info.param.name; });

GraphRef unary_body(const std::string& name, OpKind op, const Shape& s) {
  Graph b(name);
  b.add_output(b.unary(op, b.input("v", s)));
  return ir::body_ref(std::move(b));
}

TEST(LowerControlFlow, IfWithAConstantConditionIsResolved) {
  for (bool taken : {true, false}) {
    Graph g("if_const");
    NodeId x = g.input("x", {4});
    NodeId y = ir::if_else(g, g.scalar(taken, DType::Bool), unary_body("t", OpKind::Exp, {4}),
                           unary_body("e", OpKind::Neg, {4}), {x})[0];
    g.add_output(y);
    auto r = check_cpu(g, unrolled());
    EXPECT_FALSE(has_op(r->mir, OpKind::If));
    EXPECT_TRUE(has_op(r->mir, taken ? OpKind::Exp : OpKind::Neg));
    auto e = entry_for(*r, OpKind::If);
    EXPECT_EQ(e.tier, DispatchTier::Decomposed);
    EXPECT_NE(e.reason.find(taken ? "constant true" : "constant false"), std::string::npos) << e.reason;
  }
}

TEST(LowerControlFlow, IfWithARuntimeConditionTakesEitherBranch) {
  Graph g("if_runtime");
  NodeId x = g.input("x", {4});
  NodeId p = g.binary(OpKind::Gt, g.sum(x, {0}), g.scalar(0));
  Graph t("both"), e("first");
  {
    NodeId v = t.input("v", {4}), w = t.input("w", {4});
    t.set_outputs({t.add(v, w), t.mul(v, w)});
    NodeId v2 = e.input("v", {4});
    e.input("w", {4});
    e.set_outputs({v2, e.unary(OpKind::Neg, v2)});
  }
  auto r = ir::if_else(g, p, ir::body_ref(std::move(t)), ir::body_ref(std::move(e)), {x, g.input("y", {4})});
  g.add_output(r[1]);  // result 0 unused: the kernel still needs somewhere to write it
  auto compiled = Session().compile(g);
  EXPECT_EQ(entry_for(compiled.compile_result(), OpKind::If).reason,
            "host branch: the condition is known only at run time");
  ir::Tensor y = ir::Tensor::from_f32({4}, std::vector<float>{1, 2, 3, 4});
  for (float sign : {1.f, -1.f}) {
    ir::Tensor xv = ir::Tensor::from_f32({4}, std::vector<float>{sign, 2 * sign, 0.5f, 1});
    auto got = compiled.run({{"x", xv}, {"y", y}});
    auto want = reference::run(g, {{"x", xv}, {"y", y}});
    EXPECT_TRUE(testing::tensors_close(got[0], want[0])) << "sign " << sign;
  }
}

// while (i < n && |v| < limit): v = v * f + 1; i += 1.
Graph while_graph(std::int64_t max_trips) {
  Graph cond("cond"), body("body");
  {
    NodeId i = cond.input("i", {}, DType::I64), v = cond.input("v", {3});
    NodeId n = cond.input("n", {}, DType::I64), f = cond.input("f", {3});
    (void)f;
    NodeId small =
        cond.binary(OpKind::Lt, cond.reduce(OpKind::ReduceMax, cond.unary(OpKind::Abs, v), {0}), cond.scalar(100));
    cond.add_output(cond.binary(OpKind::And, cond.binary(OpKind::Lt, i, n), small));
    NodeId bi = body.input("i", {}, DType::I64), bv = body.input("v", {3});
    body.input("n", {}, DType::I64);
    NodeId bf = body.input("f", {3});
    body.set_outputs({body.add(bi, body.scalar(1, DType::I64)), body.add(body.mul(bv, bf), body.scalar(1))});
  }
  Graph g("while");
  auto r = ir::while_loop(g, ir::body_ref(std::move(cond)), ir::body_ref(std::move(body)),
                          {g.scalar(0, DType::I64), g.input("v0", {3})},
                          {g.input("n", {}, DType::I64), g.input("f", {3})}, max_trips);
  g.set_outputs(r);
  return g;
}

TEST(LowerControlFlow, WhileRunsAsAHostLoop) {
  for (std::int64_t max_trips : {-1, 0, 4}) {
    Graph g = while_graph(max_trips);
    auto compiled = Session().compile(g);
    EXPECT_EQ(entry_for(compiled.compile_result(), OpKind::While).reason,
              "host loop: the trip count is known only at run time");
    for (std::int64_t n : {0, 3, 50}) {
      TensorMap in{{"v0", ir::Tensor::from_f32({3}, std::vector<float>{0.5f, -1, 2})},
                   {"n", ir::Tensor::scalar(DType::I64, double(n))},
                   {"f", ir::Tensor::from_f32({3}, std::vector<float>{1.5f, 2, -1})}};
      auto got = compiled.run(in);
      auto want = reference::run(g, in);
      std::int64_t trips = want[0].data_as<std::int64_t>()[0];
      EXPECT_LE(trips, max_trips < 0 ? n : std::min(n, max_trips));
      EXPECT_TRUE(testing::tensors_close(got[0], want[0])) << "n " << n << " max " << max_trips;
      EXPECT_TRUE(testing::tensors_close(got[1], want[1])) << "n " << n << " max " << max_trips;
    }
  }
}

TEST(LowerControlFlow, ClonesRunHostLoopsConcurrently) {
  Graph g = rnn(100, false);
  std::mt19937_64 rng(testing::test_seed());
  auto [in, params] = testing::random_feeds(g, rng);
  contract_recurrence(params);
  auto want = reference::run(g, in, params);
  auto compiled = Session().compile(g, host_loop());
  for (const auto& [name, t] : params) compiled.set_param(name, t);
  std::vector<CompiledGraph> clones;
  for (int i = 0; i < 3; ++i) clones.push_back(compiled.clone());
  std::vector<std::thread> threads;
  std::vector<int> bad(clones.size(), 0);
  for (std::size_t i = 0; i < clones.size(); ++i)
    threads.emplace_back([&, i] {
      for (int rep = 0; rep < 20; ++rep) {
        auto got = clones[i].run(in);
        bad[i] += !testing::tensors_close(got[1], want[1]);
      }
    });
  for (auto& t : threads) t.join();
  for (std::size_t i = 0; i < clones.size(); ++i) EXPECT_EQ(bad[i], 0) << "clone " << i;
}

}  // namespace
}  // namespace rlx
