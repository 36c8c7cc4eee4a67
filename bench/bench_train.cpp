// One training step of the benchmark MLP (batch 64, width 1024, 2 layers,
// cross-entropy over 1024 classes) against its forward pass alone.
//
//   bench_train [--reps N] [--threads T]
//
// Per optimiser, one workload with three impls, timed interleaved:
//   rlx                    Trainer::step: forward + backward + update, one graph
//   rlx_forward            the model and loss compiled alone with the weights as
//                          params, as for inference (the CPU backend packs
//                          constant GEMM operands once, at set_param)
//   rlx_forward_as_inputs  the same forward with the weights as inputs, as the
//                          step sees them: they change every step, so no packing
// The figure, (step - forward) / forward, i.e. backward + update over
// forward, goes to stderr against both forwards; report.py's speed column for
// each pair is forward / step.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common.hpp"
#include "rlx/models/demo_models.hpp"
#include "rlx/train/train.hpp"

namespace {

using namespace rlx;
using namespace rlx::bench;

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) try {
  Timing timing;
  timing.reps = std::atoi(arg(argc, argv, "--reps", "15").c_str());
  compile::CompileOptions copts;
  copts.num_threads = std::atoi(arg(argc, argv, "--threads", "0").c_str());

  const models::MlpConfig m;  // batch 64, width 1024, 2 layers: the logits have 1024 classes
  ir::Graph model = models::mlp(m);
  const ir::NodeId logits = model.outputs()[0].node;
  model.clear_outputs();
  model.add_output(train::cross_entropy(model, logits, model.input("labels", {m.batch}, ir::DType::I64)), "loss");

  auto params = models::random_params(model, 51);
  std::map<std::string, ir::Tensor, std::less<>> inputs{{"x", random_f32({m.batch, m.width}, 52)}};
  ir::Tensor labels(ir::DType::I64, {m.batch});
  for (std::int64_t i = 0; i < m.batch; ++i) labels.set(i, static_cast<double>((i * 37) % m.width));
  inputs.emplace("labels", labels);
  std::vector<runtime::NamedTensor> named;
  for (const auto& [name, t] : inputs) named.push_back({name, ir::view(t)});

  Session session;
  Runner forward(session.compile(model, copts), params, inputs);
  auto all_inputs = inputs;
  all_inputs.insert(params.begin(), params.end());
  Runner forward_as_inputs(session.compile(train::params_to_inputs(model), copts), {}, all_inputs);
  // No FLOP count: the two impls do different work, and a shared figure would read as a throughput.
  const Work work{};

  const std::vector<std::pair<std::string, train::Optimizer>> optimizers{
      {"sgd", train::Sgd{.lr = 1e-4}},
      {"momentum", train::Sgd{.lr = 1e-4, .momentum = 0.9}},
      {"adam", train::Adam{.lr = 1e-5}}};
  std::fprintf(stderr, "[bench_train] MLP b%lld w%lld l%d + cross-entropy, %u cores\n", static_cast<long long>(m.batch),
               static_cast<long long>(m.width), m.layers, cores());
  for (const auto& [name, opt] : optimizers) {
    train::TrainerOptions topts;
    topts.compile = copts;
    train::Trainer trainer(model, params, opt, topts);
    const std::string workload = "train_" + name + "_mlp_b64_w1024_l2";
    auto samples = interleave({{"rlx", [&] { trainer.step(named); }},
                               {"rlx_forward", [&] { forward(); }},
                               {"rlx_forward_as_inputs", [&] { forward_as_inputs(); }}},
                              timing);
    emit(workload, work, samples);
    progress(workload, samples);
    const double step = median(samples[0].seconds), fwd = median(samples[1].seconds),
                 fwd_in = median(samples[2].seconds);
    std::fprintf(
        stderr,
        "  %-28s  backward+update / forward = %.2fx, / forward with weights as inputs = %.2fx (target <= 2.5x)\n",
        workload.c_str(), (step - fwd) / fwd, (step - fwd_in) / fwd_in);
  }
  // Adam's step against the bandwidth roof. loss = sum(w * x) has gradient x, so the step is two passes: the
  // loss reads w and x, and the update reads w, x (the gradient), m and v and writes w, m and v. That is 9
  // floats per weight (7 if the loss's reduction and the update shared their reads, which the compiler does
  // not fuse). The peer is a memcpy of those 9 floats' bytes on every core (4.5 floats read and 4.5 written
  // per weight), as bench_machine measures the copy bandwidth, timed interleaved: report.py's ratio is
  // memcpy / step, and the target is a step within 1.3x of the copy (ratio >= 0.77).
  {
    const std::int64_t n = std::int64_t(1) << 22;  // 4M weights: 16 MiB per tensor, past the caches
    ir::Graph g("adam_update");
    auto w = g.param("w", {n});
    auto x = g.input("x", {n});
    g.add_output(g.sum(g.mul(w, x), {0}), "loss");
    train::TrainerOptions topts;
    topts.compile = copts;
    train::Trainer trainer(g, {{"w", random_f32({n}, 61)}}, train::Adam{.lr = 1e-5}, topts);
    const ir::Tensor xv = random_f32({n}, 62);
    const std::vector<runtime::NamedTensor> feed{{"x", ir::view(xv)}};
    const std::size_t copy_bytes = std::size_t(n) * 18;  // 4.5 floats a weight, read and written
    std::vector<std::byte> src(copy_bytes, std::byte{1}), dst(copy_bytes);
    const std::string workload = "train_adam_update_4M";
    auto samples = interleave({{"rlx", [&] { trainer.step(feed); }},
                               {"memcpy", [&] { parallel_memcpy(dst.data(), src.data(), copy_bytes); }}},
                              timing);
    emit(workload, Work{.bytes = 36.0 * double(n)}, samples);
    progress(workload, samples);
    const double step = median(samples[0].seconds), copy = median(samples[1].seconds);
    std::fprintf(stderr,
                 "  %-28s  step / memcpy of its 9 floats a weight = %.2fx (target <= 1.3x), %.1f GB/s; "
                 "against the 7 floats of an update fused with the loss: %.2fx\n",
                 workload.c_str(), step / copy, 36.0 * double(n) / step * 1e-9, step / (copy * 7.0 / 9.0));
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_train: %s\n", e.what());
  return 1;
}
