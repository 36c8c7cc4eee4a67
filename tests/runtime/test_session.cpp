// Session and CompiledGraph behaviour that is independent of the op set:
// params (set, specialized, promoted), clones across threads, symbols bound
// at compile time, and the allocation-free run path.
#include <gtest/gtest.h>

#include <thread>

#include "rlx/error.hpp"
#include "rlx/models/demo_models.hpp"
#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

using namespace rlx;
using rlx::testing::tensors_close;

namespace {
std::vector<runtime::NamedTensor> named(const reference::TensorMap& m) {
  std::vector<runtime::NamedTensor> out;
  for (const auto& [k, v] : m) out.push_back({k, ir::view(v)});
  return out;
}
}  // namespace

TEST(Session, MlpMatchesReference) {
  auto g = models::mlp({8, 32, 3});
  auto params = models::random_params(g, 3);
  auto inputs = models::random_inputs(g, 4);
  auto compiled = Session().compile(g);
  for (const auto& [k, v] : params) compiled.set_param(k, v);
  auto out = compiled.run(named(inputs));
  auto want = reference::run(g, inputs, params);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(tensors_close(out[0], want[0]));
  EXPECT_EQ(compiled.output_specs()[0].name, "y");
}

TEST(Session, ParamSpecializeBakesWeights) {
  auto g = models::mlp({4, 16, 2});
  auto params = models::random_params(g, 5);
  auto inputs = models::random_inputs(g, 6);
  compile::CompileOptions o;
  o.param_bindings = {params.begin(), params.end()};
  auto compiled = Session().compile(g, o);
  EXPECT_TRUE(compiled.param_specs().empty());  // every param became a constant
  auto out = compiled.run(named(inputs));
  EXPECT_TRUE(tensors_close(out[0], reference::run(g, inputs, params)[0]));
}

TEST(Session, PromotedConstantsAreFedAutomatically) {
  ir::Graph g("promote");
  auto x = g.input("x", {4, 64});
  ir::Tensor w(ir::DType::F32, {64, 64});
  for (std::int64_t i = 0; i < w.numel(); ++i) w.set(i, (i % 7) * 0.25 - 0.5);
  g.add_output(g.matmul(x, g.constant(w)));
  compile::CompileOptions o;
  o.promote_constants_over_bytes = 1024;
  auto compiled = Session().compile(g, o);
  ASSERT_EQ(compiled.param_specs().size(), 1u);
  std::mt19937_64 rng(rlx::testing::test_seed());
  reference::TensorMap inputs{{"x", rlx::testing::random_tensor(ir::DType::F32, {4, 64}, rng)}};
  auto out = compiled.run(named(inputs));
  EXPECT_TRUE(tensors_close(out[0], reference::run(g, inputs)[0]));
}

TEST(Session, ClonesRunConcurrentlyAndShareWeights) {
  auto g = models::mlp({16, 64, 2});
  auto params = models::random_params(g, 7);
  auto compiled = Session().compile(g);
  for (const auto& [k, v] : params) compiled.set_param(k, v);
  auto clone = compiled.clone();  // shares the weights set above
  std::vector<reference::TensorMap> inputs{models::random_inputs(g, 8), models::random_inputs(g, 9)};
  std::vector<ir::Tensor> got(2);
  std::vector<std::string> errors(2);
  auto work = [&](int i, CompiledGraph& c) {
    try {
      for (int r = 0; r < 30; ++r) got[i] = c.run(named(inputs[i]))[0];
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
  };
  std::thread t0(work, 0, std::ref(compiled)), t1(work, 1, std::ref(clone));
  t0.join();
  t1.join();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(errors[i], "");
    EXPECT_TRUE(tensors_close(got[i], reference::run(g, inputs[i], params)[0]));
  }
}

TEST(Session, SymbolsBoundAtCompileTime) {
  ir::Graph g("sym");
  auto x = g.input("x", ir::Shape(std::vector<ir::Dim>{ir::Dim::symbol("B"), ir::Dim(8)}));
  g.add_output(g.softmax(g.relu(x)));
  EXPECT_THROW(Session().compile(g), Error);  // unbound symbol: a clear error
  compile::CompileOptions o;
  o.bind = {{"B", 3}};
  auto compiled = Session().compile(g, o);
  EXPECT_EQ(compiled.input_specs()[0].shape, (std::vector<std::int64_t>{3, 8}));
  std::mt19937_64 rng(rlx::testing::test_seed());
  reference::TensorMap inputs{{"x", rlx::testing::random_tensor(ir::DType::F32, {3, 8}, rng)}};
  auto out = compiled.run(named(inputs));
  EXPECT_TRUE(tensors_close(out[0], reference::run(ir::bind_symbols(g, o.bind), inputs)[0]));
}

