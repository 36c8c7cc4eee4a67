// Data-parallel training of the digits MLP. Under mpirun -np 2 (CTest's
// distributed_mpirun_data_parallel) each rank trains on its half of every
// global batch with the gradients all-reduced, and every rank also trains a
// single-process Trainer on the whole global batch as 2 micro-batches: the
// final weights must be equal bit for bit. Under plain ctest (world size 1)
// the same comparison runs against micro-batch accumulation alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "distributed/digits_mlp.hpp"
#include "rlx/distributed/distributed.hpp"
#include "rlx/error.hpp"

namespace {

using namespace rlx;

constexpr std::int64_t kGlobalBatch = 64;
constexpr int kSteps = 12;

// Where the data-parallel ranks train: on their GPUs under the nccl engine (bench/gpu.sh nccl, one GPU per rank,
// and the one-process reference on the same GPU), on the CPU under every other engine.
runtime::Device rank_device() {
  return distributed::init().engine() == "nccl" ? runtime::Device::Cuda : runtime::Device::Cpu;
}

train::TrainerOptions options(int micro_batches, bool data_parallel, runtime::Device device = runtime::Device::Cpu) {
  train::TrainerOptions o;
  o.device = device;
  o.compile.num_threads = 1;  // one core per rank, as the benchmark runs
  o.micro_batches = micro_batches;
  o.data_parallel = data_parallel;
  return o;
}

// Rows [lo, lo + rows) of batch `step` of the dataset (batches wrap around it).
train::TensorMap batch(const test::Digits& d, int step, std::int64_t lo, std::int64_t rows) {
  std::vector<float> x;
  ir::Tensor y(ir::DType::I64, {rows});
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int64_t row = (step * kGlobalBatch + lo + i) % d.n;
    x.insert(x.end(), d.x.begin() + row * 64, d.x.begin() + (row + 1) * 64);
    y.set(i, static_cast<double>(d.y[static_cast<std::size_t>(row)]));
  }
  return {{"x", ir::Tensor::from_f32({rows, 64}, x)}, {"y", y}};
}

void expect_bit_identical(const train::Trainer& a, const train::Trainer& b) {
  for (const auto& [name, t] : a.params()) {
    const ir::Tensor& u = b.param(name);
    ASSERT_EQ(t.nbytes(), u.nbytes()) << name;
    EXPECT_EQ(std::memcmp(t.data(), u.data(), t.nbytes()), 0) << "param " << name << " differs";
  }
}

TEST(DataParallel, RanksTrainBitIdenticalToOneProcessWithMicroBatches) {
  auto comm = distributed::init();
  const int world = comm.world_size(), rank = comm.rank();
  if (kGlobalBatch % world != 0) GTEST_SKIP() << "world size " << world << " does not divide the batch";
  const std::int64_t local = kGlobalBatch / world;
  const auto data = test::load_digits(512);
  std::printf("rank %d of %d (%s): data: %s\n", rank, world, std::string(comm.engine()).c_str(), data.source.c_str());

  // Each rank: its share, one micro-batch of `local` rows; the gradients all-reduced over `world` ranks.
  const runtime::Device device = rank_device();
  std::printf("training on %s\n", std::string(runtime::device_label(device)).c_str());
  train::Trainer dp(test::digits_mlp(local), test::digits_params(7), train::AdamW{.lr = 3e-3},
                    options(1, true, device));
  // The reference, in this same process: the whole global batch as `world` micro-batches of `local` rows.
  train::Trainer single(test::digits_mlp(local), test::digits_params(7), train::AdamW{.lr = 3e-3},
                        options(world, false, device));
  ASSERT_EQ(dp.communicator()->world_size(), world);
  // Rank-ordered sums (mpi, tcp, local) equal the micro-batches' sum bit for bit; so does any engine's at 2 ranks
  // (a + b == b + a). NCCL's order over more ranks is its own: then within 1e-6.
  const bool exact = comm.rank_ordered_sums() || world <= 2;
  double first = 0, last = 0;
  for (int s = 0; s < kSteps; ++s) {
    const double l_dp = dp.step(batch(data, s, rank * local, local));
    const double l_single = single.step(batch(data, s, 0, kGlobalBatch));
    if (exact)
      EXPECT_EQ(l_dp, l_single) << "step " << s;  // the mean loss over the global batch, on every rank
    else
      EXPECT_NEAR(l_dp, l_single, 1e-6 * std::abs(l_single)) << "step " << s;
    if (s == 0) first = l_dp;
    last = l_dp;
  }
  if (exact) {
    expect_bit_identical(dp, single);
  } else {
    for (const auto& [name, t] : single.params()) {
      const ir::Tensor& u = dp.param(name);
      for (std::int64_t i = 0; i < t.numel(); ++i)
        ASSERT_NEAR(u.get(i), t.get(i), 1e-6 * std::max(1.0, std::abs(t.get(i)))) << name << "[" << i << "]";
    }
  }
  EXPECT_LT(last, first);  // and it learns
  EXPECT_EQ(dp.steps(), kSteps);
}

