// The NCCL engine at world size 1 on one GPU (its multi-GPU run is a separate
// issue). Skips, saying why, where libnccl.so.2 or a GPU is missing.
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "rlx/distributed/distributed.hpp"
#include "rlx/error.hpp"

namespace {

using namespace rlx;
using distributed::EngineKind;

distributed::Communicator nccl() {
  static const std::string why = distributed::engine_unavailable_reason(EngineKind::Nccl);
  if (!why.empty()) throw std::runtime_error(why);
  return distributed::init({.engine = EngineKind::Nccl, .device = 0});
}

#define RLX_NCCL_OR_SKIP(c)                                  \
  std::optional<distributed::Communicator> c;                \
  try {                                                      \
    c = nccl();                                              \
  } catch (const std::runtime_error& e) {                    \
    GTEST_SKIP() << "nccl engine unavailable: " << e.what(); \
  }

TEST(Nccl, WorldOfOneOnOneGpu) {
  RLX_NCCL_OR_SKIP(c);
  EXPECT_EQ(c->engine(), "nccl");
  EXPECT_EQ(c->world_size(), 1);
  EXPECT_EQ(c->rank(), 0);
  EXPECT_FALSE(c->rank_ordered_sums());
}

TEST(Nccl, CollectivesRoundTripThroughTheGpu) {
  RLX_NCCL_OR_SKIP(c);
  // Every call goes through NCCL on the GPU (Communicator short-cuts nothing at world size 1).
  auto& engine = c;
  std::vector<float> v{1.5F, -2.0F, 3.25F};
  engine->all_reduce(v);
  EXPECT_EQ(v, (std::vector<float>{1.5F, -2.0F, 3.25F}));
  std::vector<float> out(3);
  engine->all_gather(v, out);
  EXPECT_EQ(out, v);
  engine->barrier();
  std::vector<double> d{0.25, 8.0};
  engine->all_reduce(std::span<double>(d), distributed::ReduceOp::Max);
  EXPECT_EQ(d, (std::vector<double>{0.25, 8.0}));
  engine->broadcast(std::span<float>(v), 0);
  EXPECT_EQ(v[2], 3.25F);
  std::vector<float> rs(3);
  engine->reduce_scatter(v, rs);
  EXPECT_EQ(rs, v);
  std::vector<float> bad(4);
  EXPECT_THROW(engine->all_gather(v, bad), Error);
}

}  // namespace
