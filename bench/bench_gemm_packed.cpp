// The packed-B GEMM (B a param, packed once at set_param) against the
// OpenBLAS paths it replaces, interleaved rep by rep on the same buffers:
//   packed     RLX with RLX_CPU_GEMM=packed
//   rlx_blas   RLX with RLX_CPU_GEMM=blas: one-threaded cblas_sgemm per panel in RLX's pool
//   openblas   cblas_sgemm on all cores (OpenBLAS's own threads)
// With --b-input 1, B is a graph input (an activation), packed on every run.
// The medians' ratios justify packed_wins() and packed_per_run_wins() in
// kernel_matmul.cpp.
//   bench_gemm_packed [--reps N] [--epilogue 1] [--b-input 1] [--only MxNxK]

#include <cstdlib>

#include "openblas_peer.hpp"
#include "rlx/ir/graph.hpp"

namespace {

using namespace rlx;
using namespace rlx::bench;

struct Shape {
  std::int64_t M, N, K;
  std::string name() const { return std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K); }
};

// Compiles with RLX_CPU_GEMM set to `choice` (read at compile time only).
runtime::CompiledGraph compile_with(const Session& s, const ir::Graph& g, const char* choice) {
  ::setenv("RLX_CPU_GEMM", choice, 1);
  auto c = s.compile(g);
  ::unsetenv("RLX_CPU_GEMM");
  return c;
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}

struct Row {
  std::string shape;
  double packed, rlx_blas, openblas;  // GFLOP/s of the medians
};

Row run_shape(const Session& session, const Shape& sh, bool epilogue, bool b_input, int reps) {
  const auto [M, N, K] = sh;
  ir::Graph g("gemm");
  auto y = g.matmul(g.input("a", {M, K}), b_input ? g.input("b", {K, N}) : g.param("b", {K, N}));
  if (epilogue) y = g.relu(g.add(y, g.param("bias", {N})));
  g.add_output(y, "c");
  std::map<std::string, ir::Tensor, std::less<>> params, inputs{{"a", random_f32({M, K}, 1)}};
  (b_input ? inputs : params).emplace("b", random_f32({K, N}, 2));
  if (epilogue) params.emplace("bias", random_f32({N}, 3));
  Runner packed(compile_with(session, g, "packed"), params, inputs);
  Runner blas_rlx(compile_with(session, g, "blas"), params, inputs);
  ir::Tensor c(ir::DType::F32, {M, N});
  const float* a = packed.input("a").data_as<float>();
  const float* b = b_input ? packed.input("b").data_as<float>() : params.at("b").data_as<float>();
  auto blas = [&] { openblas_sgemm(M, N, K, a, b, c.data_as<float>()); };

  std::vector<Impl> impls{{"packed", std::ref(packed)}, {"rlx_blas", std::ref(blas_rlx)}};
  if (!epilogue) impls.push_back({"openblas", blas});
  auto s = interleave(impls, {.reps = reps, .min_sample_s = 0.02});
  const std::string name = "gemm_" + sh.name() + (epilogue ? "_bias_relu" : "") + (b_input ? "_b_input" : "");
  const double flops = 2.0 * double(M) * double(N) * double(K);
  emit(name, {flops, 0}, s);
  progress(name, s);
  float diff = 0;
  const ir::Tensor& want = epilogue ? blas_rlx.outputs()[0] : c;
  for (std::int64_t i = 0; i < want.numel(); ++i)
    diff = std::max(diff, std::abs(packed.outputs()[0].data_as<float>()[i] - want.data_as<float>()[i]));
  std::fprintf(stderr, "    check: max |packed - openblas| = %g\n", diff);
  auto gf = [&](std::size_t i) { return i < s.size() ? flops / median(s[i].seconds) * 1e-9 : 0.0; };
  return {name, gf(0), gf(1), gf(2)};
}

}  // namespace

int main(int argc, char** argv) try {
  const int reps = std::stoi(arg(argc, argv, "--reps", "21"));
  const bool epilogue = arg(argc, argv, "--epilogue", "0") == "1";
  const bool b_input = arg(argc, argv, "--b-input", "0") == "1";
  const std::string only = arg(argc, argv, "--only");
  // The MLP's and encoder's layers, square products, a GEMV, then the edges of
  // the panel layout: narrow N (one 16-column vector), an N tail, short K, tiny.
  const std::vector<Shape> shapes{{64, 1024, 1024}, {128, 512, 512},    {128, 2048, 512},   {128, 512, 2048},
                                  {512, 512, 512},  {1024, 1024, 1024}, {2048, 2048, 2048}, {1, 4096, 4096},
                                  {1024, 16, 1024}, {256, 80, 1024},    {1024, 1024, 32},   {32, 32, 32}};
  Session session;
  std::vector<Row> rows;
  for (const auto& sh : shapes)
    if (only.empty() || only == sh.name()) rows.push_back(run_shape(session, sh, epilogue, b_input, reps));
  // Any other MxNxK given to --only (a conv's im2col GEMM, say) runs alone.
  Shape custom{};
  if (rows.empty() && std::sscanf(only.c_str(), "%ldx%ldx%ld", &custom.M, &custom.N, &custom.K) == 3)
    rows.push_back(run_shape(session, custom, epilogue, b_input, reps));
  std::fprintf(stderr, "\n%-28s %9s %9s %9s  %s\n", "GFLOP/s (medians)", "packed", "rlx_blas", "openblas",
               "packed / best blas");
  for (const auto& r : rows)
    std::fprintf(stderr, "%-28s %9.1f %9.1f %9.1f  %.2f\n", r.shape.c_str(), r.packed, r.rlx_blas, r.openblas,
                 r.packed / std::max(r.rlx_blas, r.openblas));
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_gemm_packed: %s\n", e.what());
  return 1;
}