// Rank 0 of a world of 2 whose other rank always holds what this one holds: a test double behind the Engine
// interface, so the Trainer's all-reduce and broadcast paths run without mpirun.
class MirrorEngine final : public distributed::Engine {
 public:
  std::string_view name() const override { return "mirror"; }
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  void all_gather(distributed::ConstBuffer in, distributed::Buffer out) override {
    std::memcpy(out.data, in.data, in.bytes());
    std::memcpy(static_cast<std::byte*>(out.data) + in.bytes(), in.data, in.bytes());
    ++gathers;
  }
  void broadcast(distributed::Buffer, int) override { ++broadcasts; }
  void send(distributed::ConstBuffer, int) override {}
  void recv(distributed::Buffer, int) override {}
  void barrier() override {}
  int gathers = 0, broadcasts = 0;
};

TEST(DataParallel, AnEngineBehindTheInterfaceCarriesTheGradients) {
  // Both "ranks" train on the same 32 rows, so the world's step equals one process's on those rows twice over,
  // as 2 micro-batches.
  auto engine = std::make_shared<MirrorEngine>();
  train::TrainerOptions o = options(1, true);
  o.communicator = distributed::Communicator(engine);
  train::Trainer dp(test::digits_mlp(32), test::digits_params(5), train::Adam{.lr = 1e-2}, o);
  EXPECT_EQ(engine->broadcasts, 4);  // every param from rank 0
  train::Trainer single(test::digits_mlp(32), test::digits_params(5), train::Adam{.lr = 1e-2}, options(2, false));
  const auto data = test::load_digits(128);
  for (int s = 0; s < 4; ++s) {
    auto half = batch(data, s, 0, 32);
    train::TensorMap twice;
    for (const auto& [name, t] : half) {
      std::vector<std::int64_t> shape = t.shape();
      shape[0] *= 2;
      std::vector<std::byte> bytes(t.data(), t.data() + t.nbytes());
      bytes.insert(bytes.end(), t.data(), t.data() + t.nbytes());
      twice.emplace(name, ir::Tensor(t.dtype(), shape, bytes));
    }
    EXPECT_EQ(dp.step(half), single.step(twice)) << "step " << s;
  }
  EXPECT_EQ(engine->gathers, 4 * 2);  // per step: the gradients in one buffer, and the loss
  expect_bit_identical(dp, single);
}

