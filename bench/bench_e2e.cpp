// Workloads whose peers live in Python (bench/peers.py: NumPy, ONNX Runtime).
// run.sh alternates this process with the peer process in rounds, so each
// invocation times every workload for --reps repetitions and exits.
//
//   bench_e2e [--reps N]         row norms, conv2d, MLP, encoder block, compile time
//   bench_e2e --dump-params DIR  params, inputs and RLX outputs of the ORT-peered
//                                graphs as raw f32 files + DIR/manifest.json
#include <filesystem>
#include <fstream>

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

// The ORT-peered graphs, with deterministic params and inputs.
std::vector<Model> onnx_peered_models() {
  std::vector<Model> ms;
  {
    const std::int64_t N = 8, C = 256, H = 14, W = 14, O = 256, k = 3;
    ir::Graph g("conv2d");
    g.add_output(g.conv2d(g.input("x", {N, C, H, W}), g.param("w", {O, C, k, k}), std::nullopt, {1, 1}, {1, 1}), "y");
    auto params = models::random_params(g, 11);
    auto inputs = models::random_inputs(g, 12);
    ms.push_back({"conv2d_8x256x14x14_k3", std::move(g), std::move(params), std::move(inputs),
                  {2.0 * N * O * H * W * C * k * k, 0}, {{"padding", 1}}});
  }
  {
    models::MlpConfig c;
    auto g = models::mlp(c);
    auto params = models::random_params(g, 21);
    auto inputs = models::random_inputs(g, 22);
    ms.push_back({"mlp_b64_w1024_l2", std::move(g), std::move(params), std::move(inputs),
                  {2.0 * c.batch * c.width * c.width * c.layers, 0},
                  {{"batch", c.batch}, {"width", c.width}, {"layers", c.layers}}});
  }
  {
    models::EncoderConfig c;
    auto g = models::encoder_block(c);
    auto params = models::random_params(g, 31);
    auto inputs = models::random_inputs(g, 32);
    ms.push_back({"encoder_s128_d512_h8", std::move(g), std::move(params), std::move(inputs), {encoder_flops(c), 0},
                  {{"batch", c.batch}, {"seq", c.seq}, {"d_model", c.d_model}, {"heads", c.heads}, {"d_ff", c.d_ff},
                   {"eps", c.eps}}});
  }
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
  std::ofstream(dir / file, std::ios::binary).write(reinterpret_cast<const char*>(t.data()), std::streamsize(t.nbytes()));
  entry = {{"file", file}, {"shape", t.shape()}};
}

void dump(const Session& session, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  nlohmann::json manifest;
  for (auto& m : onnx_peered_models()) {
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

void time_models(const Session& session, std::vector<Model> models, int reps) {
  for (auto& m : models) {
    Runner run(session.compile(m.graph), m.params, m.inputs);
    auto s = interleave({{"rlx", std::ref(run)}}, reps);
    emit(m.workload, m.work, s);
    progress(m.workload, s);
  }
}

// Cold = the first compile in this process (run.sh starts a fresh process per
// round); cached = later compiles of the same graph in the same process.
void compile_time(const Session& session, int reps) {
  auto g = models::encoder_block();
  double t0 = now_s();
  auto first = session.compile(g);
  std::vector<Samples> cold{{"rlx", {now_s() - t0}, 1}};
  auto cached = interleave({{"rlx", [&] { auto again = session.compile(g); }}}, reps, 1, 0);
  emit("compile_encoder_cold", {}, cold);
  emit("compile_encoder_cached", {}, cached);
  progress("compile_encoder_cold", cold);
  progress("compile_encoder_cached", cached);
}

}  // namespace

int main(int argc, char** argv) try {
  Session session;
  if (auto dir = arg(argc, argv, "--dump-params"); !dir.empty()) {
    dump(session, dir);
    return 0;
  }
  const int reps = std::stoi(arg(argc, argv, "--reps", "5"));
  compile_time(session, reps);  // first, so "cold" sees nothing compiled yet
  time_models(session, norm_models(), reps);
  time_models(session, onnx_peered_models(), reps);
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_e2e: %s\n", e.what());
  return 1;
}
