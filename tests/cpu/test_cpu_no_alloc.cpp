// ExecutableGraph::run on the CPU backend must not allocate: every plan,
// scratch buffer and pointer table is made at compile time. Global operator
// new is replaced in this test binary (librlx resolves to it too) to count.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "rlx/backends/cpu/cpu_backend.hpp"
#include "rlx/compile/pipeline.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/models/demo_models.hpp"
#include "rlx/runtime/session.hpp"
#include "support/testing.hpp"

namespace {
std::atomic<long> g_news{0};
}  // namespace

// Every replaceable form that allocates, not only the plain one: the nothrow
// form (std::stable_sort's buffer) and the array forms default to the plain one
// in libstdc++, but a sanitizer runtime defines them all itself, and memory from
// its nothrow new must not reach the free() below (ASan: alloc-dealloc-mismatch).
// The aligned forms are left to the runtime with their own deletes.
namespace {
void* counted_malloc(std::size_t n) noexcept {
  g_news.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
}  // namespace
void* operator new(std::size_t n) {
  if (void* p = counted_malloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = counted_malloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted_malloc(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted_malloc(n); }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"  // new above is malloc
#endif
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace rlx::backends::cpu {
namespace {

using ir::DType;
using ir::OpKind;

TEST(CpuNoAlloc, RunAllocatesNothing) {
  // One graph touching every kernel kind: leaf, elementwise, reduce (split
  // and chunked), matmul with epilogue, movement, native.
  ir::Graph g("no alloc");
  auto x = g.input("x", {64, 96});
  auto w = g.param("w", {96, 48});
  auto idx = g.input("idx", {5}, DType::I64);
  auto h = g.relu(g.add(g.matmul(x, w), g.iota({64, 48}, 1, DType::F32)));
  auto s = g.softmax(h, -1);
  auto r = g.sum(g.exp(x), {0});
  auto big = g.sum(g.input("big", {1 << 16}), {0});
  auto t = g.transpose(h);
  auto sel = g.index_select(t, idx, 0);
  auto ln = g.layer_norm(s, std::nullopt, std::nullopt);
  for (auto o : {s, r, big, sel, ln, g.random_uniform({100}, 3)}) g.add_output(o);

  auto backend = make_cpu_backend();
  compile::CompileOptions opts;
  auto result = compile::compile(g, backend->traits(), opts);
  auto exe = backend->compile_lir(result.lir, opts);

  std::mt19937_64 rng(testing::test_seed());
  std::vector<ir::Tensor> inputs;
  for (auto id : result.lir.inputs) {
    const auto& b = result.lir.buffer(id);
    inputs.push_back(b.dtype == DType::I64 ? ir::Tensor(b.dtype, b.shape)
                                           : testing::random_tensor(b.dtype, b.shape, rng));
  }
  std::vector<ir::Tensor> outputs;
  for (auto id : result.lir.outputs) outputs.emplace_back(result.lir.buffer(id).dtype, result.lir.buffer(id).shape);
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  for (auto& t : inputs) in_ptrs.push_back(t.data());
  for (auto& t : outputs) out_ptrs.push_back(t.data());
  for (std::size_t i = 0; i < result.lir.params.size(); ++i) {
    ir::Tensor p = testing::random_tensor(DType::F32, result.lir.buffer(result.lir.params[i]).shape, rng);
    exe->set_param(i, p.data(), p.nbytes());
  }

  exe->run(in_ptrs, out_ptrs);  // warm-up: first touches of lazily created state
  long before = g_news.load();
  for (int i = 0; i < 5; ++i) exe->run(in_ptrs, out_ptrs);
  EXPECT_EQ(g_news.load() - before, 0) << "run() allocated";
  // The counter works: compiling allocates.
  before = g_news.load();
  auto again = backend->compile_lir(result.lir, opts);
  EXPECT_GT(g_news.load() - before, 0);
}

// Host loops (scan, if, while) run nested executables from their pools.
TEST(CpuNoAlloc, HostLoopsAllocateNothing) {
  ir::Graph step("step"), cond("cond"), inc("inc");
  auto h = step.input("h", {8}), xt = step.input("x", {8});
  step.set_outputs({step.unary(OpKind::Tanh, step.add(h, xt)), step.mul(h, xt)});
  auto i = cond.input("i", {}, DType::I32);
  cond.add_output(cond.binary(OpKind::Lt, i, cond.scalar(7, DType::I32)));
  auto j = inc.input("i", {}, DType::I32);
  inc.add_output(inc.add(j, inc.scalar(1, DType::I32)));
  ir::Graph g("loops");
  auto x0 = g.input("h0", {8});
  auto r = ir::scan(g, ir::body_ref(step), {x0}, {g.input("xs", {300, 8})});
  auto p = g.binary(OpKind::Gt, g.sum(r[0], {0}), g.scalar(0));
  auto chosen = ir::if_else(g, p, ir::body_ref(cond), ir::body_ref(cond), {g.scalar(3, DType::I32)});
  auto counted = ir::while_loop(g, ir::body_ref(cond), ir::body_ref(inc), {g.scalar(0, DType::I32)});
  for (auto o : {r[0], r[1], chosen[0], counted[0]}) g.add_output(o);

  auto backend = make_cpu_backend();
  compile::CompileOptions opts;
  opts.scan_unroll_budget = 0;
  auto result = compile::compile(g, backend->traits(), opts);
  auto exe = backend->compile_lir(result.lir, opts);
  std::mt19937_64 rng(testing::test_seed());
  std::vector<ir::Tensor> inputs, outputs;
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  for (auto id : result.lir.inputs)
    inputs.push_back(testing::random_tensor(DType::F32, result.lir.buffer(id).shape, rng));
  for (auto id : result.lir.outputs) outputs.emplace_back(result.lir.buffer(id).dtype, result.lir.buffer(id).shape);
  for (auto& t : inputs) in_ptrs.push_back(t.data());
  for (auto& t : outputs) out_ptrs.push_back(t.data());
  exe->run(in_ptrs, out_ptrs);
  long before = g_news.load();
  for (int k = 0; k < 5; ++k) exe->run(in_ptrs, out_ptrs);
  EXPECT_EQ(g_news.load() - before, 0) << "run() allocated";
  EXPECT_EQ(outputs[3].data_as<std::int32_t>()[0], 7);
}

// The same through CompiledGraph::run_into: checking the inputs, taking the
// run lock (concurrent calls on one graph are serialised) and binding the
// pointers reuse what the first run sized.
TEST(CpuNoAlloc, CompiledGraphRunIntoAllocatesNothing) {
  const auto g = models::mlp({.batch = 4, .width = 32, .layers = 2});
  auto compiled = Session().compile(g);
  for (const auto& [k, v] : models::random_params(g, testing::test_seed())) compiled.set_param(k, v);
  const auto feeds = models::random_inputs(g, testing::test_seed() + 1);
  std::vector<runtime::NamedTensor> inputs;
  for (const auto& [k, v] : feeds) inputs.push_back({k, ir::view(v)});
  std::vector<ir::Tensor> outputs;
  for (const auto& s : compiled.output_specs()) outputs.emplace_back(s.dtype, s.shape);
  compiled.run_into(inputs, outputs);
  const long before = g_news.load();
  for (int k = 0; k < 5; ++k) compiled.run_into(inputs, outputs);
  EXPECT_EQ(g_news.load() - before, 0) << "run_into allocated";
}

}  // namespace
}  // namespace rlx::backends::cpu