TEST(DataParallel, MicroBatchesMatchTheSumOfTheirGradients) {
  // Two micro-batches of 32 against a hand-made step: the grad graph run on each half, summed, halved, and the
  // update applied with plain SGD (p - lr * g), which the fused step and the update graph compute alike.
  const auto data = test::load_digits(128);
  train::TrainerOptions o = options(2, false);
  train::Trainer acc(test::digits_mlp(32), test::digits_params(3), train::Sgd{.lr = 0.5}, o);
  const auto full = batch(data, 0, 0, 64);
  acc.step(full);

  ir::Graph vg = train::params_to_inputs(
      autodiff::value_and_grad(test::digits_mlp(32), std::vector<std::string>{"w1", "b1", "w2", "b2"}));
  compile::CompileOptions copts;
  copts.num_threads = 1;
  auto compiled = runtime::Session().compile(vg, copts);
  auto p0 = test::digits_params(3);
  std::map<std::string, std::vector<float>> sum;
  for (int half = 0; half < 2; ++half) {
    auto b = batch(data, 0, 32 * half, 32);
    train::TensorMap in(p0.begin(), p0.end());
    in.insert(b.begin(), b.end());
    const auto out = compiled.run(in);  // loss, then grad_w1, grad_b1, grad_w2, grad_b2
    int j = 0;
    for (const auto& name : {"w1", "b1", "w2", "b2"}) {
      const ir::Tensor& g = out.at(static_cast<std::size_t>(++j));
      auto& s = sum[name];
      if (s.empty())
        s.assign(g.data_as<float>(), g.data_as<float>() + g.numel());
      else
        for (std::int64_t i = 0; i < g.numel(); ++i) s[i] += g.data_as<float>()[i];
    }
  }
  for (const auto& name : {"w1", "b1", "w2", "b2"}) {
    const ir::Tensor& p = p0.at(name);
    const ir::Tensor& now = acc.param(name);
    for (std::int64_t i = 0; i < p.numel(); ++i) {
      const float want = p.data_as<float>()[i] - 0.5F * (sum[name][i] / 2.0F);
      ASSERT_EQ(now.data_as<float>()[i], want) << name << "[" << i << "]";
    }
  }
}

TEST(DataParallel, MixedF32AndF64ParamsReduceEachInItsOwnDtype) {
  // pred = f64(x @ w) * s, an f32 weight and an f64 scale: the gradients do not share a dtype, so each is
  // all-reduced on its own (the f64 one aligned after the f32 one in the trainer's buffer).
  auto comm = distributed::init();
  const int world = comm.world_size(), rank = comm.rank();
  const std::int64_t local = 4, global = local * world;
  const auto model = [&] {
    ir::Graph g("mixed");
    auto x = g.input("x", {local, 3});
    auto t = g.input("t", {local, 1}, ir::DType::F64);
    auto pred = g.mul(g.cast(g.matmul(x, g.param("w", {3, 1})), ir::DType::F64), g.param("s", {1}, ir::DType::F64));
    g.add_output(train::mse(g, pred, t), "loss");
    return g;
  };
  const auto init = [] {
    return train::TensorMap{{"w", ir::Tensor::from_f32({3, 1}, std::vector<float>{0.5F, -0.25F, 1.0F})},
                            {"s", ir::Tensor::from_f64(ir::DType::F64, {1}, std::vector<double>{1.5})}};
  };
  const auto data = [&](std::int64_t lo, std::int64_t rows) {
    std::vector<float> x;
    std::vector<double> t;
    for (std::int64_t i = lo; i < lo + rows; ++i) {
      x.insert(x.end(), {0.1F * static_cast<float>(i), 1.0F - 0.2F * static_cast<float>(i), 0.3F});
      t.push_back(0.7 * static_cast<double>(i) - 0.1);
    }
    return train::TensorMap{{"x", ir::Tensor::from_f32({rows, 3}, x)},
                            {"t", ir::Tensor::from_f64(ir::DType::F64, {rows, 1}, t)}};
  };
  train::Trainer dp(model(), init(), train::Adam{.lr = 0.05}, options(1, true));
  train::Trainer single(model(), init(), train::Adam{.lr = 0.05}, options(world, false));
  for (int step = 0; step < 5; ++step) {
    EXPECT_EQ(dp.step(data(rank * local, local)), single.step(data(0, global))) << "step " << step;
  }
  expect_bit_identical(dp, single);
  EXPECT_NE(dp.param("s").get(0), 1.5);  // it trained
}

TEST(DataParallel, InputsMustHoldWholeMicroBatches) {
  train::Trainer t(test::digits_mlp(16), test::digits_params(1), train::Sgd{}, options(2, false));
  const auto data = test::load_digits(64);
  try {
    t.step(batch(data, 0, 0, 16));  // one micro-batch's worth, not two
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input 'x'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("micro_batches=2"), std::string::npos) << e.what();
  }
  EXPECT_EQ(t.steps(), 0);
  EXPECT_THROW(train::Trainer(test::digits_mlp(16), test::digits_params(1), train::Sgd{}, options(0, false)), Error);
}

}  // namespace
