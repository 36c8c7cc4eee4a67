// Workloads whose peers live in Python (bench/peers.py: NumPy, ONNX Runtime).
//
//   bench_e2e --serve              row norms, conv2d, MLP, encoder block: timed runs
//                                  on request, so peers.py can alternate RLX and its
//                                  peer rep by rep (see serve())
//   bench_e2e --compile-time REPS  encoder compile time, cold and cached
//   bench_e2e --dump-params DIR    params, inputs and RLX outputs of the ORT-peered
//                                  graphs as raw f32 files + DIR/manifest.json
// With --serve and --dump-params: --device NAME runs RLX on that device (the CPU
// by default), and --only REGEX keeps the workloads it matches (bench/mlx_bench.py
// serves the MLP and the encoder block on Device::Mlx).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <regex>

#include "common.hpp"
#include "rlx/error.hpp"
#include "rlx/ir/graph.hpp"
#include "rlx/models/demo_models.hpp"

namespace {

using namespace rlx;
using namespace rlx::bench;
using TensorMap = std::map<std::string, ir::Tensor, std::less<>>;

constexpr std::int64_t kRows = 4096, kCols = 4096;

struct Model {
  std::string workload;
  ir::Graph graph;
  TensorMap params, inputs;
  Work work;
  nlohmann::json config;  // what peers.py needs to rebuild the same graph
};

double encoder_flops(const models::EncoderConfig& c) {
  const double bs = double(c.batch * c.seq), d = double(c.d_model);
  const double proj = 4 * 2 * bs * d * d, ffn = 2 * 2 * bs * d * double(c.d_ff);
  const double attn = 2 * 2 * double(c.batch * c.seq * c.seq) * d;  // QK^T and PV over all heads
  return proj + ffn + attn;
}

// Deterministic params and inputs from rlx::models, so every run and the dump agree.
Model model(std::string workload, ir::Graph g, std::uint64_t seed, Work work, nlohmann::json config = {}) {
  auto params = models::random_params(g, seed);
  auto inputs = models::random_inputs(g, seed + 1);
  return {std::move(workload), std::move(g), std::move(params), std::move(inputs), work, std::move(config)};
}

// The workloads --only keeps (all when it is absent).
std::vector<Model> only(std::vector<Model> ms, const std::string& pattern) {
  if (pattern.empty()) return ms;
  const std::regex re(pattern);
  std::erase_if(ms, [&](const Model& m) { return !std::regex_search(m.workload, re); });
  if (ms.empty()) throw Error("--only '" + pattern + "' matches no workload");
  return ms;
}

// The ORT-peered graphs.
std::vector<Model> onnx_peered_models() {
  std::vector<Model> ms;
  // conv2d x [N, C, 14, 14] * w [O, C, k, k], "same" padding: the 8-image 3x3, and the convs of a
  // ResNet-50 stage-3 bottleneck at batch 1 (its 3x3, and the 1x1 that widens 256 channels to 1024).
  auto conv = [&](std::int64_t N, std::int64_t C, std::int64_t O, std::int64_t k, std::uint64_t seed) {
    const std::int64_t H = 14, W = 14, p = k / 2;
    ir::Graph g("conv2d");
    g.add_output(g.conv2d(g.input("x", {N, C, H, W}), g.param("w", {O, C, k, k}), std::nullopt, {1, 1}, {p, p}), "y");
    const std::string name = "conv2d_" + std::to_string(N) + "x" + std::to_string(C) + "x14x14_" +
                             (O == C ? "" : "o" + std::to_string(O) + "_") + "k" + std::to_string(k);
    ms.push_back(model(name, std::move(g), seed, {2.0 * N * O * H * W * C * k * k, 0}, {{"padding", p}}));
  };
  conv(8, 256, 256, 3, 11);
  conv(1, 256, 256, 3, 12);
  conv(1, 256, 1024, 1, 13);
  {
    // The whole bottleneck, as a model runs it: 1x1 1024->256, 3x3 256->256, 1x1 256->1024, each with its
    // (batch-norm-folded) bias and ReLU, and the residual before the last ReLU.
    ir::Graph g("resnet50_stage3_bottleneck");
    const auto x = g.input("x", {1, 1024, 14, 14});
    auto h = g.relu(g.conv2d(x, g.param("w1", {256, 1024, 1, 1}), g.param("b1", {256})));
    h = g.relu(g.conv2d(h, g.param("w2", {256, 256, 3, 3}), g.param("b2", {256}), {1, 1}, {1, 1}));
    h = g.conv2d(h, g.param("w3", {1024, 256, 1, 1}), g.param("b3", {1024}));
    g.add_output(g.relu(g.add(h, x)), "y");
    const double flops = 2.0 * 196 * (1024.0 * 256 + 256.0 * 256 * 9 + 256.0 * 1024);
    ms.push_back(model("resnet_bottleneck_1x1024x14x14", std::move(g), 14, {flops, 0}));
  }
  const models::MlpConfig m;
  ms.push_back(model("mlp_b64_w1024_l2", models::mlp(m), 21, {2.0 * m.batch * m.width * m.width * m.layers, 0},
                     {{"batch", m.batch}, {"width", m.width}, {"layers", m.layers}}));
  const models::EncoderConfig e;
  ms.push_back(model("encoder_s128_d512_h8", models::encoder_block(e), 31, {encoder_flops(e), 0},
                     {{"batch", e.batch},
                      {"seq", e.seq},
                      {"d_model", e.d_model},
                      {"heads", e.heads},
                      {"d_ff", e.d_ff},
                      {"eps", e.eps}}));
  return ms;
}

// Row-wise normalizations over a (4096, 4096) f32 matrix; NumPy is the peer.
std::vector<Model> norm_models() {
  std::vector<Model> ms;
  auto make = [&](const std::string& workload, auto build) {
    ir::Graph g(workload);
    auto x = g.input("x", {kRows, kCols});
    g.add_output(build(g, x), "y");
    auto params = models::random_params(g, 41);
    TensorMap inputs;
    inputs.emplace("x", random_f32({kRows, kCols}, 42));
    ms.push_back({workload, std::move(g), std::move(params), std::move(inputs), {0, 2.0 * kRows * kCols * 4}, {}});
  };
  make("softmax_4096x4096", [](ir::Graph& g, ir::NodeId x) { return g.softmax(x, -1); });
  make("layer_norm_4096x4096", [](ir::Graph& g, ir::NodeId x) {
    return g.layer_norm(x, g.param("ln_g", {kCols}), g.param("ln_b", {kCols}), 1e-5);
  });
  make("rms_norm_4096x4096", [](ir::Graph& g, ir::NodeId x) { return g.rms_norm(x, g.param("rms_g", {kCols}), 1e-6); });
  return ms;
}

void write_f32(const std::filesystem::path& dir, const std::string& file, const ir::Tensor& t, nlohmann::json& entry) {
  if (t.dtype() != ir::DType::F32) throw Error("dump: " + file + " is not f32");
  std::ofstream(dir / file, std::ios::binary)
      .write(reinterpret_cast<const char*>(t.data()), std::streamsize(t.nbytes()));
  entry = {{"file", file}, {"shape", t.shape()}};
}

void dump(const Session& session, const std::filesystem::path& dir, const std::string& pattern) {
  std::filesystem::create_directories(dir);
  nlohmann::json manifest;
  for (auto& m : only(onnx_peered_models(), pattern)) {
    Runner run(session.compile(m.graph), m.params, m.inputs);
    run();
    auto& entry = manifest[m.workload];
    entry["config"] = m.config;
    for (const auto& [kind, tensors] : {std::pair{"params", &m.params}, std::pair{"inputs", &m.inputs}})
      for (const auto& [name, t] : *tensors) write_f32(dir, m.workload + "." + name + ".bin", t, entry[kind][name]);
    const auto& specs = run.graph().output_specs();
    for (std::size_t i = 0; i < specs.size(); ++i)
      write_f32(dir, m.workload + ".out." + specs[i].name + ".bin", run.outputs()[i], entry["outputs"][specs[i].name]);
  }
  std::ofstream(dir / "manifest.json") << manifest.dump(2);
}

// Serves timed runs to the peer driver (peers.py interleave), which alternates
// them with its own peer's runs rep by rep. Commands on stdin, one per line:
//   list               -> one JSON line per workload {"workload", "flops"?, "bytes"?}, then "end"
//   run WORKLOAD ITERS -> seconds per call over ITERS back-to-back calls
// Timing happens here, so the pipe round trip is not in the sample.
void serve(const Session& session, const std::string& pattern) {
  std::vector<Model> models = norm_models();
  for (auto& m : onnx_peered_models()) models.push_back(std::move(m));
  models = only(std::move(models), pattern);
  std::map<std::string, std::unique_ptr<Runner>, std::less<>> runners;
  for (auto& m : models) runners[m.workload] = std::make_unique<Runner>(session.compile(m.graph), m.params, m.inputs);
  for (std::string cmd; std::cin >> cmd;) {
    if (cmd == "list") {
      for (const auto& m : models) emit_work(m.workload, m.work);
      std::printf("end\n");
    } else if (cmd == "run") {
      std::string workload;
      int iters = 1;
      std::cin >> workload >> iters;
      auto it = runners.find(workload);
      if (it == runners.end()) throw Error("serve: unknown workload '" + workload + "'");
      double t0 = now_s();
      for (int i = 0; i < iters; ++i) (*it->second)();
      std::printf("%.9g\n", (now_s() - t0) / iters);
    } else {
      throw Error("serve: unknown command '" + cmd + "' (list | run WORKLOAD ITERS)");
    }
    std::fflush(stdout);
  }
}

// Cold = the first compile in this process (run.sh starts a fresh process per
// sample); cached = later compiles of the same graph in the same process.
void compile_time(const Session& session, int reps) {
  auto g = models::encoder_block();
  double t0 = now_s();
  auto first = session.compile(g);
  std::vector<Samples> cold{{"rlx", {now_s() - t0}, 1}};
  std::vector<CompiledGraph> kept;  // destroyed after timing: freeing is not compiling
  auto cached = interleave({{"rlx", [&] { kept.push_back(session.compile(g)); }}},
                           {.reps = reps, .min_sample_s = 0, .settle_s = 0});
  emit("compile_encoder_cold", {}, cold);
  emit("compile_encoder_cached", {}, cached);
  progress("compile_encoder_cold", cold);
  progress("compile_encoder_cached", cached);
}

}  // namespace

int main(int argc, char** argv) try {
  const auto device = arg(argc, argv, "--device");
  const Session session(device.empty() ? runtime::Device::Cpu : runtime::parse_device(device));
  const auto pattern = arg(argc, argv, "--only");
  if (auto dir = arg(argc, argv, "--dump-params"); !dir.empty()) {
    dump(session, dir, pattern);
  } else if (argc > 1 && std::string_view(argv[1]) == "--serve") {
    serve(session, pattern);
  } else if (auto reps = arg(argc, argv, "--compile-time"); !reps.empty()) {
    compile_time(session, std::stoi(reps));
  } else {
    std::fprintf(
        stderr, "usage: bench_e2e --serve | --compile-time REPS | --dump-params DIR  [--device NAME] [--only REGEX]\n");
    return 2;
  }
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_e2e: %s\n", e.what());
  return 1;
}
