// Memory planning: buffers live at the same time never share bytes, the arena
// is no larger than the sum of buffers, and graph outputs survive to the end.
#include <random>
#include <set>

#include "compile/lir_exec.hpp"
#include "rlx/compile/pipeline.hpp"
#include "support/testing.hpp"

namespace rlx {
namespace {

using compile::Buffer;
using compile::BufferId;
using compile::BufferRole;
using compile::Kernel;
using compile::LirModule;

// Live ranges recomputed independently of the planner: [first write, last
// read of the buffer or any view of it], outputs to the end.
std::vector<std::pair<std::int64_t, std::int64_t>> live_ranges(const LirModule& m) {
  std::vector<std::pair<std::int64_t, std::int64_t>> r(m.buffers.size(), {-1, -1});
  auto touch = [&](BufferId b, std::int64_t k) {
    auto& [lo, hi] = r[std::size_t(m.buffer(b).root)];
    if (lo < 0) lo = k;
    hi = std::max(hi, k);
  };
  for (std::size_t k = 0; k < m.kernels.size(); ++k) {
    for (auto b : m.kernels[k].outputs) touch(b, std::int64_t(k));
    for (auto b : m.kernels[k].inputs) touch(b, std::int64_t(k));
  }
  for (auto b : m.outputs) touch(b, std::int64_t(m.kernels.size()));
  return r;
}

::testing::AssertionResult plan_is_sound(const LirModule& m) {
  auto live = live_ranges(m);
  std::int64_t naive = 0;
  std::vector<const Buffer*> roots;
  for (const auto& b : m.buffers) {
    if (b.root != b.id) {
      if (b.arena_offset >= 0 && b.arena_offset != m.buffer(b.root).arena_offset)
        return ::testing::AssertionFailure() << "view b" << b.id << " has its own arena space";
      continue;
    }
    if (b.role != BufferRole::Arena) continue;
    if (b.arena_offset < 0 || b.arena_offset % m.memory.alignment)
      return ::testing::AssertionFailure() << "b" << b.id << " offset " << b.arena_offset;
    if (b.arena_offset + b.nbytes() > m.memory.arena_bytes)
      return ::testing::AssertionFailure() << "b" << b.id << " past the arena end";
    naive += (b.nbytes() + m.memory.alignment - 1) / m.memory.alignment * m.memory.alignment;
    if (b.nbytes() > 0) roots.push_back(&b);
  }
  if (naive != m.memory.naive_bytes)
    return ::testing::AssertionFailure() << "naive " << m.memory.naive_bytes << " != " << naive;
  if (m.memory.arena_bytes > m.memory.naive_bytes) return ::testing::AssertionFailure() << "arena larger than naive";
  for (auto* a : roots)
    for (auto* b : roots) {
      if (a->id >= b->id) continue;
      auto [a0, a1] = live[std::size_t(a->id)];
      auto [b0, b1] = live[std::size_t(b->id)];
      bool together = a0 <= b1 && b0 <= a1;
      bool overlap = a->arena_offset < b->arena_offset + b->nbytes() && b->arena_offset < a->arena_offset + a->nbytes();
      if (together && overlap)
        return ::testing::AssertionFailure() << "b" << a->id << " and b" << b->id << " are live together and overlap";
    }
  return ::testing::AssertionSuccess();
}

// A hand-built chain: k_i reads buffer i-1 and writes buffer i.
LirModule chain(const std::vector<std::int64_t>& sizes, std::vector<BufferId> outputs) {
  LirModule m;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    Buffer b;
    b.id = b.root = BufferId(i);
    b.shape = {sizes[i]};
    m.buffers.push_back(b);
    Kernel k;
    if (i) k.inputs = {BufferId(i - 1)};
    k.outputs = {BufferId(i)};
    m.kernels.push_back(std::move(k));
  }
  m.outputs = std::move(outputs);
  return m;
}

TEST(Memory, ChainReusesMemory) {
  auto m = chain({16, 16, 16, 16}, {3});
  compile::passes::plan_memory(m, 64);
  EXPECT_TRUE(plan_is_sound(m));
  EXPECT_EQ(m.memory.naive_bytes, 4 * 64);
  EXPECT_EQ(m.memory.arena_bytes, 2 * 64);  // ping-pong
}

TEST(Memory, OutputsSurviveToTheEnd) {
  auto m = chain({16, 16, 16, 16}, {0, 3});
  compile::passes::plan_memory(m, 64);
  EXPECT_TRUE(plan_is_sound(m));
  for (BufferId b : {1, 2, 3}) EXPECT_NE(m.buffer(b).arena_offset, m.buffer(0).arena_offset);
}

TEST(Memory, ViewsExtendTheirRootAndTakeNoSpace) {
  auto m = chain({16, 16, 16}, {2});
  Buffer v = m.buffers[0];
  v.id = 3;
  v.root = 0;
  m.buffers.push_back(v);
  m.kernels[2].inputs.push_back(3);  // the last kernel reads buffer 0 through a view
  compile::passes::plan_memory(m, 64);
  EXPECT_TRUE(plan_is_sound(m));
  EXPECT_EQ(m.memory.view_count, 1);
  EXPECT_EQ(m.buffer(3).arena_offset, -1);
  EXPECT_EQ(m.memory.arena_bytes, 3 * 64);
}

TEST(Memory, ZeroSizeBuffersTakeNoSpaceAndAlignmentIsRespected) {
  auto m = chain({0, 3, 5}, {2});
  compile::passes::plan_memory(m, 16);
  EXPECT_TRUE(plan_is_sound(m));
  EXPECT_EQ(m.memory.naive_bytes, 16 + 32);
  EXPECT_EQ(m.memory.arena_bytes, 16 + 32);
  EXPECT_EQ(m.memory.alignment, 16);
}

TEST(Memory, WithoutReuseAcrossDtypesEachByteHoldsOneDtype) {
  // f32, i32, f32, i32: the ping-pong of ChainReusesMemory, but i32 may not take an f32's bytes.
  auto m = chain({16, 16, 16, 16}, {3});
  m.buffers[1].dtype = m.buffers[3].dtype = ir::DType::I32;
  compile::passes::plan_memory(m, 64);
  EXPECT_EQ(m.memory.arena_bytes, 2 * 64);  // reuse across dtypes: still a ping-pong
  compile::passes::plan_memory(m, 64, false);
  EXPECT_TRUE(plan_is_sound(m));
  EXPECT_EQ(m.memory.arena_bytes, 2 * 64);  // f32 over f32, i32 over i32
  EXPECT_EQ(m.buffer(0).arena_offset, m.buffer(2).arena_offset);
  EXPECT_EQ(m.buffer(1).arena_offset, m.buffer(3).arena_offset);
  m.buffers[2].dtype = ir::DType::U8;  // 16 bytes: one aligned slot, as the others
  compile::passes::plan_memory(m, 64, false);
  EXPECT_TRUE(plan_is_sound(m));
  EXPECT_EQ(m.memory.arena_bytes, 3 * 64);
  std::set<std::int64_t> offsets{m.buffer(0).arena_offset, m.buffer(1).arena_offset, m.buffer(2).arena_offset};
  EXPECT_EQ(offsets.size(), 3u);
}

TEST(Memory, BestFitFillsTheGapLeftByABigBuffer) {
  // k0 writes a (big, dies at k1), k1 writes b, k2 writes c (small, fits where a was).
  auto m = chain({256, 16, 16}, {2});
  compile::passes::plan_memory(m, 64);
  EXPECT_TRUE(plan_is_sound(m));
  EXPECT_EQ(m.memory.arena_bytes, 1024 + 64);
}

TEST(Memory, RandomGraphsHaveSoundPlansAndRunCorrectly) {
  std::mt19937_64 rng(testing::test_seed());
  for (int trial = 0; trial < 60; ++trial) {
    auto g = testing::random_mir(rng, 10 + trial % 30);
    SCOPED_TRACE(ir::to_text(g));
    auto lir = compile::passes::lower_to_lir(g, testing::all_primitives(), nullptr);
    compile::passes::plan_memory(lir, trial % 2 ? 64 : 4);
    ASSERT_TRUE(plan_is_sound(lir)) << lir.to_text();
    // Run on a poisoned arena: an overlap or a clobbered output changes results.
    auto [in, params] = testing::random_feeds(g, rng);
    auto want = reference::run(g, in, params);
    auto got = testing::run_lir(lir, in, params);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_TRUE(testing::tensors_close(got[i], want[i])) << "output " << i << "\n" << lir.to_text();
  }
}

}  // namespace
}  // namespace rlx