// A compiled graph and its clones compile each extent once between them: an extent one compiled is made
// executable by the other from the same compile result, and both run it correctly.
TEST(Session, ClonesShareTheExtentsCompiledByEachOther) {
  const ir::Shape rows(std::vector<ir::Dim>{ir::Dim::symbol("S"), ir::Dim(4)});
  compile::CompileOptions o;
  o.bind = {{"S", 6}};
  ir::Graph g("rows");
  g.add_output(g.softmax(g.mul(g.input("x", rows), g.param("w", {4})), 0), "y");  // over S: the extent matters
  auto original = Session().compile(g, o);
  std::mt19937_64 rng(rlx::testing::test_seed());
  original.set_param("w", rlx::testing::random_tensor(ir::DType::F32, {4}, rng));
  auto clone = original.clone();
  original.set_active_extent(3);
  clone.set_active_extent(3);
  EXPECT_EQ(&clone.compile_result(), &original.compile_result());  // not compiled again
  clone.set_active_extent(2);  // first compiled by the clone, then used by the original
  original.set_active_extent(2);
  EXPECT_EQ(&clone.compile_result(), &original.compile_result());
  for (std::int64_t s : {2, 3, 6}) {
    original.set_active_extent(s);
    clone.set_active_extent(s);
    const ir::Tensor x = rlx::testing::random_tensor(ir::DType::F32, {s, 4}, rng);
    const ir::Tensor want = original.run({{"x", x}})[0];
    EXPECT_TRUE(rlx::testing::tensors_close(clone.run({{"x", x}})[0], want)) << "S=" << s;
    EXPECT_EQ(want.shape(), (std::vector<std::int64_t>{s, 4}));
  }
}

// What set_active_extent refuses, naming what depends on the symbol: a param (every extent shares the params),
// a handle (it moves from extent to extent) and an output fed into a handle. A refusal leaves the extent as it was.
TEST(Session, ActiveExtentRefusesWhatDependsOnTheSymbol) {
  const ir::Shape rows(std::vector<ir::Dim>{ir::Dim::symbol("S"), ir::Dim(4)});
  compile::CompileOptions o;
  o.bind = {{"S", 5}};
  std::mt19937_64 rng(rlx::testing::test_seed());
  {
    ir::Graph g("param");
    g.add_output(g.add(g.input("x", rows), g.param("table", rows)));
    auto c = Session().compile(g, o);
    rlx::testing::expect_error([&] { c.set_active_extent(2); },
                               {"set_active_extent", "S=2", "param 'table'", "f32[2,4]", "f32[5,4]"});
    EXPECT_EQ(c.active_extent(), 5);
  }
  {
    ir::Graph g("handle");
    auto cache = g.input("cache", rows);
    auto x = g.input("x", {4});
    g.add_output(g.add(cache, x), "next");
    auto c = Session().compile(g, o);
    c.bind_handle("cache", ir::view(rlx::testing::random_tensor(ir::DType::F32, {5, 4}, rng)));
    rlx::testing::expect_error([&] { c.set_active_extent(3); }, {"set_active_extent", "input 'cache'", "f32[5,4]"});
    EXPECT_EQ(c.active_extent(), 5);
    EXPECT_EQ(c.input_specs()[0].shape, (std::vector<std::int64_t>{5, 4}));
  }
  {
    ir::Graph g("feed");
    auto state = g.input("state", {5, 4});
    auto x = g.input("x", rows);
    g.add_output(g.add(x, g.sum(state, {0}, true)), "y");  // [S, 4]: the state's shape at the bound only
    auto c = Session().compile(g, o);
    c.bind_handle("state", ir::view(rlx::testing::random_tensor(ir::DType::F32, {5, 4}, rng)));
    c.feed_handle("state", "y");
    rlx::testing::expect_error([&] { c.set_active_extent(2); },
                               {"set_active_extent", "output 'y'", "input 'state'", "S=2", "f32[2,4]"});
    EXPECT_EQ(c.active_extent(), 5);
  }
}

TEST(Session, RunIntoWritesEveryElement) {
  auto g = models::encoder_block({1, 16, 32, 4, 64});
  auto params = models::random_params(g, 11);
  auto inputs = models::random_inputs(g, 12);
  auto compiled = Session().compile(g);
  for (const auto& [k, v] : params) compiled.set_param(k, v);
  const auto& spec = compiled.output_specs()[0];
  std::vector<ir::Tensor> outs{ir::Tensor(spec.dtype, spec.shape)};
  for (std::int64_t i = 0; i < outs[0].numel(); ++i) outs[0].set(i, std::numeric_limits<double>::quiet_NaN());
  compiled.run_into(named(inputs), outs);
  EXPECT_TRUE(tensors_close(outs[0], reference::run(g, inputs, params)[0]));
  // The memory plan reuses the arena: peak well under the no-reuse sum.
  const auto& mem = compiled.compile_result().lir.memory;
  EXPECT_LT(mem.arena_bytes, mem.naive_bytes);
}
