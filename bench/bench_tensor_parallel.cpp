// A tensor-parallel encoder block against the whole block on one device, in the same run (the multi-GPU issue's
// figure): models::encoder_block cut over the ranks by models::encoder_block_shard (heads and FFN hidden units),
// two all-reduces a block. One process per rank; each rank's graphs run on its GPU under the nccl engine, on the
// CPU otherwise.
//
//   RUN_TCP_ENGINE=nccl bash tests/distributed/run_tcp.sh 2 build/bench/bench_tensor_parallel   (bench/gpu.sh nccl)
//   bash tests/distributed/run_tcp.sh 2 build/bench/bench_tensor_parallel --size small           (here: CPU, tcp)
//
// --size small is issue 15's B1 S128 D512 (8 heads, FFN 2048), large its B8 S512 D1024 (16 heads, FFN 4096).
// A step maps x to the block's y and leaves y where the next block reads it, as a stack of blocks does:
//   one device:  x is a handle, and y is fed back into it (feed_handle), so nothing crosses to the host;
//   resident:    (an engine that takes device memory, and a backend with handle_addresses: nccl with CUDA)
//                the attention part's output is fed into its own x handle, all-reduced out of place straight
//                into the FFN part's x1 handle, whose output is fed back into x1 and all-reduced into the
//                attention part's x: every byte stays on the GPUs;
//   host:        otherwise, each part's output comes back to the host and is all-reduced there.
// Before timing, one step is checked against the whole block (within 1e-4 of its largest |y|). Rank 0 prints a
// JSON line per implementation (median seconds a step) and the speed-up of the sharded block over the whole one.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "common.hpp"
#include "rlx/compile/shard.hpp"
#include "rlx/distributed/distributed.hpp"
#include "rlx/error.hpp"
#include "rlx/models/demo_models.hpp"
#include "rlx/runtime/session.hpp"

namespace {

using namespace rlx;
namespace dist = rlx::distributed;

dist::Buffer device_buffer(const runtime::DeviceAddress& a) {
  return {a.data, a.bytes / sizeof(float), ir::DType::F32, dist::Memory::Device};
}
dist::ConstBuffer device_input(const runtime::DeviceAddress& a) {
  return {a.data, a.bytes / sizeof(float), ir::DType::F32, dist::Memory::Device};
}

}  // namespace

