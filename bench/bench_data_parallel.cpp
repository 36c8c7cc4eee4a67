// Data-parallel training throughput of the digits MLP (64 -> 128 -> 10, AdamW),
// global batch 256 (and 2048 in make bench): run alone (world size 1) or as ranks under mpirun or started
// with RANK/WORLD_SIZE (the tcp engine), one core each (the CPU backend's pool is limited to 1 thread per rank).
//
//   bench_data_parallel [--reps N] [--steps K] [--batch B]
//   mpirun -np 2 --bind-to core bench_data_parallel ...
//   RANK=r WORLD_SIZE=2 MASTER_PORT=P taskset -c r bench_data_parallel ...   (r = 0, 1; bench/run.sh does it)
//
// Each rank trains on batch / world rows per step with data_parallel on, so
// the gradients are all-reduced (rank-ordered sums, docs/distributed.md);
// one step of the world processes the global batch. A sample is K steps
// between barriers; rank 0 prints one JSON line per world size
// (workload dp_train_digits_mlp, impl rlx_<W>rank, rlx_<W>rank_tcp for the tcp engine, seconds per step) and the
// samples/s of the global batch to stderr.
#include <cstdio>
#include <cstdlib>

#include "common.hpp"
#include "rlx/distributed/distributed.hpp"
#include "rlx/train/train.hpp"

namespace {

using namespace rlx;

ir::Graph digits_mlp(std::int64_t batch) {
  ir::Graph g("digits_mlp");
  auto x = g.input("x", {batch, 64});
  auto y = g.input("y", {batch}, ir::DType::I64);
  auto h = g.relu(g.linear(x, g.param("w1", {64, 128}), g.param("b1", {128})));
  g.add_output(train::cross_entropy(g, g.linear(h, g.param("w2", {128, 10}), g.param("b2", {10})), y), "loss");
  return g;
}

}  // namespace

int main(int argc, char** argv) try {
  using namespace rlx::bench;
  const int reps = std::atoi(arg(argc, argv, "--reps", "15").c_str());
  const int steps = std::atoi(arg(argc, argv, "--steps", "20").c_str());
  const std::int64_t global = std::atoll(arg(argc, argv, "--batch", "256").c_str());
  auto comm = distributed::init();
  const int world = comm.world_size(), rank = comm.rank();
  if (global % world != 0) throw Error("bench_data_parallel: --batch must divide by the world size");
  const std::int64_t local = global / world;

  train::TensorMap params{{"w1", random_f32({64, 128}, 1)},
                          {"b1", random_f32({128}, 2)},
                          {"w2", random_f32({128, 10}, 3)},
                          {"b2", random_f32({10}, 4)}};
  train::TrainerOptions o;
  o.compile.num_threads = 1;
  o.data_parallel = true;
  train::Trainer trainer(digits_mlp(local), std::move(params), train::AdamW{.lr = 1e-3}, o);
  train::TensorMap batch{{"x", random_f32({local, 64}, 10 + static_cast<std::uint64_t>(rank))}};
  ir::Tensor y(ir::DType::I64, {local});
  for (std::int64_t i = 0; i < local; ++i) y.set(i, static_cast<double>((i * 7 + rank) % 10));
  batch.emplace("y", y);
  std::vector<runtime::NamedTensor> named;
  for (const auto& [n, t] : batch) named.push_back({n, ir::view(t)});

  for (int w = 0; w < 5; ++w) trainer.step(named);
  Samples s{"rlx_" + std::to_string(world) + "rank" + (comm.engine() == "tcp" ? "_tcp" : ""), {}, steps};
  for (int r = 0; r < reps; ++r) {
    comm.barrier();
    const double t0 = now_s();
    for (int k = 0; k < steps; ++k) trainer.step(named);
    comm.barrier();
    s.seconds.push_back((now_s() - t0) / steps);
  }
  if (rank == 0) {
    emit("dp_train_digits_mlp_b" + std::to_string(global), Work{}, {s});
    auto v = s.seconds;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    std::fprintf(stderr, "  dp_train_digits_mlp  %d rank(s) x 1 core (%s): %.3f ms/step, %.0f samples/s\n", world,
                 std::string(comm.engine()).c_str(), v[v.size() / 2] * 1e3,
                 static_cast<double>(global) / v[v.size() / 2]);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_data_parallel: %s\n", e.what());
  return 1;
}
