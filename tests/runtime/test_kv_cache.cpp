// A KV cache as a handle: dynamic_update_slice appends rows at a run-time position, and the output is fed
// back to the handle. The CPU computes that output over the handle itself (Plan's donation) when nothing
// else reads the cache; these check that every step's cache and the values read from it are the reference's,
// in both the donated case and the ones where donation must be refused.
#include <gtest/gtest.h>

#include <random>

#include "rlx/reference/interpreter.hpp"
#include "rlx/runtime/session.hpp"
#include "support/devices.hpp"
#include "support/testing.hpp"

using namespace rlx;
using runtime::Device;

namespace {

constexpr std::int64_t kHeads = 3, kRows = 16, kDim = 4, kStep = 2;

// cache [3, 16, 4] <- rows [3, 2, 4] at pos; outputs: the new cache, and a value read from it (a sum over
// each head's rows). With `read_old`, also the old cache's sum, which forbids writing over it.
ir::Graph cache_graph(bool read_old) {
  ir::Graph g("kv");
  auto cache = g.input("cache", {kHeads, kRows, kDim});
  auto rows = g.input("rows", {kHeads, kStep, kDim});
  auto pos = g.input("pos", ir::Shape{1}, ir::DType::I32);
  auto next = g.dynamic_update_slice(cache, rows, pos, 1);
  g.add_output(next, "cache.out");
  g.add_output(g.sum(g.mul(next, next), {1}), "read");
  if (read_old) g.add_output(g.sum(cache, {1}), "old");
  return g;
}

class KvCache : public rlx::testing::DeviceTest {};

TEST_P(KvCache, AppendsInPlaceAndReadsBackTheReference) {
  for (const bool read_old : {false, true}) {
    SCOPED_TRACE(read_old ? "the old cache is read too" : "only the update reads the cache");
    const ir::Graph g = cache_graph(read_old);
    runtime::Session session(GetParam());
    auto c = session.compile(g);
    if (!c.capabilities().kv_resident) GTEST_SKIP() << "the backend keeps no handles (kv_resident)";
    std::mt19937_64 rng(11);
    ir::Tensor want = rlx::testing::random_tensor(ir::DType::F32, {kHeads, kRows, kDim}, rng);
    c.bind_handle("cache", ir::view(want));
    c.feed_handle("cache", "cache.out");
    // Past the end, the start clamps (XLA's rule): the last step writes the last two rows again.
    for (std::int32_t p : {0, 2, 4, 9, 14, 15}) {
      ir::Tensor rows = rlx::testing::random_tensor(ir::DType::F32, {kHeads, kStep, kDim}, rng);
      ir::Tensor pos(ir::DType::I32, {1});
      pos.data_as<std::int32_t>()[0] = p;
      const reference::TensorMap in{{"cache", want}, {"rows", rows}, {"pos", pos}};
      const auto ref = reference::run(g, in, {});
      std::vector<runtime::NamedTensor> run_in{{"rows", ir::view(rows)}, {"pos", ir::view(pos)}};
      std::vector<std::size_t> read{1};
      if (read_old) read.push_back(2);
      const auto got = c.run_read_outputs(run_in, read);
      EXPECT_TRUE(rlx::testing::tensors_close(got[0], ref[1])) << "step at " << p;
      if (read_old) {
        EXPECT_TRUE(rlx::testing::tensors_close(got[1], ref[2])) << "step at " << p;
      }
      want = ref[0];
      EXPECT_TRUE(rlx::testing::tensors_close(c.read_handle("cache"), want)) << "step at " << p;
    }
    // Every output read back: the fed output is copied out as well.
    ir::Tensor rows = rlx::testing::random_tensor(ir::DType::F32, {kHeads, kStep, kDim}, rng), pos(ir::DType::I32, {1});
    pos.data_as<std::int32_t>()[0] = 5;
    const auto ref = reference::run(g, {{"cache", want}, {"rows", rows}, {"pos", pos}}, {});
    const std::vector<runtime::NamedTensor> run_in{{"rows", ir::view(rows)}, {"pos", ir::view(pos)}};
    const auto all = c.run(run_in);
    EXPECT_TRUE(rlx::testing::tensors_close(all[0], ref[0]));
    EXPECT_TRUE(rlx::testing::tensors_close(c.read_handle("cache"), ref[0]));
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, KvCache, ::testing::Values(Device::Cpu, Device::Vulkan), rlx::testing::device_name);

}  // namespace