int main(int argc, char** argv) try {
  using namespace rlx::bench;
  const std::string size = arg(argc, argv, "--size", "large");
  const int reps = std::atoi(arg(argc, argv, "--reps", "20").c_str());
  if ((size != "small" && size != "large") || reps < 1)
    throw Error("bench_tensor_parallel: --size is small or large, --reps at least 1");
  const models::EncoderConfig c =
      size == "small" ? models::EncoderConfig{.batch = 1, .seq = 128, .d_model = 512, .heads = 8, .d_ff = 2048}
                      : models::EncoderConfig{.batch = 8, .seq = 512, .d_model = 1024, .heads = 16, .d_ff = 4096};
  auto comm = dist::init();
  const int world = comm.world_size(), rank = comm.rank();
  const runtime::Device device = comm.engine() == "nccl" ? runtime::Device::Cuda : runtime::Device::Cpu;
  runtime::Session session(device);
  const ir::Graph whole_graph = models::encoder_block(c);
  const auto params = models::random_params(whole_graph, 5);
  const ir::Tensor x = models::random_inputs(whole_graph, 6).at("x");
  const auto set_params = [](runtime::CompiledGraph& g, const auto& values) {
    for (const auto& spec : g.param_specs()) g.set_param(spec.name, values.at(spec.name));
  };
  const std::vector<runtime::NamedTensor> none;
  const std::vector<std::size_t> no_outputs;

  // The whole block on this rank's device: x in a handle, y fed back into it.
  auto whole = session.compile(whole_graph);
  set_params(whole, params);
  const ir::Tensor want = whole.run({{"x", x}})[0];
  whole.bind_handle("x", ir::view(x));
  whole.feed_handle("x", "y");
  const std::function<void()> whole_step = [&] { whole.run_read_outputs(none, no_outputs); };

  // This rank's shard (one per rank: the ranks are the shards).
  const auto heads = compile::shard::split_extent(c.heads, world);
  const auto hidden = compile::shard::split_extent(c.d_ff, world);
  if (heads.size() != static_cast<std::size_t>(world))
    throw Error("bench_tensor_parallel: " + std::to_string(world) + " ranks for " + std::to_string(c.heads) + " heads");
  const auto i = static_cast<std::size_t>(rank);
  const models::EncoderShardRange range{heads[i].start, heads[i].length, hidden[i].start, hidden[i].length, rank == 0};
  const models::EncoderShard parts = models::encoder_block_shard(c, range);
  const auto shard_params = models::encoder_shard_params(params, c, range);
  auto attention = session.compile(parts.attention);
  auto ffn = session.compile(parts.ffn);
  set_params(attention, shard_params);
  set_params(ffn, shard_params);
  const bool resident = comm.takes_device_memory() && attention.capabilities().handle_addresses;
  ir::Tensor x1(ir::DType::F32, {c.batch, c.seq, c.d_model}), cur = x;
  std::function<void()> tp_step;
  std::function<ir::Tensor()> tp_output;
  if (resident) {
    attention.bind_handle("x", ir::view(x));
    attention.feed_handle("x", "partial");
    ffn.bind_handle("x1", ir::view(x1));
    ffn.feed_handle("x1", "partial");
    const runtime::DeviceAddress ax = attention.handle_address("x"), fx = ffn.handle_address("x1");
    tp_step = [&, ax, fx] {
      attention.run_read_outputs(none, no_outputs);
      comm.all_reduce(device_input(ax), device_buffer(fx));  // x1 = x + attention, on every rank
      ffn.run_read_outputs(none, no_outputs);
      comm.all_reduce(device_input(fx), device_buffer(ax));  // y: the next step's x
    };
    tp_output = [&] { return attention.read_handle("x"); };
  } else {
    tp_step = [&] {
      x1 = attention.run({{"x", cur}})[0];
      comm.all_reduce(x1);
      cur = ffn.run({{"x1", x1}})[0];
      comm.all_reduce(cur);  // y: the next step's x
    };
    tp_output = [&] { return cur; };
  }
  tp_step();
  const double gap = max_abs_diff(tp_output(), want), scale = max_abs(want);
  if (!(gap <= 1e-4 * std::max(1.0, scale)))
    throw Error("bench_tensor_parallel: rank " + std::to_string(rank) + ": the sharded block is " +
                std::to_string(gap) + " from the whole block's y (largest |y| " + std::to_string(scale) + ")");

  const auto time = [&](const std::function<void()>& step) {
    for (int w = 0; w < 3; ++w) step();
    std::vector<double> seconds;
    for (int k = 0; k < reps; ++k) {
      comm.barrier();
      const double t0 = now_s();
      step();
      seconds.push_back(now_s() - t0);
    }
    return seconds;
  };
  const std::string dev(runtime::device_label(device));
  const std::string workload = "tp_encoder_" + size;
  Samples one{"rlx_" + dev + "_whole", time(whole_step), 1};
  Samples tp{"rlx_" + dev + "_tp" + std::to_string(world) + (resident ? "_resident" : "_host"), time(tp_step), 1};
  if (rank == 0) {
    emit(workload, Work{}, {one, tp});
    const auto median = [](std::vector<double> v) {
      std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
      return v[v.size() / 2];
    };
    std::fprintf(stderr,
                 "  %s B%lld S%lld D%lld on %s: whole block %.3f ms, %d-way tensor parallel (%s, engine %s) %.3f ms: "
                 "%.2fx; first step within %.1e of the whole block\n",
                 workload.c_str(), static_cast<long long>(c.batch), static_cast<long long>(c.seq),
                 static_cast<long long>(c.d_model), dev.c_str(), median(one.seconds) * 1e3, world,
                 resident ? "resident" : "through the host", std::string(comm.engine()).c_str(),
                 median(tp.seconds) * 1e3, median(one.seconds) / median(tp.seconds), gap);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_tensor_parallel: %s\n", e.what());
  return 1;
}
