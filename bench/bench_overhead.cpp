// Per-call cost of the C++ API on a tiny graph (y = x + 1 over 4 floats):
// what is left is the fixed overhead of one run. bench/pyrlx_bench.py compares
// pyrlx's per-call cost with this figure. Prints one JSON line per sample set.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common.hpp"
#include "rlx/runtime/session.hpp"

int main(int argc, char** argv) {
  int reps = argc > 1 ? std::atoi(argv[1]) : 15;
  rlx::ir::Graph g("tiny");
  g.add_output(g.add(g.input("x", {4}), g.scalar(1.0)), "y");
  auto compiled = rlx::Session().compile(g);
  rlx::ir::Tensor x(rlx::ir::DType::F32, {4});
  std::vector<rlx::ir::Tensor> out{rlx::ir::Tensor(rlx::ir::DType::F32, {4})};
  rlx::runtime::NamedTensor in{"x", rlx::ir::view(x)};
  std::span<const rlx::runtime::NamedTensor> inputs(&in, 1);
  auto samples = rlx::bench::interleave({{"cpp_api", [&] { compiled.run_into(inputs, out); }}},
                                        {.reps = reps, .warmup = 100, .min_sample_s = 0.02, .settle_s = 0});
  nlohmann::json rec = {{"workload", "run_overhead_tiny"},
                        {"impl", "cpp_api"},
                        {"samples_s", samples[0].seconds},
                        {"iters", samples[0].iters}};
  std::printf("%s\n", rec.dump().c_str());
}
