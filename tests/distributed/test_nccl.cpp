// The NCCL engine at world size 1 on one GPU (its multi-GPU run is a separate
// issue). Skips, saying why, where libnccl.so.2 or a GPU is missing.
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "rlx/distributed/distributed.hpp"
#include "rlx/error.hpp"
#include "rlx/runtime/session.hpp"

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

TEST(Nccl, DeviceMemoryIsTakenAsItIs) {
  RLX_NCCL_OR_SKIP(c);
  EXPECT_TRUE(c->takes_device_memory());
  EXPECT_EQ(c->device(), runtime::gpu());  // the CUDA backend runs on the engine's GPU
  std::vector<float> v{1.5F, -2.0F, 3.25F, 8.0F}, got(4);
  auto m = c->allocate_device(v.size() * sizeof(float));
  m->upload(std::as_bytes(std::span<const float>(v)));
  auto sum = c->allocate_device(v.size() * sizeof(float));
  c->all_reduce(m->const_buffer(ir::DType::F32, 4), sum->buffer(ir::DType::F32, 4));  // out of place: a copy
  sum->download(std::as_writable_bytes(std::span<float>(got)));
  EXPECT_EQ(got, v);
  auto out = c->allocate_device(2 * sizeof(float));
  c->all_gather(m->const_buffer(ir::DType::F32, 2, 2), out->buffer(ir::DType::F32, 2));
  std::vector<float> two(2);
  out->download(std::as_writable_bytes(std::span<float>(two)));
  EXPECT_EQ(two, (std::vector<float>{3.25F, 8.0F}));
  EXPECT_THROW(m->buffer(ir::DType::F32, 5), Error);
  EXPECT_THROW(c->all_gather(m->const_buffer(ir::DType::F32, 2), distributed::Buffer{two.data(), 2}), Error);
}

// A CUDA graph's handle, written in place by a collective through its device address: the next run reads what
// the collective wrote, with nothing copied through the host.
TEST(Nccl, ACudaHandleIsWrittenInPlaceThroughItsDeviceAddress) {
  RLX_NCCL_OR_SKIP(c);
  try {
    runtime::make_backend(runtime::Device::Cuda);
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  ir::Graph g("handle_plus_x");
  auto x = g.input("x", {4});
  g.add_output(g.add(x, g.input("state", {4})), "y");
  auto compiled = runtime::Session(runtime::Device::Cuda).compile(g);
  ASSERT_TRUE(compiled.capabilities().handle_addresses);
  compiled.bind_handle("state", ir::view(ir::Tensor::from_f32({4}, std::vector<float>{1, 2, 3, 4})));
  const runtime::DeviceAddress a = compiled.handle_address("state");
  EXPECT_EQ(a.bytes, 4 * sizeof(float));
  EXPECT_EQ(a.gpu, c->device());
  // At world size 1 an all_gather copies its input: new values into the handle, on the GPU.
  std::vector<float> next{10, 20, 30, 40};
  auto m = c->allocate_device(16);
  m->upload(std::as_bytes(std::span<const float>(next)));
  c->all_gather(m->const_buffer(ir::DType::F32, 4),
                distributed::Buffer{a.data, 4, ir::DType::F32, distributed::Memory::Device});
  const ir::Tensor y = compiled.run({{"x", ir::Tensor::from_f32({4}, std::vector<float>{0.5F, 0.5F, 0.5F, 0.5F})}})[0];
  EXPECT_EQ(y.data_as<float>()[0], 10.5F);
  EXPECT_EQ(y.data_as<float>()[3], 40.5F);
  // And the reverse: the handle as a collective's input, reduced out of place into other memory.
  auto copy = c->allocate_device(16);
  c->all_reduce(distributed::ConstBuffer{a.data, 4, ir::DType::F32, distributed::Memory::Device},
                copy->buffer(ir::DType::F32, 4));
  std::vector<float> back(4);
  copy->download(std::as_writable_bytes(std::span<float>(back)));
  EXPECT_EQ(back, next);
}

}  // namespace
